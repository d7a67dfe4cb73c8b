//! The metrics endpoint: Prometheus counters kept per shard, their text exposition, and
//! the HTTP server that serves them (`--metrics-listen`) on its own thread.
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

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub use crate::base::config::MetricsListen;
pub use sluice_storage::stats::{Histogram, HistogramSnapshot, BUCKET_BOUNDS_US};

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

    /// The whole `/metrics` page.
    pub fn render(&self) -> String {
        let mut out = Exposition::default();
        self.render_process(&mut out);
        self.render_requests(&mut out);
        self.render_partitions(&mut out);
        self.render_node(&mut out);
        self.render_storage(&mut out);
        for c in self
            .collectors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            c(&mut out);
        }
        out.finish()
    }

    fn render_process(&self, out: &mut Exposition) {
        out.family("sluice_up", "1 while the broker process runs.", Kind::Gauge);
        out.sample("sluice_up", &[], 1.0);
        out.family(
            "sluice_build_info",
            "The broker's version (value 1).",
            Kind::Gauge,
        );
        out.sample(
            "sluice_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1.0,
        );
        out.family("sluice_node_id", "This broker's node id.", Kind::Gauge);
        out.sample("sluice_node_id", &[], self.node_id as f64);
        out.family(
            "sluice_ready",
            "1 when every shard serves the Kafka port (registered, unfenced); as GET /ready.",
            Kind::Gauge,
        );
        out.sample("sluice_ready", &[], bool_f(self.ready()));
        out.family(
            "sluice_uptime_seconds",
            "Seconds since the broker started.",
            Kind::Gauge,
        );
        out.sample(
            "sluice_uptime_seconds",
            &[],
            self.started.elapsed().as_secs_f64(),
        );
        out.family("sluice_shards", "Shards (executor threads).", Kind::Gauge);
        out.sample("sluice_shards", &[], self.shards.len() as f64);
    }

    fn render_requests(&self, out: &mut Exposition) {
        let sum = |f: &dyn Fn(&ShardMetrics) -> &AtomicU64| -> f64 {
            self.shards
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .sum::<u64>() as f64
        };
        out.family(
            "sluice_requests_total",
            "Kafka requests handled, per API.",
            Kind::Counter,
        );
        let mut latencies = Vec::new();
        for api in 0..API_KEYS {
            let n: u64 = self
                .shards
                .iter()
                .map(|s| s.requests[api].load(Ordering::Relaxed))
                .sum();
            if n == 0 {
                continue;
            }
            let name = api_name(api as i16);
            out.sample("sluice_requests_total", &[("api", &name)], n as f64);
            let mut h = HistogramSnapshot::default();
            for s in &self.shards {
                h.merge(&s.request_latency[api].snapshot());
            }
            latencies.push((name, h));
        }
        out.family(
            "sluice_request_latency_seconds",
            "Time from a request's decoding to its response being ready, per API.",
            Kind::Histogram,
        );
        for (name, h) in &latencies {
            out.histogram("sluice_request_latency_seconds", &[("api", name)], h);
        }
        out.family(
            "sluice_request_errors_total",
            "Error codes in responses (per partition where a response has them), per API and Kafka error.",
            Kind::Counter,
        );
        for api in 0..API_KEYS {
            for code in 1..ERROR_CODES {
                let n: u64 = self
                    .shards
                    .iter()
                    .map(|s| s.errors[api * ERROR_CODES + code].load(Ordering::Relaxed))
                    .sum();
                if n == 0 {
                    continue;
                }
                let (code_label, name) = if code == ERROR_CODES - 1 {
                    ("other".to_string(), "OTHER".to_string())
                } else {
                    (code.to_string(), error_name(code as i16))
                };
                out.sample(
                    "sluice_request_errors_total",
                    &[
                        ("api", &api_name(api as i16)),
                        ("code", &code_label),
                        ("error", &name),
                    ],
                    n as f64,
                );
            }
        }
        type Counter = fn(&ShardMetrics) -> &AtomicU64;
        let counters: [(&str, &str, Counter); 4] = [
            (
                "sluice_bytes_in_total",
                "Bytes of Kafka request frames read.",
                |s| &s.bytes_in,
            ),
            (
                "sluice_bytes_out_total",
                "Bytes of Kafka response frames written.",
                |s| &s.bytes_out,
            ),
            (
                "sluice_records_in_total",
                "Records appended by client Produce requests (as leader).",
                |s| &s.records_in,
            ),
            (
                "sluice_records_out_total",
                "Records returned by Fetch requests (consumers and follower replicas).",
                |s| &s.records_out,
            ),
        ];
        for (name, help, f) in counters {
            out.family(name, help, Kind::Counter);
            out.sample(name, &[], sum(&f));
        }
        let accepted = sum(&|s| &s.connections_accepted);
        let closed = sum(&|s| &s.connections_closed);
        out.family(
            "sluice_connections_accepted_total",
            "Kafka client connections accepted.",
            Kind::Counter,
        );
        out.sample("sluice_connections_accepted_total", &[], accepted);
        out.family(
            "sluice_connections",
            "Kafka client connections open.",
            Kind::Gauge,
        );
        out.sample("sluice_connections", &[], (accepted - closed).max(0.0));
        out.family(
            "sluice_fetch_sessions",
            "Incremental fetch sessions (KIP-227) cached (Kafka's NumIncrementalFetchSessions).",
            Kind::Gauge,
        );
        out.sample("sluice_fetch_sessions", &[], sum(&|s| &s.fetch_sessions));
        out.family(
            "sluice_fetch_session_evictions_total",
            "Fetch sessions evicted from a full cache to make room for another.",
            Kind::Counter,
        );
        out.sample(
            "sluice_fetch_session_evictions_total",
            &[],
            sum(&|s| &s.fetch_session_evictions),
        );
        let mut append = HistogramSnapshot::default();
        for s in &self.shards {
            append.merge(&s.append_latency.snapshot());
        }
        out.family(
            "sluice_append_latency_seconds",
            "Appending one produced batch to its partition log (before the flush).",
            Kind::Histogram,
        );
        out.histogram("sluice_append_latency_seconds", &[], &append);
        out.family(
            "sluice_fsync_latency_seconds",
            "fdatasync of partition log files (group commits), or a shared syncfs round.",
            Kind::Histogram,
        );
        out.histogram(
            "sluice_fsync_latency_seconds",
            &[],
            &sluice_storage::stats::FSYNC.snapshot(),
        );
        out.family(
            "sluice_fs_sync_rounds_total",
            "Shared syncfs rounds, each standing in for many partition files' fdatasyncs.",
            Kind::Counter,
        );
        out.sample(
            "sluice_fs_sync_rounds_total",
            &[],
            sluice_storage::stats::FS_SYNC_ROUNDS.load(Ordering::Relaxed) as f64,
        );
        out.family(
            "sluice_fs_sync_files_total",
            "Partition file syncs made by a shared syncfs round.",
            Kind::Counter,
        );
        out.sample(
            "sluice_fs_sync_files_total",
            &[],
            sluice_storage::stats::FS_SYNC_FILES.load(Ordering::Relaxed) as f64,
        );
    }

    fn render_partitions(&self, out: &mut Exposition) {
        let snaps: Vec<_> = (0..self.shards.len()).map(|i| self.snapshot(i)).collect();
        let mut parts: Vec<&PartitionStat> =
            snaps.iter().flat_map(|s| s.partitions.iter()).collect();
        parts.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        type Field = fn(&PartitionStat) -> f64;
        let families: [(&str, &str, Field); 7] = [
            (
                "sluice_partition_high_watermark",
                "High watermark (offset of the next committed record) of each partition replica here.",
                |p| p.high_watermark as f64,
            ),
            (
                "sluice_partition_log_start_offset",
                "First offset of each partition replica's log.",
                |p| p.log_start_offset as f64,
            ),
            (
                "sluice_partition_log_end_offset",
                "Offset of the next record to be appended to each partition replica's log.",
                |p| p.log_end_offset as f64,
            ),
            (
                "sluice_partition_size_bytes",
                "Bytes of each partition replica's log segments.",
                |p| p.size_bytes as f64,
            ),
            (
                "sluice_partition_isr_size",
                "In-sync replicas of each partition led here (other replicas: 0).",
                |p| if p.leader { p.isr_size as f64 } else { 0.0 },
            ),
            (
                "sluice_partition_under_replicated",
                "1 when a partition led here has fewer in-sync replicas than replicas.",
                |p| bool_f(p.leader && p.under_replicated),
            ),
            (
                "sluice_partition_offline",
                "1 while a partition replica here is offline after an I/O error.",
                |p| bool_f(p.offline),
            ),
        ];
        for (name, help, f) in families {
            out.family(name, help, Kind::Gauge);
            for p in &parts {
                if p.offline && name != "sluice_partition_offline" {
                    continue;
                }
                let part = p.partition.to_string();
                out.sample(name, &[("topic", &p.topic), ("partition", &part)], f(p));
            }
        }
        out.family(
            "sluice_partition_leader",
            "1 for partitions this broker leads.",
            Kind::Gauge,
        );
        for p in &parts {
            let part = p.partition.to_string();
            out.sample(
                "sluice_partition_leader",
                &[("topic", &p.topic), ("partition", &part)],
                bool_f(p.leader),
            );
        }
        let count = |f: &dyn Fn(&PartitionStat) -> bool| parts.iter().filter(|p| f(p)).count();
        let totals: [(&str, &str, usize); 4] = [
            (
                "sluice_partitions",
                "Partition replicas hosted by this broker.",
                parts.len(),
            ),
            (
                "sluice_leader_partitions",
                "Partitions this broker leads.",
                count(&|p| p.leader && !p.offline),
            ),
            (
                "sluice_under_replicated_partitions",
                "Partitions led here with fewer in-sync replicas than replicas.",
                count(&|p| p.leader && p.under_replicated),
            ),
            (
                "sluice_offline_partitions",
                "Partition replicas offline after an I/O error.",
                count(&|p| p.offline),
            ),
        ];
        for (name, help, v) in totals {
            out.family(name, help, Kind::Gauge);
            out.sample(name, &[], v as f64);
        }
        out.family(
            "sluice_shard_partitions",
            "Partition replicas of this broker each shard owns (opens and serves).",
            Kind::Gauge,
        );
        for (i, snap) in snaps.iter().enumerate() {
            let shard = i.to_string();
            out.sample(
                "sluice_shard_partitions",
                &[("shard", &shard)],
                snap.partitions.len() as f64,
            );
        }
        let pids: u64 = snaps.iter().map(|s| s.producer_ids).sum();
        out.family(
            "sluice_producer_ids",
            "Producer ids with state in this broker's partition logs.",
            Kind::Gauge,
        );
        out.sample("sluice_producer_ids", &[], pids as f64);
        // Only once every shard's coordinator has loaded: a partial sum would dip.
        if let Some(txns) = snaps
            .iter()
            .map(|s| s.open_transactions)
            .sum::<Option<u64>>()
        {
            out.family(
                "sluice_ongoing_transactions",
                "Transactions open (ongoing, or preparing to commit or abort) on the transaction coordinators of this broker.",
                Kind::Gauge,
            );
            out.sample("sluice_ongoing_transactions", &[], txns as f64);
        }
        let refused: u64 = snaps.iter().map(|s| s.disk_appends_refused).sum();
        out.family(
            "sluice_disk_appends_refused_total",
            "Client appends refused for lack of disk space (KAFKA_STORAGE_ERROR).",
            Kind::Counter,
        );
        out.sample("sluice_disk_appends_refused_total", &[], refused as f64);
        out.family(
            "sluice_disk_low",
            "1 while free space is below the minimum and appends are refused.",
            Kind::Gauge,
        );
        out.sample(
            "sluice_disk_low",
            &[],
            bool_f(snaps.iter().any(|s| s.disk_low)),
        );
    }

    /// Per shard: the storage budgets and their use.
    fn render_storage(&self, out: &mut Exposition) {
        let stats: Vec<StorageStat> = (0..self.snapshots.len())
            .map(|i| self.snapshot(i).storage)
            .collect();
        type Field = fn(&StorageStat) -> u64;
        let families: [(&str, &str, Kind, Field); 7] = [
            (
                "sluice_storage_active_logs",
                "Partition logs whose active segment's files are open (the descriptor budget's use).",
                Kind::Gauge,
                |s| s.active_logs,
            ),
            (
                "sluice_storage_active_logs_max",
                "The most partition logs with open active files (the shard's descriptor budget).",
                Kind::Gauge,
                |s| s.active_logs_max,
            ),
            (
                "sluice_storage_log_reactivations_total",
                "Active segment files opened on demand (a log's first append after the broker started or after the budget closed them).",
                Kind::Counter,
                |s| s.reactivations,
            ),
            (
                "sluice_storage_preallocated_unwritten_bytes",
                "Disk preallocated ahead of segment writes and not yet written.",
                Kind::Gauge,
                |s| s.preallocated_unwritten_bytes,
            ),
            (
                "sluice_storage_preallocated_bytes_max",
                "The cap on preallocated-but-unwritten bytes per shard.",
                Kind::Gauge,
                |s| s.preallocated_bytes_max,
            ),
            (
                "sluice_storage_index_memory_bytes",
                "Closed segments' offset and time indexes held in memory, as the last budget pass (every 5 s) left them.",
                Kind::Gauge,
                |s| s.index_memory_bytes,
            ),
            (
                "sluice_storage_index_memory_max",
                "The per-shard budget of closed segments' in-memory indexes.",
                Kind::Gauge,
                |s| s.index_memory_max,
            ),
        ];
        for (name, help, kind, field) in families {
            out.family(name, help, kind);
            for (i, s) in stats.iter().enumerate() {
                let shard = i.to_string();
                out.sample(name, &[("shard", &shard)], field(s) as f64);
            }
        }
    }

    fn render_node(&self, out: &mut Exposition) {
        let Some(snap) = self.snapshots.first().map(|_| self.snapshot(0)) else {
            return;
        };
        let Some(n) = &snap.node else { return };
        let gauges: [(&str, &str, f64); 10] = [
            (
                "sluice_controller_active",
                "1 when this broker's metadata quorum voter is the raft leader (the active controller).",
                bool_f(n.active_controller),
            ),
            (
                "sluice_controller_id",
                "The active controller's node id as this broker's image has it (-1: none).",
                n.controller_id as f64,
            ),
            (
                "sluice_raft_term",
                "Current raft term of this broker's metadata quorum voter.",
                n.raft_term as f64,
            ),
            (
                "sluice_raft_leader",
                "Raft leader of the metadata quorum as this voter knows it (-1: none).",
                n.raft_leader as f64,
            ),
            (
                "sluice_metadata_epoch",
                "Epoch of the metadata image this broker serves.",
                n.metadata_epoch as f64,
            ),
            (
                "sluice_brokers",
                "Brokers registered in the cluster.",
                n.brokers as f64,
            ),
            (
                "sluice_fenced_brokers",
                "Registered brokers that are fenced.",
                n.fenced_brokers as f64,
            ),
            (
                "sluice_disk_free_bytes",
                "Free bytes of the data directory's file system.",
                n.disk_free_bytes as f64,
            ),
            (
                "sluice_disk_total_bytes",
                "Size of the data directory's file system.",
                n.disk_total_bytes as f64,
            ),
            (
                "sluice_disk_min_free_bytes",
                "Free space below which client appends are refused.",
                n.disk_min_free_bytes as f64,
            ),
        ];
        for (name, help, v) in gauges {
            out.family(name, help, Kind::Gauge);
            out.sample(name, &[], v);
        }
    }

    /// Answers one request: the built-in routes, then the added ones, else 404.
    pub fn route(&self, req: &HttpRequest) -> HttpResponse {
        if req.method != "GET" && req.method != "HEAD" {
            return HttpResponse::text(405, "method not allowed\n");
        }
        match req.path.as_str() {
            "/metrics" => {
                return HttpResponse {
                    status: 200,
                    content_type: "text/plain; version=0.0.4; charset=utf-8".into(),
                    body: self.render().into_bytes(),
                }
            }
            "/health" => return HttpResponse::text(200, "ok\n"),
            "/ready" => {
                return if self.ready() {
                    HttpResponse::text(200, "ready\n")
                } else {
                    HttpResponse::text(
                        503,
                        "not ready: not yet registered and unfenced, or not serving the Kafka port\n",
                    )
                }
            }
            _ => {}
        }
        for r in self.routes.read().unwrap_or_else(|e| e.into_inner()).iter() {
            if let Some(resp) = r(req) {
                return resp;
            }
        }
        HttpResponse::text(404, "not found (try /metrics, /health, /ready)\n")
    }
}

