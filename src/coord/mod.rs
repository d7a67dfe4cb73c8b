//! Layer 5, the coordinators' shells: consumer groups (`group`) and transactions
//! (`txn`), each the I/O shell around the pure state machines of `sluice-coordinator`,
//! living on the home shard of its internal topic's partition (`__consumer_offsets`,
//! `__transaction_state`).

pub mod group;
pub mod runtime;
pub mod txn;
