//! `sluice`: the broker binary's library: configuration, the shard context and
//! partition host, the controller, the group shell, the Kafka API handlers (one module
//! per API in [`api`]), the listener, and the admin CLIs.
//!
//! Everything here runs on shards (glommio executor threads) and sits on top of the
//! workspace crates: `sluice-shard` (runtime, shard table, mesh), `sluice-storage`
//! (partition logs), `sluice-replication` (cluster state machine, raft quorum, ISR state
//! machines), `sluice-coordinator` (the pure group coordinator) and `sluice-protocol`
//! (frames, the API-version registry, the API error type). Nothing here may
//! block a shard's reactor on the produce/fetch path.
//!
//! ## Layers
//!
//! Bottom to top. A module may import only from layers below its own; a layer below
//! learns about one above only through what it is handed at start-up (the partition
//! host's [`broker::PartitionEvents`] subscribers, the mesh's serving closure).
//! `make lint` checks this list against the code (`scripts/check-layers.py` reads it
//! from here).
//!
//! 1. `util`, `error`, `topic_config`, `config`, `metadata`, `record_rules`, `host`,
//!    `fetch_session` — base: helpers, errors and Kafka codes, topic configs, produced
//!    records' rules, the config, the metadata image; the machine (resource limits,
//!    systemd notification, port wait); the fetch session cache (KIP-227, sans I/O).
//! 2. `rpc`, `replica`, `quorum_io`, `disk`, `metrics`, `broker_configs` — the typed
//!    cross-shard calls and their messages; a partition's replica state; the raft
//!    quorum's I/O shell; the data directory's free-space watch; the metrics registry
//!    and its HTTP endpoint; broker configs by Kafka's names and the dynamic ones.
//! 3. `broker`, `lag`, `loggers` — the shard context and partition host: logs, replicas,
//!    image, mesh, partition work on a partition's home shard; the consumer-lag board
//!    (its metrics, `/v1/groups` routes and alert sinks); the process's log levels
//!    (Kafka's BROKER_LOGGER resource).
//! 4. `fetcher`, `controller`, `group`, `txn` — replica fetchers and ISR proposals; the
//!    metadata controller (shard 0); the consumer-group shell; the transaction shell.
//! 5. `dispatch` — the shard's server: owns the subsystems and answers every call.
//! 6. `api` — one handler per Kafka API, and the API-version registry.
//! 7. `server` — listener, connections, response ordering.
//! 8. `node` — start-up: shards, quorum, subsystems, listeners.
//! 9. `cluster_cli`, `group_cli`, `txn_cli`, `lag_cli`, `check` — the admin CLIs and the
//!    preflight `sluice check` (they use only the base layer).

pub mod api;
pub mod broker;
pub mod broker_configs;
pub mod check;
pub mod cluster_cli;
pub mod config;
pub mod controller;
pub mod disk;
pub mod dispatch;
pub mod error;
pub mod fetch_session;
pub mod fetcher;
pub mod group;
pub mod group_cli;
pub mod host;
pub mod lag;
pub mod lag_cli;
pub mod loggers;
pub mod metadata;
pub mod metrics;
pub mod node;
pub mod quorum_io;
pub mod record_rules;
pub mod replica;
pub mod rpc;
pub mod server;
pub mod topic_config;
pub mod txn;
pub mod txn_cli;
pub mod util;

/// Unit tests run on the broker's own allocator (as `main.rs` does), so request decoding
/// behaves as in production (see `sluice_protocol::alloc`).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: sluice_protocol::alloc::Allocator = sluice_protocol::alloc::Allocator;
