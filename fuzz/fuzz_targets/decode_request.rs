//! Fuzz target: request decoding (`sluice_protocol::fuzz_decode`, which `make test` also
//! runs over the corpus) on arbitrary frames.
//!
//! Any input must give a request, an "unsupported" answer or a decode error — never a
//! panic, an abort or an unbounded allocation. The broker's allocator is used so that
//! huge array-length prefixes behave as in production (see `sluice_protocol::alloc`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: sluice_protocol::alloc::Allocator = sluice_protocol::alloc::Allocator;

fuzz_target!(|data: &[u8]| sluice_protocol::fuzz_decode(data));
