//! `sluice-client`: the one Kafka client of the workspace. It owns the frame layer
//! ([`frame`]: a size-prefixed request with the header version its API and version
//! need, a response decoded with its header, a frame read under a size limit),
//! ApiVersions negotiation ([`Versions`]: the highest version both sides speak), the
//! names of Kafka error codes ([`error_name`], [`Error`]), and two transports over the
//! same frame layer:
//!
//! - [`blocking::Conn`]: `std::net::TcpStream` with connect and read timeouts, for the
//!   admin CLIs (`sluice group`, `sluice cluster`), which run outside any reactor.
//! - [`aio::Conn`]: a glommio `TcpStream`, one request at a time, with an optional
//!   per-call timeout, for the broker's replica fetcher and the load generator's setup
//!   requests. It never blocks a reactor: sockets are glommio's, and a host name that
//!   is not an IP literal is resolved on glommio's blocking-thread pool.
//!
//! Used by the broker crate (`sluice`, layer 1 of `src/lib.rs`'s list: the admin CLIs
//! in `cluster_cli`/`group_cli`, the follower fetcher in `fetcher`) and by
//! `sluice-bench`, whose pipelined produce/consume loops call the frame functions
//! directly. It depends on `kafka-protocol` only (no broker crate), so it works against
//! any Kafka-protocol broker.

pub mod aio;
pub mod blocking;
mod error;
pub mod frame;
mod login;
pub mod sasl;
pub mod security;
pub mod tls;
mod versions;

/// A fuzz target's corpus for the replay tests: the committed seeds
/// (`fuzz/seeds/<target>`, at least `min` of them) and any `make fuzz` corpus, each
/// seed also with every prefix and with one byte flipped at each position.
#[cfg(test)]
pub(crate) fn fuzz_replay_inputs(target: &str, min: usize) -> Vec<Vec<u8>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for dir in [format!("seeds/{target}"), format!("corpus/{target}")] {
        if let Ok(entries) = std::fs::read_dir(root.join(dir)) {
            for e in entries.flatten() {
                inputs.push(std::fs::read(e.path()).expect("corpus file"));
            }
        }
    }
    assert!(inputs.len() >= min, "fuzz/seeds/{target} is missing");
    for seed in inputs.clone() {
        for n in 0..seed.len() {
            inputs.push(seed[..n].to_vec());
            let mut flipped = seed.clone();
            flipped[n] ^= 0x41;
            inputs.push(flipped);
        }
    }
    inputs
}

pub use error::{code_err, error_name, Error, Result};
pub use frame::{decode_response, encode_request, FRAME_BYTES_MAX};
pub use versions::Versions;

use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;

/// A `StrBytes` holding a copy of `s`.
pub fn sbs(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// A topic name holding a copy of `s`.
pub fn topic_name(s: &str) -> TopicName {
    TopicName(sbs(s))
}
