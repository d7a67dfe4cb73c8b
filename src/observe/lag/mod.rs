//! Consumer lag as the metrics endpoint shows it: the board the shards' lag samplers
//! publish to (one slot per shard, the groups that shard coordinates, see
//! `crate::coord::group::lag`), its Prometheus families, the `/v1/groups` JSON routes, and the
//! alert sinks ([`sink`]).
//!
//! Each slot is a `Mutex<Arc<..>>` swapped by its shard once a sample and read by the
//! HTTP thread: the lock is held for a pointer copy, never on the produce/fetch path.

pub mod sink;

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use sluice_coordinator::alert::Rule;
use sluice_coordinator::lag::{LagConfig, Status, Trend};

use crate::observe::metrics::{Exposition, HttpRequest, HttpResponse, Kind, Registry};

/// One partition of one group at the last sample.
#[derive(Debug, Clone)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: i32,
    pub committed_offset: i64,
    pub commit_timestamp_ms: i64,
    /// -1: unknown (the leader could not be asked).
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    /// High watermark minus committed offset (0 if the commit is past it).
    pub lag_records: i64,
    /// Age of the record at the committed offset (0 when caught up).
    pub lag_seconds: f64,
    pub status: Status,
    pub trend: Trend,
    pub complete: f64,
}

/// One group at the last sample.
#[derive(Debug, Clone)]
pub struct GroupLag {
    pub group: String,
    pub state: &'static str,
    pub members: usize,
    /// Burrow's group status: the worst partition's, STOP/STALL/REWIND as ERR.
    pub status: Status,
    /// The worst partition status itself.
    pub worst: Status,
    pub complete: f64,
    pub partitions: Vec<PartitionLag>,
    pub sampled_at_ms: i64,
}

impl GroupLag {
    pub fn total_lag(&self) -> i64 {
        self.partitions.iter().map(|p| p.lag_records).sum()
    }

    pub fn max_lag_seconds(&self) -> f64 {
        self.partitions
            .iter()
            .map(|p| p.lag_seconds)
            .fold(0.0, f64::max)
    }

    fn max_lag_partition(&self) -> Option<&PartitionLag> {
        self.partitions.iter().max_by_key(|p| p.lag_records)
    }
}

/// What the samplers need besides the board: sampling and alert settings.
#[derive(Debug, Clone)]
pub struct LagSettings {
    pub interval_ms: u64,
    pub eval: LagConfig,
    /// Rules in order: the config file's `[[alert]]` first, then the flags' rule for
    /// every group (if any threshold flag is given).
    pub rules: Vec<Rule>,
}

/// The shards' published lag and the alert sink.
pub struct LagBoard {
    pub settings: LagSettings,
    node_id: i32,
    slots: Vec<Mutex<Arc<Vec<GroupLag>>>>,
    /// Where alert notices go (`None`: no sink configured).
    pub sink: Option<sink::Sink>,
}

impl LagBoard {
    /// A board for `shards` shards; registers its metric families and routes.
    pub fn install(
        settings: LagSettings,
        sink: Option<sink::Sink>,
        registry: &Registry,
        shards: usize,
    ) -> Arc<LagBoard> {
        let board = Arc::new(LagBoard {
            settings,
            node_id: registry.node_id(),
            slots: (0..shards).map(|_| Mutex::default()).collect(),
            sink,
        });
        let b = board.clone();
        registry.add_collector(Box::new(move |out| b.collect(out)));
        let b = board.clone();
        registry.add_route(Box::new(move |req| b.route(req)));
        board
    }

    /// Shard `shard` replaces its groups.
    pub fn publish(&self, shard: usize, groups: Vec<GroupLag>) {
        *self.slots[shard].lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(groups);
    }

    /// Every group of every shard, by name.
    pub fn groups(&self) -> Vec<GroupLag> {
        let mut all: Vec<GroupLag> = Vec::new();
        for slot in &self.slots {
            let s = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
            all.extend(s.iter().cloned());
        }
        all.sort_by(|a, b| a.group.cmp(&b.group));
        all
    }

