//! `sluice-coordinator`: the broker's coordinators as pure state machines.
//!
//! Owns the classic consumer-group coordinator ([`group`]) and Kafka's record formats of
//! `__consumer_offsets` ([`records`]); the transaction coordinator joins them here.
//! Requests and the time go in as arguments, answers, records to make durable and
//! deferred replies come out: no sockets, no disk, no clock, no glommio. The broker's
//! group shell (`src/group/`) owns one coordinator per shard, feeds it, and does the
//! I/O; nothing here may block or await.

pub mod group;
#[cfg(test)]
mod group_tests;
pub mod records;

use sluice_protocol::sb;
