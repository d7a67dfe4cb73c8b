//! The admin CLIs and the preflight check, in the `sluice` binary only: the broker's
//! library does not contain them. Each speaks the Kafka protocol to any broker (through
//! `sluice-client`) or reads the config; none runs on a shard.

pub mod acl;
pub mod check;
pub mod cluster;
pub mod console;
pub mod group;
pub mod lag;
pub mod quota;
pub mod reassign;
pub mod topic;
pub mod txn;
pub mod user;
