//! Fuzz target: what a peer sends a TLS listener before it is authenticated
//! (`sluice_client::tls::fuzz_handshake`, which `make test` also runs over the corpus):
//! handshake records to a rustls server session with the broker's configuration
//! (client certificates required), and certificates whose subject becomes a principal.
//!
//! Any input must be refused or accepted — never a panic, an abort or an unbounded
//! allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| sluice_client::tls::fuzz_handshake(data));
