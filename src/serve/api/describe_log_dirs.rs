//! DescribeLogDirs (key 35): the broker's data directory with the size and lag of every
//! partition it holds, and (v4, KIP-827) the volume's total and usable bytes.
//!
//! With tiered storage, a third entry, [`REMOTE_DIR_PREFIX`] and the store's URL, gives
//! each partition's bytes in the object store (Kafka's response has no place for them;
//! a tool lists it as one more directory).
//!
//! Sluice takes single partitions offline after an I/O error, where Kafka takes a whole
//! log directory: the offline partitions are answered as a second entry for the same
//! directory, named `<dir> (offline partitions)`, with KAFKA_STORAGE_ERROR — what a
//! Kafka tool shows for an offline directory, listing exactly what is unavailable.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_log_dirs_request::DescribeLogDirsRequest;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResponse, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::TopicName;

use super::sb;
use crate::base::rpc::DescribeLogs;
use crate::base::util::join_all;
use crate::partition::broker::Broker;

/// Topics with their partitions' (index, size, lag), sorted.
type Listing = BTreeMap<String, Vec<(i32, i64, i64)>>;

fn topics(listing: Listing) -> Vec<DescribeLogDirsTopic> {
    listing
        .into_iter()
        .map(|(name, parts)| {
            DescribeLogDirsTopic::default()
                .with_name(TopicName(sb(name)))
                .with_partitions(
                    parts
                        .into_iter()
                        .map(|(p, size, lag)| {
                            DescribeLogDirsPartition::default()
                                .with_partition_index(p)
                                .with_partition_size(size)
                                .with_offset_lag(lag)
                        })
                        .collect(),
                )
        })
        .collect()
}

/// How the entry of the object store's bytes is named: `remote:<--remote-storage URL>`.
pub const REMOTE_DIR_PREFIX: &str = "remote:";

/// The broker's one log directory as Kafka names it: the data directory's absolute
/// path (AlterReplicaLogDirs compares requests with it).
pub fn log_dir(broker: &Broker) -> String {
    std::path::absolute(&broker.config.data_dir)
        .unwrap_or_else(|_| broker.config.data_dir.clone())
        .display()
        .to_string()
}

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    // None: every partition; otherwise only the named ones.
    let wanted = |t: &str, p: i32| {
        req.topics.as_ref().is_none_or(|ts| {
            ts.iter()
                .any(|w| w.topic.as_str() == t && w.partitions.contains(&p))
        })
    };
    let calls = broker.table.shards().map(|s| broker.call(s, DescribeLogs));
    let (mut online, mut offline) = (Listing::new(), Listing::new());
    for shard in join_all(calls).await.into_iter().flatten() {
        for l in shard.online {
            if wanted(&l.topic, l.partition) {
                let size = l.size_bytes as i64;
                online
                    .entry(l.topic)
                    .or_default()
                    .push((l.partition, size, l.offset_lag));
            }
        }
        for l in shard.offline {
            if wanted(&l.topic, l.partition) {
                offline
                    .entry(l.topic)
                    .or_default()
                    .push((l.partition, -1, -1));
            }
        }
    }
    for parts in online.values_mut().chain(offline.values_mut()) {
        parts.sort_unstable();
    }
    let online_names: Vec<(String, i32)> = online
        .iter()
        .flat_map(|(t, parts)| parts.iter().map(move |(p, _, _)| (t.clone(), *p)))
        .collect();
    let dir = log_dir(broker);
    let space = broker.disk.space();
    let (total, usable) = if version >= 4 {
        (space.total as i64, space.free as i64)
    } else {
        (-1, -1)
    };
    let mut results = vec![DescribeLogDirsResult::default()
        .with_log_dir(sb(dir.clone()))
        .with_topics(topics(online))
        .with_total_bytes(total)
        .with_usable_bytes(usable)];
    // Tiered storage: the remote bytes of the partitions this broker holds.
    if let Some(url) = broker.config.remote_storage.as_ref() {
        let image = broker.image();
        let remote: Listing = online_names
            .iter()
            .filter_map(|(t, p)| {
                let l = crate::partition::tiered::remote_log(&image, t, *p)?;
                let start = l.start_offset().unwrap_or(i64::MAX);
                let bytes = l
                    .segments
                    .iter()
                    .filter(|s| s.last_offset >= start)
                    .map(|s| s.size as i64)
                    .sum();
                Some((t.clone(), (*p, bytes, 0)))
            })
            .fold(Listing::new(), |mut acc, (t, row)| {
                acc.entry(t).or_default().push(row);
                acc
            });
        results.push(
            DescribeLogDirsResult::default()
                .with_log_dir(sb(format!("{REMOTE_DIR_PREFIX}{url}")))
                .with_topics(topics(remote))
                .with_total_bytes(-1)
                .with_usable_bytes(-1),
        );
    }
    if !offline.is_empty() {
        results.push(
            DescribeLogDirsResult::default()
                .with_error_code(ResponseError::KafkaStorageError.code())
                .with_log_dir(sb(format!("{dir} (offline partitions)")))
                .with_topics(topics(offline))
                .with_total_bytes(total)
                .with_usable_bytes(usable),
        );
    }
    DescribeLogDirsResponse::default().with_results(results)
}
