//! ListOffsets (key 2): earliest (-2; and -4, earliest-local, the same without tiered
//! storage), latest (-1: the high watermark, or the last stable offset for
//! isolation_level=1), max-timestamp (-3, KIP-734: the first record with the largest
//! timestamp), or the first offset at or after a timestamp, answered by the leader's
//! home shard; a current leader
//! epoch in the request (v4+, KIP-320) is checked (FENCED_LEADER_EPOCH /
//! UNKNOWN_LEADER_EPOCH).

use std::rc::Rc;

use kafka_protocol::messages::list_offsets_request::ListOffsetsRequest;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
};

use crate::broker::Broker;
use crate::rpc::ListOffsets;

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: ListOffsetsRequest,
) -> ListOffsetsResponse {
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
                    let item = (
                        name.clone(),
                        p.partition_index,
                        p.timestamp,
                        p.current_leader_epoch,
                    );
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
    let image = broker.image();
    let topics = answered
        .into_iter()
        .map(|(name, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(index, r)| {
                    let base = ListOffsetsPartitionResponse::default().with_partition_index(index);
                    match r {
                        Ok((offset, ts)) => {
                            let b = base.with_offset(offset).with_timestamp(ts);
                            // The field exists from v4; the codec refuses it before.
                            if version >= 4 {
                                let epoch = image
                                    .topics
                                    .get(name.0.as_str())
                                    .and_then(|m| m.assignment(index))
                                    .map_or(-1, |a| a.leader_epoch);
                                b.with_leader_epoch(epoch)
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
