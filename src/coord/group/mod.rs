//! Consumer groups in the broker: the per-shard I/O shell ([`shard`]) around the pure
//! group coordinator of `sluice-coordinator` (which also holds the
//! `__consumer_offsets` record formats), the shard's consumer-lag sampler ([`lag`]),
//! and the router that sends group calls to the
//! shard coordinating a group.
//!
//! Placement: group G belongs to `__consumer_offsets` partition
//! `abs(javaHashCode(G)) % 50` (Kafka's rule), and its state lives on the home shard of
//! that partition. API handlers on any shard route group requests there over the
//! shard mesh ([`route`]); the owner loads the partition on first use.

pub mod lag;
pub mod shard;
mod writes;

use kafka_protocol::error::ResponseError;

use crate::base::error::{self, ApiError};
use crate::base::rpc::{GroupCall, GroupListing, ListGroups};
use crate::partition::broker::Broker;

/// The internal topic of offsets and group metadata.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// offsets.topic.num.partitions
pub const OFFSETS_PARTITIONS: i32 = 50;

/// The `__consumer_offsets` partition of a group (Kafka's `Utils.abs(hashCode) % 50`;
/// the hash is the coordinator crate's, shared with the transaction shell).
pub fn partition_for(group: &str) -> i32 {
    sluice_coordinator::partition_for(group, OFFSETS_PARTITIONS)
}

/// Creates `__consumer_offsets` if it does not exist yet.
pub async fn ensure_offsets_topic(broker: &Broker) -> Result<(), ApiError> {
    broker
        .ensure_internal_topic(OFFSETS_TOPIC, OFFSETS_PARTITIONS)
        .await
}

/// Sends a group call to the shard coordinating its group (the home shard of the
/// group's `__consumer_offsets` partition, which this broker must lead) and returns its
/// answer. Errors are the coordinator-level ones clients retry on.
pub async fn route<R, C>(broker: &Broker, call: C) -> Result<R, ApiError>
where
    C: GroupCall<Reply = Result<R, ApiError>>,
{
    ensure_offsets_topic(broker).await.map_err(|e| {
        tracing::warn!(error = %e, "cannot create {OFFSETS_TOPIC}");
        ApiError::with(ResponseError::CoordinatorNotAvailable, e.to_string())
    })?;
    let partition = call.partition();
    let image = broker.image();
    let meta = image
        .topics
        .get(OFFSETS_TOPIC)
        .ok_or_else(|| ApiError::new(ResponseError::CoordinatorNotAvailable))?;
    if meta.assignment(partition).map(|a| a.leader) != Some(broker.config.node_id) {
        return Err(ApiError::with(
            ResponseError::NotCoordinator,
            format!(
                "broker {} does not lead {OFFSETS_TOPIC}-{partition}",
                broker.config.node_id
            ),
        ));
    }
    let owner = broker.owner(meta, partition);
    match broker.call(owner, call).await {
        Ok(r) => r,
        Err(e) => Err(error::from_mesh(&e)),
    }
}

/// Every group of every shard (ListGroups).
pub async fn list_all(broker: &Broker) -> Result<Vec<GroupListing>, ApiError> {
    let image = broker.image();
    let Some(meta) = image.topics.get(OFFSETS_TOPIC) else {
        return Ok(Vec::new());
    };
    // One call per partition's owner shard (each loads its partitions first).
    let mut owners: std::collections::BTreeMap<sluice_shard::ShardId, i32> = Default::default();
    for p in 0..meta.partitions {
        owners.entry(broker.owner(meta, p)).or_insert(p);
    }
    let calls = owners.into_iter().map(|(shard, partition)| async move {
        match broker.call(shard, ListGroups { partition }).await {
            Ok(r) => r,
            Err(e) => Err(error::from_mesh(&e)),
        }
    });
    let mut out = Vec::new();
    for r in crate::base::util::join_all(calls).await {
        out.extend(r?);
    }
    out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_partition_matches_kafka() {
        // Java: "hello".hashCode() == 99162322; "polygenelubricants".hashCode() ==
        // Integer.MIN_VALUE, which Utils.abs maps to 0.
        assert_eq!(partition_for("hello"), 99_162_322 % 50);
        assert_eq!(partition_for("polygenelubricants"), 0);
        // Negative hashes use the absolute value: "my-group".hashCode() == -1906497762.
        assert_eq!(sluice_coordinator::java_hash("my-group"), -1_906_497_762);
        assert_eq!(partition_for("my-group"), 1_906_497_762 % 50);
    }
}
