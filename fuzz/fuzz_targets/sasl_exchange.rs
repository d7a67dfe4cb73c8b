//! Fuzz target: the SASL messages a peer sends (`sluice_client::sasl::fuzz_exchange`,
//! which `make test` also runs over the corpus): PLAIN messages, SCRAM client-first and
//! client-final to the server side, server-first and server-final to the client side.
//!
//! Any input must be refused or accepted — never a panic, an abort or an unbounded
//! allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| sluice_client::sasl::fuzz_exchange(data));
