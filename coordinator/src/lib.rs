//! `sluice-coordinator`: the broker's coordinators as pure state machines.
//!
//! Owns the classic consumer-group coordinator ([`group`], including the group side of
//! transactions: TxnOffsetCommit and its pending offsets), Kafka's record formats of
//! `__consumer_offsets` ([`records`]), the transaction coordinator ([`txn`]), Kafka's
//! record formats of `__transaction_state` ([`txn_records`]), consumer-lag evaluation
//! with Burrow's rules ([`lag`]) and the lag alerts' state machine ([`alert`]).
//!
//! Requests and the time go in as arguments; answers, records to make durable, deferred
//! replies and transaction markers to write come out: no sockets, no disk, no clock, no
//! glommio. The broker's shells (`src/coord/group/` for groups; the transaction shell for
//! [`txn`]) own one coordinator of each kind per shard, feed it, and do the I/O; nothing
//! here may block or await. State changes that need a record are applied only once the
//! shell reports the record durable.

pub mod alert;
pub mod consumer_records;
pub mod group;
#[cfg(test)]
mod group_tests;
pub mod lag;
pub mod records;
pub mod txn;
pub mod txn_records;
#[cfg(test)]
mod txn_tests;

use sluice_protocol::sb;

/// Java's `String.hashCode` (over UTF-16 code units, wrapping), which Kafka uses to place
/// group ids and transactional ids on partitions of its internal topics.
pub fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The partition of an internal topic (`__consumer_offsets`, `__transaction_state`) that
/// holds `key` (a group id or a transactional id): Kafka's `Utils.abs(hashCode) %
/// partitions`, where `Utils.abs` maps `i32::MIN` to 0.
pub fn partition_for(key: &str, partitions: i32) -> i32 {
    assert!(
        partitions > 0,
        "an internal topic has at least one partition"
    );
    let h = java_hash(key);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions
}
