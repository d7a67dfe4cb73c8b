//! `sluice-replication`: the sans-I/O heart of the cluster.
//!
//! - [`cluster`]: the metadata state machine (brokers, topics, partition assignments,
//!   producer-id blocks), its commands (rkyv-encoded) and the controller's decisions
//!   (placement, fencing, leader election, ISR changes).
//! - [`quorum`]: the raft-rs group that orders those commands among the controller
//!   voters, driven through the documented Ready loop; the caller does the I/O.
//! - [`isr`]: a partition replica as leader or follower: follower progress, the high
//!   watermark, ISR shrink/expand requests, leader-epoch cache and truncation, and the
//!   replica's whole state (`ReplicaState`: role, epochs, durable end, the follower's
//!   log operations serialised with leadership changes).
//! - [`acl`]: Kafka ACL bindings and filters and the authorizer's decision over them.
//! - [`quota`]: client quotas (entities, Kafka's resolution order) and the rate window
//!   that turns usage into a throttle.
//! - [`sim`]: a seeded deterministic simulation of a cluster of these state machines.
//!
//! Nothing here touches sockets, disks or clocks: inputs come in with the time, outputs
//! are returned as effects for the broker's I/O shell (src/) to carry out.

pub mod acl;
pub mod cluster;
pub mod isr;
pub mod quorum;
pub mod quota;
pub mod sim;

/// raft-rs, for the I/O shell's message and journal types.
pub use raft;

/// A broker's id (`node.id`).
pub type BrokerId = i32;
/// Kafka's "no broker" (`-1`), e.g. a partition without a leader.
pub const NO_BROKER: BrokerId = -1;
