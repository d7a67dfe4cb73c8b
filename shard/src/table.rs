//! The shard table: which shard owns a partition.
//!
//! Ownership is a pure function of what every core's metadata image holds and the
//! shard count, so every core computes the same owner and no core ever asks another
//! where a partition lives. A replica this broker hosts has a slot (its sequence
//! number among the replicas ever placed on this broker, given by the metadata state
//! machine when the partition was created), and
//!
//! ```text
//! shard(slot) = slot mod shard_count
//! ```
//!
//! so a broker's replicas, however many topics they come from, are dealt round-robin
//! over its shards: each shard owns as many as any other, within one (less the gaps
//! deleted topics leave). A partition without a slot here (created before slots
//! existed, or not hosted by this broker, whose requests are only routed to be
//! refused) hashes:
//!
//! ```text
//! shard(topic_id, partition) = (fnv1a_64(topic_id as 16 big-endian bytes) + partition) mod shard_count
//! ```
//!
//! Hashing the topic id picks where a topic starts; adding the partition number walks
//! its partitions round-robin over the shards. The shard count is fixed for the life
//! of the process; a restart with a different `--cores` reassigns partitions, which is
//! safe because logs live in one data directory shared by all shards and a partition
//! is opened by exactly one shard of the running process.

use crate::ShardId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardTable {
    shard_count: usize,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bit: small, stable across releases and platforms (unlike std's hasher).
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME)
    })
}

impl ShardTable {
    pub fn new(shard_count: usize) -> ShardTable {
        assert!(shard_count > 0, "at least one shard");
        ShardTable { shard_count }
    }

    pub fn shard_count(&self) -> usize {
        self.shard_count
    }

    /// The home shard of the replica with slot `slot` (see the module doc).
    pub fn owner_of_slot(&self, slot: u64) -> ShardId {
        ShardId((slot % self.shard_count as u64) as usize)
    }

    /// The home shard of `partition` of the topic with id `topic_id` when it has no
    /// slot here: hashed (see the module doc).
    pub fn owner(&self, topic_id: u128, partition: i32) -> ShardId {
        let start = fnv1a_64(&topic_id.to_be_bytes());
        let p = u64::from(partition.max(0).unsigned_abs());
        ShardId((start.wrapping_add(p) % self.shard_count as u64) as usize)
    }

    pub fn shards(&self) -> impl Iterator<Item = ShardId> {
        (0..self.shard_count).map(ShardId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn a_topic_spreads_over_every_shard() {
        let t = ShardTable::new(3);
        let id = 0x1234_5678_9abc_def0_1122_3344_5566_7788u128;
        let mut seen: Vec<usize> = (0..3).map(|p| t.owner(id, p).0).collect();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2]);
        // Stable: the same inputs always give the same shard.
        assert_eq!(t.owner(id, 7), t.owner(id, 7));
    }

    #[test]
    fn slots_deal_replicas_round_robin() {
        let t = ShardTable::new(3);
        let owners: Vec<usize> = (0..7).map(|slot| t.owner_of_slot(slot).0).collect();
        assert_eq!(owners, vec![0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(t.owner_of_slot(u64::MAX), ShardId((u64::MAX % 3) as usize));
    }

    #[test]
    fn one_shard_owns_everything() {
        let t = ShardTable::new(1);
        for p in 0..100 {
            assert_eq!(t.owner(p as u128 * 7919, p), ShardId(0));
            assert_eq!(t.owner_of_slot(p as u64 * 7919), ShardId(0));
        }
    }
}
