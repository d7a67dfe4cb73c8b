//! AlterReplicaLogDirs (key 34, v1–v2): move replicas between a broker's log
//! directories. A Sluice broker has one data directory, so no replica ever moves; the
//! answers are Kafka's (its ReplicaManager.alterReplicaLogDirs), checked in its order:
//!
//! | case | error |
//! |---|---|
//! | the name of the partition's future directory (`<topic>-<p>.<32 hex>-future`) exceeds 255 bytes | INVALID_TOPIC_EXCEPTION |
//! | the destination is not the broker's directory (compared as an absolute path, as DescribeLogDirs names it) | LOG_DIR_NOT_FOUND |
//! | the partition is offline here (an I/O error) | KAFKA_STORAGE_ERROR |
//! | the partition is not in the cluster's metadata | UNKNOWN_TOPIC_OR_PARTITION |
//! | the partition exists but this broker holds no replica of it | REPLICA_NOT_AVAILABLE (Kafka keeps this code here for compatibility, not NOT_LEADER_OR_FOLLOWER) |
//! | the replica is here, and so already in the destination | NONE |
//!
//! A partition named twice takes the last destination named (Kafka builds a map).

use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_replica_log_dirs_request::AlterReplicaLogDirsRequest;
use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult, AlterReplicaLogDirsResponse,
};
use kafka_protocol::messages::TopicName;

use super::describe_log_dirs::log_dir;
use super::sb;
use crate::base::rpc::DescribeLogs;
use crate::base::util::join_all;
use crate::partition::broker::Broker;

/// Kafka's limit on a log directory's name (KAFKA-4893).
const DIR_NAME_BYTES_MAX: usize = 255;

/// The length of Kafka's future-log directory name for a partition: `<topic>-<p>.`, a
/// 32-hex-digit UUID, and `-future`.
fn future_dir_name_bytes(topic: &str, partition: i32) -> usize {
    topic.len() + 1 + partition.to_string().len() + 1 + 32 + "-future".len()
}

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: AlterReplicaLogDirsRequest,
) -> AlterReplicaLogDirsResponse {
    let mut wanted: BTreeMap<(String, i32), String> = BTreeMap::new();
    for dir in &req.dirs {
        for t in &dir.topics {
            for &p in &t.partitions {
                wanted.insert((t.name.0.to_string(), p), dir.path.to_string());
            }
        }
    }
    let here = log_dir(broker);
    // Which partitions this broker holds, open or offline (asked only if needed).
    let needs_logs = wanted.values().any(|d| *d == here);
    let (mut online, mut offline) = (HashSet::new(), HashSet::new());
    if needs_logs {
        let calls = broker.table.shards().map(|s| broker.call(s, DescribeLogs));
        for shard in join_all(calls).await.into_iter().flatten() {
            online.extend(shard.online.into_iter().map(|l| (l.topic, l.partition)));
            offline.extend(shard.offline.into_iter().map(|l| (l.topic, l.partition)));
        }
    }
    let image = broker.image();
    let mut results: BTreeMap<String, Vec<AlterReplicaLogDirPartitionResult>> = BTreeMap::new();
    for ((topic, p), dest) in wanted {
        let key = (topic, p);
        let error = if future_dir_name_bytes(&key.0, p) > DIR_NAME_BYTES_MAX {
            ResponseError::InvalidTopicException.code()
        } else if dest != here {
            ResponseError::LogDirNotFound.code()
        } else if offline.contains(&key) {
            ResponseError::KafkaStorageError.code()
        } else if online.contains(&key) {
            0
        } else if image
            .topics
            .get(&key.0)
            .is_some_and(|m| (0..m.partitions).contains(&p))
        {
            ResponseError::ReplicaNotAvailable.code()
        } else {
            ResponseError::UnknownTopicOrPartition.code()
        };
        if error != 0 {
            tracing::debug!(topic = %key.0, partition = p, dest = %dest, error, "AlterReplicaLogDirs refused");
        }
        results.entry(key.0).or_default().push(
            AlterReplicaLogDirPartitionResult::default()
                .with_partition_index(p)
                .with_error_code(error),
        );
    }
    let results = results
        .into_iter()
        .map(|(topic, partitions)| {
            AlterReplicaLogDirTopicResult::default()
                .with_topic_name(TopicName(sb(topic)))
                .with_partitions(partitions)
        })
        .collect();
    AlterReplicaLogDirsResponse::default().with_results(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn future_dir_names_are_measured_as_kafka_names_them() {
        // "t-0." + 32 hex digits + "-future"
        assert_eq!(future_dir_name_bytes("t", 0), 4 + 32 + 7);
        assert!(future_dir_name_bytes(&"x".repeat(200), 10) <= DIR_NAME_BYTES_MAX);
        assert!(future_dir_name_bytes(&"x".repeat(249), 0) > DIR_NAME_BYTES_MAX);
    }
}
