//! The storage crate's integration tiers in one test binary (one link instead of one
//! per file; `make unit` runs each test in its own process under cargo-nextest). Each
//! module opens with what its tier proves. Tests that change process-wide settings
//! keep a binary of their own: `fault_rules.rs`, `preallocation_floor.rs`.

mod common;

mod active_budget;
mod clean_stop;
mod compact;
mod crash;
mod fault;
mod future_size;
mod journal;
mod lazy_open;
mod log;
mod one_descriptor;
mod preallocation_cap;
mod producer;
mod prop;
mod recovery;
mod review;
mod txn;
