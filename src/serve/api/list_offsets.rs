//! ListOffsets (key 2): earliest (-2; and -4, earliest-local, the same without tiered
//! storage), latest (-1: the high watermark, or the last stable offset for
//! isolation_level=1), max-timestamp (-3, KIP-734: the first record with the largest
//! timestamp), or the first offset at or after a timestamp, answered by the leader's
//! home shard; a current leader
//! epoch in the request (v4+, KIP-320) is checked (FENCED_LEADER_EPOCH /
//! UNKNOWN_LEADER_EPOCH).
//!
//! v0 is Kafka's older "offsets before" API, with its own semantics ([`handle_v0`]): up
//! to `max_num_offsets` offsets, newest first, taken from segment base offsets.

use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_request::ListOffsetsRequest;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
};
use sluice_protocol::{legacy, TopicPartition};

use crate::base::ids::LeaderEpoch;
use crate::base::rpc::{ListOffsets, ListOffsetsItem, OffsetsBefore, SegmentTime};
use crate::partition::broker::Broker;

/// Kafka's replica id of a debugging client: any replica answers it (v0).
const DEBUGGING_REPLICA_ID: i32 = -2;
/// Kafka's replica id of a consumer: its v0 answers stop at the high watermark.
const CONSUMER_REPLICA_ID: i32 = -1;

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: ListOffsetsRequest,
) -> ListOffsetsResponse {
    if version == 0 {
        return handle_v0(broker, req).await;
    }
    let request_isolation = req.isolation_level;
    let request = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let item = ListOffsetsItem {
                        topic: name.clone(),
                        partition: p.partition_index,
                        timestamp: p.timestamp,
                        current_leader_epoch: LeaderEpoch::new(p.current_leader_epoch),
                    };
                    (p.partition_index, item)
                })
                .collect();
            (t.name, parts)
        })
        .collect();
    let answered = broker
        .per_partition(
            request,
            |t| t.0.as_str(),
            |items| ListOffsets {
                items,
                read_committed: request_isolation == 1,
            },
        )
        .await;
    let topics = answered
        .into_iter()
        .map(|(name, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(index, r)| {
                    let base = ListOffsetsPartitionResponse::default().with_partition_index(index);
                    match r {
                        Ok(listed) => {
                            let b = base
                                .with_offset(listed.offset.get())
                                .with_timestamp(listed.timestamp);
                            // The field exists from v4; the codec refuses it before.
                            if version >= 4 {
                                b.with_leader_epoch(listed.leader_epoch.get())
                            } else {
                                b
                            }
                        }
                        Err(e) => base
                            .with_error_code(e.code())
                            .with_offset(-1)
                            .with_timestamp(-1),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// ListOffsets v0, as Kafka 3.9 answers it (`legacyFetchOffsetsBefore`): the partition's
/// "offset-time array" is each segment's base offset (at least the log start) with its
/// file's modification time, then the log end offset with the time now if the active
/// segment holds data. Latest (-1) starts from the last entry, earliest (-2, and -4)
/// from the first, a timestamp T from the last entry whose time is at or before T (none:
/// an empty list; so every other negative timestamp answers an empty list); from there
/// up to `max_num_offsets` entries going back, newest first. For a consumer (replica id
/// -1) offsets above the high watermark give way to the high watermark. A negative
/// `max_num_offsets` makes Kafka fail the partition with UNKNOWN_SERVER_ERROR (it sizes
/// an array with it); unknown partitions are UNKNOWN_TOPIC_OR_PARTITION, a broker
/// that is not the leader NOT_LEADER_OR_FOLLOWER (any replica answers replica id -2).
async fn handle_v0(broker: &Rc<Broker>, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let replica_id = req.replica_id.0;
    // Per topic, in request order: (timestamp, max_num_offsets) of each partition.
    let asks: Vec<Vec<(i64, i32)>> = req
        .topics
        .iter()
        .map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.timestamp, legacy::max_num_offsets(p).unwrap_or(1)))
                .collect()
        })
        .collect();
    let request = req
        .topics
        .into_iter()
        .map(|t| {
            let name: Arc<str> = t.name.0.as_str().into();
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let tp = TopicPartition::new(name.clone(), p.partition_index);
                    (p.partition_index, tp)
                })
                .collect();
            (t.name, parts)
        })
        .collect();
    let answered = broker
        .per_partition(
            request,
            |t| t.0.as_str(),
            |items| OffsetsBefore {
                items,
                leader_only: replica_id != DEBUGGING_REPLICA_ID,
            },
        )
        .await;
    let topics = answered
        .into_iter()
        .zip(asks)
        .map(|((name, parts), asks)| {
            let partitions = parts
                .into_iter()
                .zip(asks)
                .map(|((index, r), (timestamp, max))| {
                    let base = ListOffsetsPartitionResponse::default()
                        .with_partition_index(index)
                        .with_offset(-1)
                        .with_timestamp(-1);
                    let times = match r {
                        Ok(times) => times,
                        Err(e) => return base.with_error_code(e.code()),
                    };
                    let Some(mut offsets) = offsets_before(&times.offset_times, timestamp, max)
                    else {
                        tracing::debug!(
                            "ListOffsets v0 {}-{index}: max_num_offsets {max} < 0",
                            name.0
                        );
                        return base.with_error_code(ResponseError::UnknownServerError.code());
                    };
                    if replica_id == CONSUMER_REPLICA_ID {
                        if let Some(hw) = times.high_watermark {
                            offsets = below_high_watermark(offsets, hw.get());
                        }
                    }
                    legacy::with_old_style_offsets(base, &offsets)
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// Kafka's choice of v0 offsets from a partition's offset-time array (oldest first):
/// `None` when `max` is negative (Kafka fails the partition).
fn offsets_before(offset_times: &[SegmentTime], timestamp: i64, max: i32) -> Option<Vec<i64>> {
    if max < 0 {
        return None;
    }
    // How many entries, from the first, the answer may start from.
    let usable = match timestamp {
        -1 => offset_times.len(),
        -2 | -4 => offset_times.len().min(1),
        t => offset_times
            .iter()
            .rposition(|st| st.time_ms <= t)
            .map_or(0, |i| i + 1),
    };
    let mut offsets: Vec<i64> = offset_times[..usable]
        .iter()
        .rev()
        .take(max as usize)
        .map(|st| st.offset.get())
        .collect();
    offsets.sort_by(|a, b| b.cmp(a));
    Some(offsets)
}

/// A consumer's v0 answer: offsets above the high watermark (newest first, so at the
/// front) are replaced by the high watermark, as Kafka's.
fn below_high_watermark(offsets: Vec<i64>, hw: i64) -> Vec<i64> {
    if !offsets.iter().any(|&o| o > hw) {
        return offsets;
    }
    std::iter::once(hw)
        .chain(offsets.into_iter().skip_while(|&o| o > hw))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::Offset;

    // Three segments (bases 0, 10, 20; the log start is 5, inside the first) modified at
    // 100, 200 and 300, and an active one holding data: the log end 27 "now" (400).
    const LOG: &[SegmentTime] = &times(&[(5, 100), (10, 200), (20, 300), (27, 400)]);

    /// An offset-time array from (offset, time) pairs.
    const fn times<const N: usize>(pairs: &[(i64, i64); N]) -> [SegmentTime; N] {
        let mut out = [SegmentTime {
            offset: Offset::ZERO,
            time_ms: 0,
        }; N];
        let mut i = 0;
        while i < N {
            out[i] = SegmentTime {
                offset: Offset::new(pairs[i].0),
                time_ms: pairs[i].1,
            };
            i += 1;
        }
        out
    }

    #[test]
    fn latest_and_earliest() {
        assert_eq!(offsets_before(LOG, -1, 1), Some(vec![27]));
        assert_eq!(offsets_before(LOG, -1, 3), Some(vec![27, 20, 10]));
        assert_eq!(offsets_before(LOG, -1, 100), Some(vec![27, 20, 10, 5]));
        assert_eq!(offsets_before(LOG, -2, 1), Some(vec![5]));
        assert_eq!(offsets_before(LOG, -2, 100), Some(vec![5]));
        assert_eq!(offsets_before(LOG, -4, 100), Some(vec![5]));
        assert_eq!(offsets_before(LOG, -1, 0), Some(vec![]));
        assert_eq!(offsets_before(LOG, -2, 0), Some(vec![]));
    }

    #[test]
    fn by_time_from_the_last_entry_at_or_before_it() {
        assert_eq!(offsets_before(LOG, 250, 100), Some(vec![10, 5]));
        assert_eq!(offsets_before(LOG, 200, 100), Some(vec![10, 5]));
        assert_eq!(offsets_before(LOG, 300, 1), Some(vec![20]));
        assert_eq!(offsets_before(LOG, 1_000, 2), Some(vec![27, 20]));
        assert_eq!(offsets_before(LOG, 99, 100), Some(vec![]));
        assert_eq!(offsets_before(LOG, 0, 100), Some(vec![]));
        // Other negative timestamps (max-timestamp -3 included) find nothing.
        assert_eq!(offsets_before(LOG, -3, 100), Some(vec![]));
    }

    #[test]
    fn a_negative_max_fails_and_an_empty_log_has_its_one_segment() {
        assert_eq!(offsets_before(LOG, -1, -1), None);
        assert_eq!(offsets_before(LOG, 1_000, i32::MIN), None);
        // A log of one empty segment: its base offset, whatever is asked.
        let empty = &times(&[(0, 100)]);
        assert_eq!(offsets_before(empty, -1, 10), Some(vec![0]));
        assert_eq!(offsets_before(empty, -2, 10), Some(vec![0]));
        assert_eq!(offsets_before(empty, 100, 10), Some(vec![0]));
        assert_eq!(offsets_before(&[], -1, 10), Some(vec![]));
    }

    #[test]
    fn segments_below_the_log_start_repeat_it() {
        // Segments wholly below the log start (not deleted yet) count at the log start.
        let log = &times(&[(15, 100), (15, 200), (15, 300), (22, 400)]);
        assert_eq!(offsets_before(log, -1, 10), Some(vec![22, 15, 15, 15]));
    }

    #[test]
    fn consumers_stop_at_the_high_watermark() {
        assert_eq!(
            below_high_watermark(vec![27, 20, 10, 5], 27),
            vec![27, 20, 10, 5]
        );
        assert_eq!(
            below_high_watermark(vec![27, 20, 10, 5], 24),
            vec![24, 20, 10, 5]
        );
        assert_eq!(
            below_high_watermark(vec![27, 20, 10, 5], 15),
            vec![15, 10, 5]
        );
        assert_eq!(below_high_watermark(vec![27], 12), vec![12]);
        assert_eq!(below_high_watermark(vec![], 12), Vec::<i64>::new());
    }
}