fn bool_f(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// A Kafka API's name, e.g. "Produce" (unknown keys: their number).
pub fn api_name(api_key: i16) -> String {
    match kafka_protocol::messages::ApiKey::try_from(api_key) {
        Ok(k) => format!("{k:?}"),
        Err(_) => api_key.to_string(),
    }
}

/// A Kafka error code's name, e.g. "NOT_LEADER_OR_FOLLOWER".
pub fn error_name(code: i16) -> String {
    match kafka_protocol::ResponseError::try_from_code(code) {
        Some(e) => screaming_snake(&format!("{e:?}")),
        None => format!("CODE_{code}"),
    }
}

/// "NotLeaderOrFollower" -> "NOT_LEADER_OR_FOLLOWER".
fn screaming_snake(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// The Prometheus text exposition format (0.0.4) being written: call [`Self::family`]
/// once per family, then its samples, before the next family.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample line; label values are escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        self.labels(labels, None);
        self.out.push(' ');
        self.value(value);
        self.out.push('\n');
    }

    /// A histogram's `_bucket` (cumulative, `le` in seconds), `_sum` and `_count` lines.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let mut cumulative = 0u64;
        for (i, n) in h.buckets.iter().enumerate() {
            cumulative += n;
            let le = match BUCKET_BOUNDS_US.get(i) {
                Some(us) => format!("{}", *us as f64 / 1e6),
                None => "+Inf".to_string(),
            };
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        self.out.push(' ');
        self.value(h.sum_us as f64 / 1e6);
        self.out.push('\n');
        let _ = write!(self.out, "{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", h.count());
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let le = le.map(|v| ("le", v));
        for (i, (k, v)) in labels.iter().copied().chain(le).enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(k);
            self.out.push_str("=\"");
            for c in v.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        self.out.push('}');
    }

    fn value(&mut self, v: f64) {
        if v.is_nan() {
            self.out.push_str("NaN");
        } else if v.is_infinite() {
            self.out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
        } else if v == v.trunc() && v.abs() < 1e15 {
            let _ = write!(self.out, "{}", v as i64);
        } else {
            let _ = write!(self.out, "{v}");
        }
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.out
    }
}

