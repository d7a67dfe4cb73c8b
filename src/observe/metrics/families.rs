//! The broker's own metric families: the `/metrics` page, written at every scrape from
//! the shards' counters and published snapshots, then the added collectors. Cut from the
//! registry because it only reads it (on the HTTP thread, never on a shard's path), and
//! from `exposition.rs` because this is what the broker reports (names, help, labels)
//! while that is how the text format is written.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    Exposition, HistogramSnapshot, Kind, PartitionStat, Registry, ShardMetrics, StorageStat,
    TieredStat, API_KEYS, ERROR_CODES,
};

impl Registry {
    /// The whole `/metrics` page.
    pub fn render(&self) -> String {
        let mut out = Exposition::default();
        self.render_process(&mut out);
        self.render_requests(&mut out);
        self.render_partitions(&mut out);
        self.render_node(&mut out);
        self.render_storage(&mut out);
        self.render_tiered(&mut out);
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

    /// Per shard, with tiered storage on: uploads, remote reads and their lag.
    fn render_tiered(&self, out: &mut Exposition) {
        let stats: Vec<(usize, TieredStat)> = (0..self.snapshots.len())
            .filter_map(|i| Some((i, self.snapshot(i).tiered?)))
            .collect();
        if stats.is_empty() {
            return;
        }
        type Field = fn(&TieredStat) -> u64;
        let families: [(&str, &str, Kind, Field); 12] = [
            ("sluice_remote_uploaded_segments_total", "Closed segments copied to the object store and recorded in the quorum.", Kind::Counter, |s| s.uploaded_segments),
            ("sluice_remote_uploaded_bytes_total", "Bytes of segment logs copied to the object store.", Kind::Counter, |s| s.uploaded_bytes),
            ("sluice_remote_upload_errors_total", "Upload rounds of a partition that failed (retried next round).", Kind::Counter, |s| s.upload_errors),
            ("sluice_remote_deleted_segments_total", "Remote segments deleted by remote retention.", Kind::Counter, |s| s.deleted_segments),
            ("sluice_remote_fetches_total", "Consumer reads served from the object store.", Kind::Counter, |s| s.remote_reads),
            ("sluice_remote_fetch_bytes_total", "Record bytes served from the object store.", Kind::Counter, |s| s.remote_read_bytes),
            ("sluice_remote_fetch_errors_total", "Reads from the object store that failed (answered KAFKA_STORAGE_ERROR, retriable).", Kind::Counter, |s| s.remote_read_errors),
            ("sluice_remote_fetch_microseconds_total", "Time spent in reads from the object store (divide by sluice_remote_fetches_total for the mean latency).", Kind::Counter, |s| s.remote_read_micros),
            ("sluice_remote_upload_lag_segments", "Closed segments of this shard's leaders not yet in the object store.", Kind::Gauge, |s| s.upload_lag_segments),
            ("sluice_remote_upload_lag_bytes", "Bytes of those segments.", Kind::Gauge, |s| s.upload_lag_bytes),
            ("sluice_remote_backlog_appends_refused_total", "Appends to tiered partitions refused while the upload backlog was over its budget (--remote-upload-backlog-max-bytes).", Kind::Counter, |s| s.backlog_appends_refused),
            ("sluice_remote_cache_bytes", "Bytes of remote chunks and indexes cached for reads.", Kind::Gauge, |s| s.cache_bytes),
        ];
        for (name, help, kind, field) in families {
            out.family(name, help, kind);
            for (i, s) in &stats {
                let shard = i.to_string();
                out.sample(name, &[("shard", &shard)], field(s) as f64);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::super::ShardSnapshot;
    use super::*;

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