    fn collect(&self, out: &mut Exposition) {
        let groups = self.groups();
        let parts = || {
            groups.iter().flat_map(|g| {
                g.partitions.iter().map(move |p| {
                    let partition = p.partition.to_string();
                    (g, p, partition)
                })
            })
        };
        type Get = fn(&PartitionLag) -> f64;
        let families: [(&str, &str, Get); 4] = [
            (
                "sluice_consumer_group_lag_records",
                "Records the group has not consumed: the partition's high watermark minus the group's committed offset (the read_uncommitted end, as kafka-consumer-groups.sh; a transactional consumer's lag includes an open transaction's records and its marker until it commits past them). Groups this broker coordinates.",
                |p| p.lag_records as f64,
            ),
            (
                "sluice_consumer_group_lag_seconds",
                "Age of the oldest record the group has not consumed: now minus the timestamp of the record at the committed offset; 0 when caught up.",
                |p| p.lag_seconds,
            ),
            (
                "sluice_consumer_group_committed_offset",
                "The group's committed offset (the next record it will consume).",
                |p| p.committed_offset as f64,
            ),
            (
                "sluice_consumer_group_partition_status",
                "Burrow's evaluation of the partition over its window of commits: 0 OK, 1 WARN, 2 ERR, 3 STOP, 4 STALL, 5 REWIND.",
                |p| f64::from(p.status.code()),
            ),
        ];
        for (name, help, get) in families {
            out.family(name, help, Kind::Gauge);
            for (g, p, partition) in parts() {
                let labels = [
                    ("group", g.group.as_str()),
                    ("topic", p.topic.as_str()),
                    ("partition", partition.as_str()),
                ];
                out.sample(name, &labels, get(p));
            }
        }
        out.family(
            "sluice_consumer_group_state",
            "The group's state (1 for its current state, as a label).",
            Kind::Gauge,
        );
        for g in &groups {
            let labels = [("group", g.group.as_str()), ("state", g.state)];
            out.sample("sluice_consumer_group_state", &labels, 1.0);
        }
        out.family(
            "sluice_consumer_group_members",
            "Members of the group.",
            Kind::Gauge,
        );
        for g in &groups {
            let labels = [("group", g.group.as_str())];
            out.sample("sluice_consumer_group_members", &labels, g.members as f64);
        }
        out.family(
            "sluice_consumer_group_status",
            "Burrow's group status, the worst partition's with STOP, STALL and REWIND as ERR: 0 OK, 1 WARN, 2 ERR.",
            Kind::Gauge,
        );
        for g in &groups {
            let labels = [("group", g.group.as_str())];
            let code = f64::from(g.status.code());
            out.sample("sluice_consumer_group_status", &labels, code);
        }
        if let Some(sink) = &self.sink {
            sink.collect(out);
        }
    }

    fn route(&self, req: &HttpRequest) -> Option<HttpResponse> {
        let rest = req.path.strip_prefix("/v1/groups")?;
        if req.method != "GET" {
            return Some(error(405, "only GET is served here"));
        }
        match rest {
            "" | "/" => Some(HttpResponse::json(200, self.list_json().to_string())),
            _ => {
                let name = percent_decode(rest.strip_prefix('/')?.trim_end_matches('/'));
                let Some(name) = name else {
                    return Some(error(400, "bad percent-encoding in the group name"));
                };
                Some(match self.groups().into_iter().find(|g| g.group == name) {
                    Some(g) => HttpResponse::json(200, self.group_json(&g).to_string()),
                    None => error(
                        404,
                        &format!(
                            "group {name:?} not found on broker {}: a broker answers for the groups it coordinates (FindCoordinator names it)",
                            self.node_id
                        ),
                    ),
                })
            }
        }
    }

