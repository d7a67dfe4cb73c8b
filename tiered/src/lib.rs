//! Tiered storage (KIP-405's contract): a partition leader copies each closed segment,
//! with its indexes, producer snapshot and leader epochs, to an object store; the
//! metadata quorum records which segments are remote; local retention may then delete
//! them, and reads below the local log start come back from the store.
//!
//! This crate is the part without a runtime: the store ([`store::Store`], a folder or
//! an S3 bucket, blocking calls), the threads that run those calls off the shards
//! ([`pool::Pool`]), object names, and reading a remote segment's batches through a
//! bounded chunk cache ([`remote::Reader`]). The broker decides what to upload, when,
//! and what a fetch reads.

pub mod pool;
pub mod remote;
pub mod store;

pub use pool::Pool;
pub use remote::{Reader, RemoteRead, SegmentRef};
pub use store::{Store, StoreError, StoreResult};
