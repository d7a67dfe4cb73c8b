//! `sluice-shard`: thread-per-core runtime (issue 3). Empty until that issue lands.
