//! The metrics endpoint: Prometheus counters kept per shard, their text exposition, and
//! the HTTP server that serves them (`--metrics-listen`) on its own thread.
//!
//! This file is the registry, what the layers above call: the counters each shard
//! writes ([`ShardMetrics`]), the snapshots shards publish, the readiness flags, and the
//! collectors and routes other subsystems add. The rest is cut by role, where the
//! readers differ: shards write here and never format or serve; `families.rs` reads it
//! all at scrape time to write the `/metrics` page; `exposition.rs` is the text format
//! itself, which collectors elsewhere (the lag board's) write through too; `http.rs` is
//! the endpoint and its thread, the only part that does I/O.
//!
//! ## Where the numbers come from
//!
//! - Counters and histograms of the request path live in one [`ShardMetrics`] per shard:
//!   atomics written with `Relaxed` by that shard alone (no contention, no lock), read
//!   and summed by the HTTP thread at scrape time.
//! - State a shard owns (per-partition high watermark, ISR, leader counts, ...) is
//!   copied by the shard itself, once a [`SNAPSHOT_INTERVAL`], into its slot
//!   ([`Registry::publish`]): a `Mutex<Arc<..>>` held only for a pointer swap, by the
//!   shard's timer and by a scrape, never on the produce/fetch path.
//! - Anything else registers a collector ([`Registry::add_collector`]).
//!
//! The HTTP thread never calls into a shard's reactor and never waits for one.
//!
//! ## Extension points (for other subsystems, e.g. consumer lag)
//!
//! ```ignore
//! // A metric family: called on the HTTP thread at every scrape of /metrics.
//! registry.add_collector(Box::new(move |out: &mut Exposition| {
//!     out.family("sluice_consumer_group_lag_records", "Records ...", Kind::Gauge);
//!     out.sample("sluice_consumer_group_lag_records",
//!                &[("group", "g"), ("topic", "t"), ("partition", "0")], 42.0);
//! }));
//! // A route: the first route answering `Some` serves the request; the built-in
//! // routes (/metrics, /health, /ready) are tried first.
//! registry.add_route(Box::new(|req: &HttpRequest| {
//!     let group = req.path.strip_prefix("/v1/groups/")?;
//!     Some(HttpResponse::json(200, format!("{{\"group\":{:?}}}", group)))
//! }));
//! ```
//!
//! Collectors and routes must be `Send + Sync` (they run on the HTTP thread) and must
//! not block for long: read state that shards published (atomics, a snapshot slot of
//! your own behind a `Mutex<Arc<T>>`), never wait on a shard. Both may be added at any
//! time, before or after the server starts. [`Registry::shard_count`] and
//! [`Registry::node_id`] help label what you publish.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub use crate::base::config::MetricsListen;
pub use sluice_storage::stats::{Histogram, HistogramSnapshot, BUCKET_BOUNDS_US};

mod exposition;
mod families;
mod http;

pub use exposition::{Exposition, Kind};
pub use families::{api_name, error_name};
pub use http::{start, HttpRequest, HttpResponse};

/// How often each shard publishes its partition snapshot and its readiness.
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_millis(500);

/// Kafka API keys are below this (the highest is 80-something); larger keys are not
/// counted per API (they close the connection anyway).
pub const API_KEYS: usize = 128;
/// Kafka error codes counted per API: 1..ERROR_CODES (0 is success; a code outside,
/// e.g. -1 UNKNOWN_SERVER_ERROR, is counted in the last slot as "other").
pub const ERROR_CODES: usize = 128;