    fn list_json(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .iter()
            .map(|g| {
                json!({
                    "group": g.group,
                    "status": g.status.name(),
                    "worst_partition_status": g.worst.name(),
                    "state": g.state,
                    "members": g.members,
                    "partition_count": g.partitions.len(),
                    "totallag": g.total_lag(),
                    "max_lag_seconds": g.max_lag_seconds(),
                    "complete": g.complete,
                })
            })
            .collect();
        json!({
            "error": false,
            "message": "consumer group list returned",
            "broker": self.node_id,
            "groups": groups,
        })
    }

    fn group_json(&self, g: &GroupLag) -> Value {
        let partitions: Vec<Value> = g.partitions.iter().map(partition_json).collect();
        json!({
            "error": false,
            "message": "consumer status returned",
            "broker": self.node_id,
            "status": {
                "group": g.group,
                "status": g.status.name(),
                "worst_partition_status": g.worst.name(),
                "complete": g.complete,
                "state": g.state,
                "members": g.members,
                "partition_count": g.partitions.len(),
                "totallag": g.total_lag(),
                "max_lag_seconds": g.max_lag_seconds(),
                "maxlag": g.max_lag_partition().map(partition_json),
                "partitions": partitions,
                "sampled_at_ms": g.sampled_at_ms,
            }
        })
    }
}

fn partition_json(p: &PartitionLag) -> Value {
    json!({
        "topic": p.topic,
        "partition": p.partition,
        "status": p.status.name(),
        "committed_offset": p.committed_offset,
        "commit_timestamp_ms": p.commit_timestamp_ms,
        "high_watermark": p.high_watermark,
        "last_stable_offset": p.last_stable_offset,
        "current_lag": p.lag_records,
        "lag_seconds": p.lag_seconds,
        "trend": p.trend.name(),
        "complete": p.complete,
    })
}

fn error(status: u16, message: &str) -> HttpResponse {
    HttpResponse::json(
        status,
        json!({"error": true, "message": message}).to_string(),
    )
}

/// The board for a broker: its sink thread started (if a sink is configured), its
/// metric families and routes registered.
pub fn install(
    config: &crate::base::config::BrokerConfig,
    registry: &Registry,
) -> Result<Arc<LagBoard>, String> {
    let rules = config.alert_rules.clone();
    let repeat_max = rules.iter().map(|r| r.repeat_ms).max().unwrap_or(0);
    let sink = sink::Sink::start(sink::SinkConfig {
        webhook: config.alert_webhook.clone(),
        alertmanager: config.alertmanager_url.clone(),
        extra_ca: config.alert_ssl_ca.clone(),
        // As Prometheus: four resend periods (at least Alertmanager's default
        // resolve_timeout of 5 minutes).
        firing_ttl_ms: (repeat_max.saturating_mul(4)).max(300_000),
    })?;
    match (rules.is_empty(), sink.is_some()) {
        (true, true) => tracing::warn!(
            "an alert sink is configured but no alert rule (--alert-lag-records, --alert-lag-seconds, --alert-min-status or [[alert]]): nothing will be sent"
        ),
        (false, false) => tracing::warn!(
            "lag alert rules are configured but no sink (--alert-webhook, --alertmanager-url): alerts are only evaluated"
        ),
        _ => {}
    }
    let settings = LagSettings {
        interval_ms: config.lag_sample_interval_ms,
        eval: config.lag_eval,
        rules,
    };
    Ok(LagBoard::install(settings, sink, registry, config.cores))
}

/// `%XX` sequences decoded (a group id may hold any character); `None` if malformed.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `ms` since the epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: i64) -> String {
    let (secs, millis) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        // 2024-02-29T12:34:56.789Z
        assert_eq!(rfc3339(1_709_210_096_789), "2024-02-29T12:34:56.789Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b%2Fc").as_deref(), Some("a b/c"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("bad%zz"), None);
    }
}