/// An HTTP request as routes see it.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: String,
    /// The path without the query, e.g. "/v1/groups/my-group" (not percent-decoded).
    pub path: String,
    /// The query string without '?' ("" when none).
    pub query: String,
}

impl HttpRequest {
    /// The value of query parameter `key` (not percent-decoded), if present.
    pub fn query_param(&self, key: &str) -> Option<&str> {
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == key).then_some(v)
        })
    }
}

/// An HTTP response a route returns.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn text(status: u16, body: impl Into<String>) -> HttpResponse {
        HttpResponse {
            status,
            content_type: "text/plain; charset=utf-8".into(),
            body: body.into().into_bytes(),
        }
    }

    pub fn json(status: u16, body: impl Into<String>) -> HttpResponse {
        HttpResponse {
            status,
            content_type: "application/json".into(),
            body: body.into().into_bytes(),
        }
    }
}

/// Binds the endpoint and starts its thread. `Ok(None)`: off, or the default address
/// could not be bound (logged). An explicit address that cannot be bound is an error.
pub fn start(listen: MetricsListen, registry: Arc<Registry>) -> Result<Option<SocketAddr>, String> {
    let (addr, explicit) = match listen {
        MetricsListen::Off => return Ok(None),
        MetricsListen::Default(a) => (a, false),
        MetricsListen::Explicit(a) => (a, true),
    };
    let server = match tiny_http::Server::http(addr) {
        Ok(s) => s,
        Err(e) if explicit => {
            return Err(format!(
                "cannot serve metrics on --metrics-listen {addr}: {e}"
            ))
        }
        Err(e) => {
            tracing::warn!(%addr, error = %e, "cannot serve metrics on the default address; running without a metrics endpoint (set --metrics-listen HOST:PORT or off)");
            return Ok(None);
        }
    };
    let bound = server.server_addr().to_ip().unwrap_or(addr);
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || serve(server, registry))
        .map_err(|e| format!("starting the metrics thread: {e}"))?;
    Ok(Some(bound))
}

