//! Layer 3, partitions on their home shard: the shard context and partition host
//! (`broker`: logs, replicas, the image, the mesh; every partition's work runs on the
//! shard that owns it), a partition's replica state (`replica`: ISR, high watermark,
//! follower positions), the shard's feed of partitions whose fetch answers changed
//! (`changes`), the data directory's free-space watch (`disk`) and the shard's reader
//! of tiered storage's object store (`tiered`).

pub mod broker;
pub mod changes;
pub mod disk;
pub mod replica;
pub mod tiered;
