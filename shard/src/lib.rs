//! `sluice-shard`: the thread-per-core runtime.
//!
//! Owns the executors (one glommio `LocalExecutor` per core, pinned when they take every
//! CPU the process may use), the shard table that says which shard owns a partition, and
//! the cross-shard request/reply mesh.
//! Knows nothing of Kafka: messages are whatever `Send` types the layer above chooses.
//!
//! Objects here live on one shard each: a [`Mesh`] handle is `Rc` and is created on
//! its executor by [`Mesh::join`]. Nothing here takes a lock; work crosses cores only
//! as messages over bounded channels created at start-up. Nothing here blocks the
//! reactor.

pub mod mesh;
pub mod runtime;
pub mod table;

pub use mesh::{BoxFuture, Handler, Mesh, MeshBuilders, MeshError, MeshLimits, MeshReceivers};
pub use runtime::{keep_awake, run_unpinned, spawn_shards, RuntimeConfig, WAKE_PERIOD};
pub use table::ShardTable;

/// Index of a shard (an executor thread), `0..shard_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub usize);

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shard-{}", self.0)
    }
}
