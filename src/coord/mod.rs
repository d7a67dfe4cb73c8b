//! Layer 5, the coordinators' shells: consumer groups (`group`) and transactions
//! (`txn`), each the I/O shell around the pure state machines of `sluice-coordinator`,
//! living on the home shard of its internal topic's partition (`__consumer_offsets`,
//! `__transaction_state`).

pub mod group;
pub mod runtime;
pub mod txn;

use sluice_coordinator::group::Code;
use sluice_protocol::TopicPartition;

use crate::base::rpc::PartitionCode;

/// The pure coordinators key partitions by `(topic, partition)` tuples, the shard calls
/// by [`TopicPartition`]: the shells convert at their edge, with these two.
fn coordinator_keys(partitions: &[TopicPartition]) -> Vec<(String, i32)> {
    partitions
        .iter()
        .map(|tp| (tp.topic().to_string(), tp.partition()))
        .collect()
}

/// A coordinator's per-partition answers as the shard calls carry them.
fn partition_codes(results: Vec<((String, i32), Code)>) -> Vec<PartitionCode> {
    results
        .into_iter()
        .map(|(tp, code)| PartitionCode {
            partition: tp.into(),
            code,
        })
        .collect()
}

/// Kafka's internal topics (its `Topic.isInternal`): the offsets and the transaction
/// state topics.
pub fn is_internal(name: &str) -> bool {
    name == group::OFFSETS_TOPIC || name == sluice_coordinator::txn::TXN_STATE_TOPIC
}
