//! Client quotas enforced on the shard that serves the connection (Kafka's
//! ClientQuotaManager, per shard): each produce request's bytes and each consumer
//! fetch answer's bytes are counted for the quota entity that applies to the client
//! (`sluice_replication::quota::resolve`, from the metadata image), over an 11-second
//! window; past its quota the response carries `throttle_time_ms` and the connection
//! reads nothing more from the client for that long (KIP-219: the client also holds
//! back). A throttled fetch answers without records (they are fetched again after the
//! pause), as Kafka does. Followers' fetches are not counted.
//!
//! `request_percentage` counts the time the shard spent polling the client's request
//! handlers (the server times every poll of a handler: waiting for a disk, a replica
//! or a long poll costs nothing), in milliseconds per second against the quota's
//! percent of one thread (50 = 500 ms a second).
//!
//! A quota is per broker in Kafka; here each shard holds the quota for the connections
//! it serves, so a client spread over several shards' connections could get up to the
//! quota on each (Kafka clients keep one connection per broker).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Instant;

use sluice_replication::quota::{self, RateWindow, SAMPLES, SAMPLE_MS};

use crate::partition::broker::Broker;
use crate::serve::authz::Caller;

pub use sluice_replication::quota::{CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE};

/// Windows by quota key and tracked entity (user, client id).
type Windows = HashMap<(&'static str, String, String), RateWindow>;

thread_local! {
    static WINDOWS: RefCell<Windows> = RefCell::new(HashMap::new());
}

fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The longest pause one response asks for (Kafka bounds it by the window).
const THROTTLE_MAX_MS: u64 = SAMPLES as u64 * SAMPLE_MS;

/// Counts `busy` (the shard's time on the client's requests since the last count)
/// against its `request_percentage`; returns the pause earned.
pub fn record_time(
    broker: &Broker,
    caller: &Caller,
    client_id: &str,
    busy: std::time::Duration,
) -> u64 {
    // The window counts milliseconds; the quota is percent of 1,000 ms a second.
    record_scaled(
        broker,
        caller,
        client_id,
        REQUEST_PERCENTAGE,
        busy.as_secs_f64() * 1000.0,
        10.0,
        false,
    )
}

/// Counts `bytes` against the client's `key` quota; returns the pause (ms) it has
/// earned, 0 without a quota. `take_back`: a throttled answer will not carry the bytes
/// (a fetch), so they are not counted.
pub fn record(
    broker: &Broker,
    caller: &Caller,
    client_id: &str,
    key: &'static str,
    bytes: usize,
    take_back: bool,
) -> u64 {
    record_scaled(broker, caller, client_id, key, bytes as f64, 1.0, take_back)
}

/// [`record`] of `amount`, the quota's value times `scale` being the bound.
fn record_scaled(
    broker: &Broker,
    caller: &Caller,
    client_id: &str,
    key: &'static str,
    amount: f64,
    scale: f64,
    take_back: bool,
) -> u64 {
    let image = broker.image();
    if image.quotas.is_empty() {
        return 0;
    }
    let user = caller
        .principal
        .strip_prefix("User:")
        .unwrap_or(&caller.principal);
    let Some((limit, (u, c))) = quota::resolve(&image.quotas, key, user, client_id) else {
        return 0;
    };
    let now = now_ms();
    WINDOWS.with(|w| {
        let mut w = w.borrow_mut();
        if w.len() > 10_000 {
            w.retain(|_, window| !window.idle(now));
        }
        let window = w.entry((key, u, c)).or_default();
        window.record(amount, now);
        let pause = window.throttle_ms(limit * scale, now).min(THROTTLE_MAX_MS);
        if pause > 0 && take_back {
            window.unrecord(amount, now);
        }
        pause
    })
}
