//! Client quotas enforced on the shard that serves the connection (Kafka's
//! ClientQuotaManager, per shard): each produce request's bytes and each consumer
//! fetch answer's bytes are counted for the quota entity that applies to the client
//! (`sluice_replication::quota::resolve`, from the metadata image), over an 11-second
//! window; past its quota the response carries `throttle_time_ms` and the connection
//! reads nothing more from the client for that long (KIP-219: the client also holds
//! back). A consumer fetch asks for at most a window's worth of its quota, and one
//! that arrives while its client is over the quota is answered at once without
//! records (fetched again after the pause), as Kafka answers a throttled fetch.
//! Followers' fetches are not counted.
//!
//! `request_percentage` counts the time the shard spent polling the client's request
//! handlers (the server times every poll of a handler: waiting for a disk, a replica
//! or a long poll costs nothing), in milliseconds per second against the quota's
//! percent of one thread (50 = 500 ms a second).
//!
//! A quota is per broker in Kafka; here each shard holds the quota for the connections
//! it serves: the clients sharing one quota entity (a user's several client ids, or
//! one client's several connections) get up to the quota on each shard their
//! connections landed on (the kernel spreads connections over the shards).

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

/// The longest pause a `request_percentage` throttle asks for (Kafka's
/// ClientRequestQuotaManager: one sample). Byte-rate throttles are not bounded (as
/// Kafka's), only kept below what `throttle_time_ms` holds.
const REQUEST_THROTTLE_MAX_MS: u64 = SAMPLE_MS;
const THROTTLE_MAX_MS: u64 = i32::MAX as u64;

/// Counts `busy` (the shard's time on the client's requests since the last count)
/// against its `request_percentage`; returns the pause earned.
pub fn record_time(
    broker: &Broker,
    caller: &Caller,
    client_id: &str,
    busy: std::time::Duration,
) -> u64 {
    // The window counts milliseconds; the quota is percent of 1,000 ms a second.
    let ms = busy.as_secs_f64() * 1000.0;
    with_window(
        broker,
        caller,
        client_id,
        REQUEST_PERCENTAGE,
        |window, limit, now| {
            window.record(ms, now);
            window
                .throttle_ms(limit * 10.0, now)
                .min(REQUEST_THROTTLE_MAX_MS)
        },
    )
    .unwrap_or(0)
}

/// Counts `bytes` against the client's `key` byte-rate quota; returns the pause (ms)
/// it has earned, 0 without a quota.
pub fn record(
    broker: &Broker,
    caller: &Caller,
    client_id: &str,
    key: &'static str,
    bytes: usize,
) -> u64 {
    with_window(broker, caller, client_id, key, |window, limit, now| {
        window.record(bytes as f64, now);
        window.throttle_ms(limit, now).min(THROTTLE_MAX_MS)
    })
    .unwrap_or(0)
}

/// The pause the client is in for `key` now, counting nothing (a fetch over its
/// consumer quota is answered at once, empty, before anything is read or a fetch
/// session touched, as Kafka answers a throttled fetch).
pub fn pending(broker: &Broker, caller: &Caller, client_id: &str, key: &'static str) -> u64 {
    with_window(broker, caller, client_id, key, |window, limit, now| {
        window.throttle_ms(limit, now).min(THROTTLE_MAX_MS)
    })
    .unwrap_or(0)
}

/// The most one answer may carry under the client's `key` quota: a window's worth
/// (quota × 10 s, Kafka's `getMaxValueInQuotaWindow`), so no single fetch answer is
/// over the quota by itself; `None` without a quota.
pub fn window_allowance(
    broker: &Broker,
    caller: &Caller,
    client_id: &str,
    key: &'static str,
) -> Option<f64> {
    let image = broker.image();
    let (limit, _) = quota::resolve(&image.quotas, key, user_of(caller), client_id)?;
    Some(limit * ((SAMPLES as u64 - 1) * SAMPLE_MS) as f64 / 1000.0)
}

/// The user a principal is for quotas (`alice` of `User:alice`).
fn user_of(caller: &Caller) -> &str {
    caller
        .principal
        .strip_prefix("User:")
        .unwrap_or(&caller.principal)
}

/// Runs `f` on the client's window for `key` with the quota's value and the time;
/// `None` when no quota applies.
fn with_window<T>(
    broker: &Broker,
    caller: &Caller,
    client_id: &str,
    key: &'static str,
    f: impl FnOnce(&mut RateWindow, f64, u64) -> T,
) -> Option<T> {
    let image = broker.image();
    if image.quotas.is_empty() {
        return None;
    }
    let (limit, (u, c)) = quota::resolve(&image.quotas, key, user_of(caller), client_id)?;
    let now = now_ms();
    Some(WINDOWS.with(|w| {
        let mut w = w.borrow_mut();
        if w.len() > 10_000 {
            w.retain(|_, window| !window.idle(now));
        }
        f(w.entry((key, u, c)).or_default(), limit, now)
    }))
}
