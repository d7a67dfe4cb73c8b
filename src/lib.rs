//! `sluice`: the broker binary's library: configuration, the shard context and
//! partition host, the controller, the group and transaction shells, the Kafka API
//! handlers (one module per API in [`serve::api`]) and the listener.
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
//! The folders of `src/` are the layers, bottom to top. A module may import only from
//! its own folder (never in a circle) and from the folders below; a layer below learns
//! about one above only through what it is handed at start-up (the partition host's
//! [`partition::broker::PartitionEvents`] subscribers, the mesh's serving closure).
//! `make lint` checks this list against the code (`scripts/check-layers.py` reads it
//! from here).
//!
//! 1. `base` — helpers, errors and Kafka codes, topic and broker configs, produced
//!    records' rules, the config, the metadata image, the machine, the fetch session
//!    cache, the typed cross-shard calls.
//! 2. `observe` — the metrics registry and its HTTP endpoint, the consumer-lag board and
//!    its alert sinks, the process's log levels.
//! 3. `partition` — the shard context and partition host, replica state, the data
//!    directory's free-space watch.
//! 4. `cluster` — the metadata controller, the raft quorum's I/O shell, replica fetchers.
//! 5. `coord` — the consumer-group and transaction shells.
//! 6. `serve` — the shard's server (dispatch), one handler per Kafka API, the listener.
//! 7. `node` — start-up: shards, quorum, subsystems, listeners.
//!
//! The admin CLIs and `sluice check` are not in this library: they live in the binary
//! (`src/cli/`, next to `main.rs`) and use the library's public modules.

pub mod base;
pub mod cluster;
pub mod coord;
pub mod node;
pub mod observe;
pub mod partition;
pub mod serve;

/// Unit tests run on the broker's own allocator (as `main.rs` does), so request decoding
/// behaves as in production (see `sluice_protocol::alloc`).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: sluice_protocol::alloc::Allocator = sluice_protocol::alloc::Allocator;
