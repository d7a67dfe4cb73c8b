//! `sluice`: the broker binary's library — CLI configuration, the Kafka API layer (one
//! module per API in [`api`]), the per-shard broker state ([`broker`]), the metadata
//! controller ([`controller`]) and the listener ([`server`]).
//!
//! Everything here runs on shards (glommio executor threads) and sits on top of
//! `sluice-shard` (runtime, shard table, mesh) and `sluice-storage` (partition logs).
//! Nothing here may block a shard's reactor on the produce/fetch path; metadata
//! changes (rare, small) write their file synchronously on shard 0.

pub mod alloc;
pub mod api;
pub mod broker;
pub mod cluster_cli;
pub mod config;
pub mod controller;
pub mod error;
pub mod group;
pub mod group_cli;
pub mod kafka_client;
pub mod metadata;
pub mod node;
pub mod quorum_io;
pub mod replica;
pub mod server;
pub mod topic_config;
pub mod util;

/// Unit tests run on the broker's own allocator (as `main.rs` does), so request decoding
/// behaves as in production: a huge client-supplied array length reserves address
/// space instead of aborting the test process (see [`alloc`]).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: alloc::Allocator = alloc::Allocator;