/// Counters one shard writes (Relaxed atomics) and the HTTP thread sums. Aligned to
/// 128 bytes (two cache lines, as adjacent-line prefetch pairs them) so that two shards'
/// counters, which sit side by side in the registry, never share a line.
#[repr(align(128))]
pub struct ShardMetrics {
    /// Requests handled, per API key.
    pub requests: [AtomicU64; API_KEYS],
    /// Time from a request's decoding to its response being ready, per API key.
    pub request_latency: Box<[Histogram]>,
    /// Error codes in responses, `[api * ERROR_CODES + code]` (see [`Self::error`]).
    errors: Box<[AtomicU64]>,
    /// Request frames read, in bytes (size prefix included).
    pub bytes_in: AtomicU64,
    /// Response frames written, in bytes.
    pub bytes_out: AtomicU64,
    /// Records appended by client Produce requests (leaders only; not replication).
    pub records_in: AtomicU64,
    /// Records returned by Fetch requests (to consumers and followers).
    pub records_out: AtomicU64,
    pub connections_accepted: AtomicU64,
    pub connections_closed: AtomicU64,
    /// A produced batch's append to the log, sequence checks included (not the flush).
    pub append_latency: Histogram,
    /// Incremental fetch sessions (KIP-227) cached on this shard now, and evicted so far.
    pub fetch_sessions: AtomicU64,
    pub fetch_session_evictions: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

impl Default for ShardMetrics {
    fn default() -> Self {
        ShardMetrics {
            requests: [ZERO; API_KEYS],
            request_latency: (0..API_KEYS).map(|_| Histogram::new()).collect(),
            errors: (0..API_KEYS * ERROR_CODES)
                .map(|_| AtomicU64::new(0))
                .collect(),
            bytes_in: ZERO,
            bytes_out: ZERO,
            records_in: ZERO,
            records_out: ZERO,
            connections_accepted: ZERO,
            connections_closed: ZERO,
            append_latency: Histogram::new(),
            fetch_sessions: ZERO,
            fetch_session_evictions: ZERO,
        }
    }
}

impl ShardMetrics {
    /// Counts one handled request of API `api_key` that took `elapsed`.
    pub fn request(&self, api_key: i16, elapsed: Duration) {
        if let Some(i) = api_index(api_key) {
            self.requests[i].fetch_add(1, Ordering::Relaxed);
            self.request_latency[i].record(elapsed);
        }
    }

    /// Counts one error code `code` (non-zero) in a response of API `api_key`.
    pub fn error(&self, api_key: i16, code: i16) {
        if code == 0 {
            return;
        }
        if let Some(i) = api_index(api_key) {
            let c = if code > 0 && (code as usize) < ERROR_CODES - 1 {
                code as usize
            } else {
                ERROR_CODES - 1
            };
            self.errors[i * ERROR_CODES + c].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

fn api_index(api_key: i16) -> Option<usize> {
    usize::try_from(api_key).ok().filter(|&i| i < API_KEYS)
}

/// One partition's state as its home shard last published it.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionStat {
    pub topic: String,
    pub partition: i32,
    /// This broker leads the partition.
    pub leader: bool,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub size_bytes: u64,
    /// ISR size as this broker knows it (the leader's view is authoritative).
    pub isr_size: usize,
    pub replicas: usize,
    /// The leader's ISR is smaller than the replica set.
    pub under_replicated: bool,
    /// The log is offline after an I/O error (see `Broker::take_offline`).
    pub offline: bool,
}

/// What a shard publishes once a [`SNAPSHOT_INTERVAL`].
#[derive(Debug, Clone, Default)]
pub struct ShardSnapshot {
    pub partitions: Vec<PartitionStat>,
    /// Producer ids with state in this shard's logs.
    pub producer_ids: u64,
    /// Client appends this shard refused for lack of disk space.
    pub disk_appends_refused: u64,
    /// This shard refuses appends (free space below the minimum).
    pub disk_low: bool,
    /// Transactions open on this shard's transaction coordinator (`None`: loading).
    pub open_transactions: Option<u64>,
    /// Shard 0 only: controller/disk facts (`None` elsewhere).
    pub node: Option<NodeSnapshot>,
    /// The shard storage's descriptor and preallocation budgets and their use.
    pub storage: StorageStat,
    /// Tiered storage's work on this shard (`None`: no `--remote-storage`).
    pub tiered: Option<TieredStat>,
}

/// What a shard did with tiered storage's object store (issue 44), counters since
/// start and the upload lag of its leaders at the last round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TieredStat {
    pub uploaded_segments: u64,
    pub uploaded_bytes: u64,
    pub upload_errors: u64,
    pub deleted_segments: u64,
    pub remote_reads: u64,
    pub remote_read_bytes: u64,
    pub remote_read_errors: u64,
    pub remote_read_micros: u64,
    pub upload_lag_segments: u64,
    pub upload_lag_bytes: u64,
    pub backlog_appends_refused: u64,
    pub cache_bytes: u64,
}

/// A shard's storage budgets (issue 14) and what is used of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageStat {
    /// Logs whose active segment's files are open now, and the most there may be.
    pub active_logs: u64,
    pub active_logs_max: u64,
    /// Active files opened on demand so far (first append after an open, or after the
    /// budget closed them).
    pub reactivations: u64,
    /// Disk preallocated ahead of segment writes and not yet written, and the cap.
    pub preallocated_unwritten_bytes: u64,
    pub preallocated_bytes_max: u64,
    /// Closed segments' in-memory index bytes as the last budget pass left them, and
    /// the budget.
    pub index_memory_bytes: u64,
    pub index_memory_max: u64,
}

/// Facts of the whole broker, published by shard 0.
#[derive(Debug, Clone, Default)]
pub struct NodeSnapshot {
    pub active_controller: bool,
    pub controller_id: i32,
    pub raft_term: u64,
    pub raft_leader: i32,
    pub metadata_epoch: u64,
    pub brokers: usize,
    pub fenced_brokers: usize,
    pub disk_free_bytes: u64,
    pub disk_total_bytes: u64,
    pub disk_min_free_bytes: u64,
}

/// A collector: writes metric families at every scrape (on the HTTP thread).
pub type Collector = Box<dyn Fn(&mut Exposition) + Send + Sync>;
/// A route: answers the requests it recognises (`None`: not mine).
pub type Route = Box<dyn Fn(&HttpRequest) -> Option<HttpResponse> + Send + Sync>;

/// Every shard's metrics and snapshot, the readiness flags, and the collectors and
/// routes others added. One per process, shared by the shards and the HTTP thread.
pub struct Registry {
    node_id: i32,
    started: Instant,
    shards: Vec<ShardMetrics>,
    snapshots: Vec<Mutex<Arc<ShardSnapshot>>>,
    /// Per shard: listening on the Kafka port with a complete image (registered,
    /// unfenced, controller known). All true: ready.
    serving: Vec<AtomicBool>,
    collectors: RwLock<Vec<Collector>>,
    routes: RwLock<Vec<Route>>,
}

impl Registry {
    pub fn new(node_id: i32, shards: usize) -> Registry {
        Registry {
            node_id,
            started: Instant::now(),
            shards: (0..shards).map(|_| ShardMetrics::default()).collect(),
            snapshots: (0..shards).map(|_| Mutex::default()).collect(),
            serving: (0..shards).map(|_| AtomicBool::new(false)).collect(),
            collectors: RwLock::default(),
            routes: RwLock::default(),
        }
    }

    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Shard `i`'s counters (its own to write).
    pub fn shard(&self, i: usize) -> &ShardMetrics {
        &self.shards[i]
    }

