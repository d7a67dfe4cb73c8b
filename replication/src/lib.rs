//! `sluice-replication`: raft metadata quorum and ISR replication (cluster issue). Empty until that issue lands.
