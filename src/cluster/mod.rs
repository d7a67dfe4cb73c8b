//! Layer 4, the cluster around the partitions: the metadata controller on shard 0
//! (`controller`), the raft quorum's I/O shell (`quorum_io`: journal, transport, the
//! state machine's image) and the replica fetchers that pull from leaders and propose
//! ISR changes (`fetcher`), with the replication throttles of partition moves
//! (`throttle`), and the tiered storage task that copies leaders' closed segments to
//! the object store and records them in the quorum (`tiering`).

pub mod controller;
pub mod fetcher;
pub mod quorum_io;
pub mod throttle;
pub mod tiering;