    /// Shard `i` replaces its snapshot (a pointer swap under the slot's lock).
    pub fn publish(&self, i: usize, snapshot: ShardSnapshot) {
        let s = Arc::new(snapshot);
        *self.snapshots[i].lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    fn snapshot(&self, i: usize) -> Arc<ShardSnapshot> {
        self.snapshots[i]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Shard `i` says whether it serves the Kafka port with a complete image.
    pub fn set_serving(&self, i: usize, serving: bool) {
        self.serving[i].store(serving, Ordering::Relaxed);
    }

    /// Every shard serves: registered, unfenced, listening.
    pub fn ready(&self) -> bool {
        self.serving.iter().all(|s| s.load(Ordering::Relaxed))
    }

    pub fn add_collector(&self, c: Collector) {
        self.collectors
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(c);
    }

    pub fn add_route(&self, r: Route) {
        self.routes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_summed_over_shards_and_routes_extend() {
        let r = Registry::new(1, 2);
        r.shard(0).request(0, Duration::from_micros(10));
        r.shard(1).request(0, Duration::from_micros(10));
        r.shard(1).error(0, 6);
        let text = r.render();
        assert!(text.contains("sluice_requests_total{api=\"Produce\"} 2\n"));
        assert!(text.contains(
            "sluice_request_errors_total{api=\"Produce\",code=\"6\",error=\"NOT_LEADER_OR_FOLLOWER\"} 1\n"
        ));
        let get = |p: &str| HttpRequest {
            method: "GET".into(),
            path: p.into(),
            query: String::new(),
        };
        assert_eq!(r.route(&get("/ready")).status, 503);
        r.set_serving(0, true);
        r.set_serving(1, true);
        assert_eq!(r.route(&get("/ready")).status, 200);
        assert_eq!(r.route(&get("/v1/x")).status, 404);
        r.add_route(Box::new(|q| {
            (q.path == "/v1/x").then(|| HttpResponse::json(200, "{}"))
        }));
        assert_eq!(r.route(&get("/v1/x")).status, 200);
        r.add_collector(Box::new(|o| {
            o.family("sluice_extra", "Extra.", Kind::Gauge);
            o.sample("sluice_extra", &[], 7.0);
        }));
        assert!(r.render().contains("sluice_extra 7\n"));
    }
}