/// The HTTP thread: one request at a time (a scrape is cheap; Prometheus scrapes rarely).
fn serve(server: tiny_http::Server, registry: Arc<Registry>) {
    for request in server.incoming_requests() {
        let url = request.url().to_string();
        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
        let req = HttpRequest {
            method: request.method().as_str().to_ascii_uppercase(),
            path: path.to_string(),
            query: query.to_string(),
        };
        let resp = registry.route(&req);
        let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], resp.content_type)
            .expect("a valid header");
        let out = tiny_http::Response::from_data(resp.body)
            .with_status_code(resp.status)
            .with_header(header);
        if let Err(e) = request.respond(out) {
            tracing::debug!(error = %e, "metrics response not sent");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_histograms_are_cumulative() {
        let mut e = Exposition::default();
        e.family("x_total", "Help with a \\ and\nnewline.", Kind::Counter);
        e.sample("x_total", &[("a", "q\"b\\c\nd")], 3.0);
        let mut h = HistogramSnapshot::default();
        h.buckets[0] = 2;
        h.buckets[2] = 1;
        h.sum_us = 1_500;
        e.histogram("lat_seconds", &[("api", "Produce")], &h);
        let text = e.finish();
        assert!(text.contains("# HELP x_total Help with a \\\\ and\\nnewline.\n"));
        assert!(text.contains("x_total{a=\"q\\\"b\\\\c\\nd\"} 3\n"));
        assert!(text.contains("lat_seconds_bucket{api=\"Produce\",le=\"0.00005\"} 2\n"));
        assert!(text.contains("lat_seconds_bucket{api=\"Produce\",le=\"0.0001\"} 2\n"));
        assert!(text.contains("lat_seconds_bucket{api=\"Produce\",le=\"0.00025\"} 3\n"));
        assert!(text.contains("lat_seconds_bucket{api=\"Produce\",le=\"+Inf\"} 3\n"));
        assert!(text.contains("lat_seconds_sum{api=\"Produce\"} 0.0015\n"));
        assert!(text.contains("lat_seconds_count{api=\"Produce\"} 3\n"));
    }

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

    #[test]
    fn each_shard_reports_the_partitions_it_owns() {
        let r = Registry::new(1, 2);
        let stat = |partition| PartitionStat {
            topic: "t".into(),
            partition,
            leader: true,
            high_watermark: 0,
            log_start_offset: 0,
            log_end_offset: 0,
            size_bytes: 0,
            isr_size: 1,
            replicas: 1,
            under_replicated: false,
            offline: partition == 2,
        };
        let snapshot = |partitions| ShardSnapshot {
            partitions,
            ..ShardSnapshot::default()
        };
        r.publish(0, snapshot(vec![stat(0), stat(2)]));
        r.publish(1, snapshot(vec![stat(1)]));
        let text = r.render();
        // An offline replica is still its shard's.
        assert!(
            text.contains("sluice_shard_partitions{shard=\"0\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_shard_partitions{shard=\"1\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("sluice_partitions 3\n"), "{text}");
    }
}
