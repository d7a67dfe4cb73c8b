//! Fuzz target: request decoding (`sluice::api::fuzz_decode`, which `make test` also
//! runs over the corpus) on arbitrary frames.
//!
//! Any input must give a request, an "unsupported" answer or a decode error — never a
//! panic, an abort or an unbounded allocation. The broker's allocator is used so that
//! huge array-length prefixes behave as in production (see `sluice::alloc`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: sluice::alloc::Allocator = sluice::alloc::Allocator;

fuzz_target!(|data: &[u8]| sluice::api::fuzz_decode(data));
