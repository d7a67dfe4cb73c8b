//! Delivers lag alert notices to their sinks on a thread of its own (never a shard's
//! reactor): `--alert-webhook URL` gets Alertmanager's webhook JSON (version "4", one
//! message per alert), `--alertmanager-url URL` gets the alerts on Alertmanager's v2 API
//! (`POST /api/v2/alerts`).
//!
//! Shards hand notices over with [`Sink::send`], which never blocks: the queue holds
//! [`QUEUE_MAX`] batches and a batch that does not fit is dropped and counted. A sink
//! that is down (connection refused, timeout, 5xx, 429) is retried with exponential
//! backoff, [`ATTEMPTS_MAX`] times; a 4xx other than 429 is not retried.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use sluice_coordinator::alert::{Notice, NoticeKind};

use super::rfc3339;
use crate::observe::metrics::{Exposition, Kind};

/// Batches of notices waiting for the sink thread.
pub const QUEUE_MAX: usize = 1024;
/// Deliveries of one batch to one sink, the first included.
pub const ATTEMPTS_MAX: u32 = 8;
/// The first retry's delay; each next one doubles, up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_millis(250);
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// One HTTP request's limit (connect, send, answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The `alertname` label of every lag alert.
pub const ALERT_NAME: &str = "SluiceConsumerLag";

#[derive(Debug, Clone, Default)]
pub struct SinkConfig {
    pub webhook: Option<String>,
    /// Alertmanager's base URL (`/api/v2/alerts` is appended unless given).
    pub alertmanager: Option<String>,
    /// A firing alert posted to Alertmanager ends this long after it was sent unless it
    /// is sent again (a repeat) or resolved: a broker that died does not leave it
    /// firing forever.
    pub firing_ttl_ms: i64,
    /// Authorities trusted for https sinks besides Mozilla's roots (`--alert-ssl-ca`).
    pub extra_ca: Option<std::path::PathBuf>,
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
}

/// The shards' handle on the sink thread.
pub struct Sink {
    tx: SyncSender<Vec<Notice>>,
    counters: Arc<Counters>,
}

impl Sink {
    /// Starts the sink thread; `None` if no sink is configured.
    pub fn start(config: SinkConfig) -> Result<Option<Sink>, String> {
        if config.webhook.is_none() && config.alertmanager.is_none() {
            return Ok(None);
        }
        for url in config.webhook.iter().chain(&config.alertmanager) {
            if !url.starts_with("http://") && !url.starts_with("https://") {
                return Err(format!(
                    "alert sink {url}: expected an http:// or https:// URL"
                ));
            }
        }
        let tls = sluice_client::tls::https_config(config.extra_ca.as_deref())
            .map_err(|e| format!("alert sinks' TLS: {e}"))?;
        let (tx, rx) = sync_channel(QUEUE_MAX);
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        std::thread::Builder::new()
            .name("sluice-alerts".into())
            .spawn(move || run(config, tls, rx, &c))
            .map_err(|e| format!("starting the alert sink thread: {e}"))?;
        Ok(Some(Sink { tx, counters }))
    }

    /// Queues notices for delivery; never blocks (a full queue drops them, counted).
    pub fn send(&self, notices: Vec<Notice>) {
        if notices.is_empty() {
            return;
        }
        match self.tx.try_send(notices) {
            Ok(()) => {}
            Err(TrySendError::Full(n)) | Err(TrySendError::Disconnected(n)) => {
                self.counters
                    .dropped
                    .fetch_add(n.len() as u64, Ordering::Relaxed);
            }
        }
    }

    pub(super) fn collect(&self, out: &mut Exposition) {
        let c = &self.counters;
        for (name, help, v) in [
            (
                "sluice_lag_alert_notices_delivered_total",
                "Lag alert notices a sink accepted.",
                &c.delivered,
            ),
            (
                "sluice_lag_alert_notices_failed_total",
                "Lag alert notices given up on after every retry (or refused by a sink).",
                &c.failed,
            ),
            (
                "sluice_lag_alert_notices_dropped_total",
                "Lag alert notices dropped because the sink queue was full.",
                &c.dropped,
            ),
        ] {
            out.family(name, help, Kind::Counter);
            out.sample(name, &[], v.load(Ordering::Relaxed) as f64);
        }
    }
}

fn run(
    config: SinkConfig,
    tls: Arc<rustls::ClientConfig>,
    rx: Receiver<Vec<Notice>>,
    c: &Counters,
) {
    let agent = ureq::AgentBuilder::new()
        .timeout(REQUEST_TIMEOUT)
        .tls_config(tls)
        .build();
    let alertmanager = config.alertmanager.as_ref().map(|u| {
        let u = u.trim_end_matches('/');
        if u.ends_with("/api/v2/alerts") {
            u.to_string()
        } else {
            format!("{u}/api/v2/alerts")
        }
    });
    while let Ok(batch) = rx.recv() {
        let now = crate::base::util::now_ms();
        if let Some(url) = &config.webhook {
            for n in &batch {
                let body = webhook_message(n, now).to_string();
                count(c, 1, post(&agent, url, &body));
            }
        }
        if let Some(url) = &alertmanager {
            let alerts: Vec<Value> = batch
                .iter()
                .map(|n| alertmanager_alert(n, now, config.firing_ttl_ms))
                .collect();
            let body = Value::Array(alerts).to_string();
            count(c, batch.len() as u64, post(&agent, url, &body));
        }
    }
}

fn count(c: &Counters, n: u64, ok: bool) {
    let counter = if ok { &c.delivered } else { &c.failed };
    counter.fetch_add(n, Ordering::Relaxed);
}

/// POSTs `body`, retrying with backoff while the sink is unreachable or overloaded.
fn post(agent: &ureq::Agent, url: &str, body: &str) -> bool {
    let mut delay = BACKOFF_FIRST;
    for attempt in 1..=ATTEMPTS_MAX {
        let r = agent
            .post(url)
            .set("Content-Type", "application/json")
            .send_string(body);
        let retry = match r {
            Ok(_) => return true,
            Err(ureq::Error::Status(code, _)) if code != 429 && code < 500 => {
                tracing::warn!(url, code, "alert sink refused a notice; not retrying");
                return false;
            }
            Err(e) => e.to_string(),
        };
        tracing::warn!(url, attempt, error = %retry, "alert sink unreachable; retrying");
        if attempt < ATTEMPTS_MAX {
            std::thread::sleep(delay);
            delay = (delay * 2).min(BACKOFF_MAX);
        }
    }
    tracing::warn!(url, "alert sink: giving up on a notice");
    false
}

fn labels(n: &Notice) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("alertname".into(), ALERT_NAME.into());
    m.insert("group".into(), n.group.clone().into());
    m.insert("topic".into(), n.topic.clone().into());
    m.insert("severity".into(), n.severity.into());
    m.insert("service".into(), "sluice".into());
    m
}

fn annotations(n: &Notice) -> Map<String, Value> {
    let mut m = Map::new();
    let what = match n.kind {
        NoticeKind::Firing => "is behind",
        NoticeKind::Resolved => "caught up",
    };
    m.insert(
        "summary".into(),
        format!("Consumer group {} {what} on topic {}", n.group, n.topic).into(),
    );
    m.insert(
        "description".into(),
        format!(
            "lag {} records, {:.1} s (oldest unconsumed record's age), status {}; rule for groups {:?}",
            n.lag_records,
            n.lag_seconds,
            n.status.name(),
            n.rule
        )
        .into(),
    );
    m.insert("lag_records".into(), n.lag_records.to_string().into());
    m.insert("lag_seconds".into(), format!("{:.3}", n.lag_seconds).into());
    m.insert("lag_status".into(), n.status.name().into());
    m
}

fn status(n: &Notice) -> &'static str {
    match n.kind {
        NoticeKind::Firing => "firing",
        NoticeKind::Resolved => "resolved",
    }
}

/// Alertmanager's label-set fingerprint: 64-bit FNV-1a over the sorted names and
/// values, each followed by 0xff.
fn fingerprint(labels: &Map<String, Value>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut keys: Vec<&String> = labels.keys().collect();
    keys.sort();
    for k in keys {
        let v = labels[k].as_str().unwrap_or_default();
        for b in k.bytes().chain([0xff]).chain(v.bytes()).chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// One alert in Alertmanager's webhook format.
fn webhook_alert(n: &Notice) -> Value {
    let labels = labels(n);
    json!({
        "status": status(n),
        "fingerprint": fingerprint(&labels),
        "annotations": annotations(n),
        "startsAt": rfc3339(n.starts_at_ms),
        // Alertmanager's zero time for an alert that has not ended.
        "endsAt": n.ends_at_ms.map_or("0001-01-01T00:00:00Z".to_string(), rfc3339),
        "generatorURL": "",
        "labels": labels,
    })
}

/// Alertmanager's webhook message (version 4) for one alert.
pub fn webhook_message(n: &Notice, _now_ms: i64) -> Value {
    let labels = labels(n);
    let mut group_labels = Map::new();
    for k in ["alertname", "group", "topic"] {
        group_labels.insert(k.into(), labels[k].clone());
    }
    let group_key = format!(
        "{{}}:{{alertname={:?}, group={:?}, topic={:?}}}",
        ALERT_NAME, n.group, n.topic
    );
    json!({
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": status(n),
        "receiver": "sluice",
        "groupLabels": group_labels,
        "commonLabels": labels,
        "commonAnnotations": annotations(n),
        "externalURL": "",
        "alerts": [webhook_alert(n)],
    })
}

/// One alert as Alertmanager's `POST /api/v2/alerts` takes it.
pub fn alertmanager_alert(n: &Notice, now_ms: i64, firing_ttl_ms: i64) -> Value {
    let ends = n.ends_at_ms.unwrap_or(now_ms + firing_ttl_ms);
    json!({
        "labels": labels(n),
        "annotations": annotations(n),
        "startsAt": rfc3339(n.starts_at_ms),
        "endsAt": rfc3339(ends),
        "generatorURL": "",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_coordinator::lag::Status;

    fn notice(kind: NoticeKind) -> Notice {
        Notice {
            kind,
            group: "g".into(),
            topic: "t".into(),
            starts_at_ms: 1_000,
            ends_at_ms: (kind == NoticeKind::Resolved).then_some(9_000),
            lag_records: 42,
            lag_seconds: 3.5,
            status: Status::Warn,
            severity: "warning",
            rule: "*".into(),
        }
    }

    #[test]
    fn webhook_message_has_alertmanagers_shape() {
        let m = webhook_message(&notice(NoticeKind::Firing), 5_000);
        assert_eq!(m["version"], "4");
        assert_eq!(m["status"], "firing");
        let a = &m["alerts"][0];
        assert_eq!(a["labels"]["alertname"], ALERT_NAME);
        assert_eq!(a["labels"]["group"], "g");
        assert_eq!(a["labels"]["topic"], "t");
        assert_eq!(a["labels"]["severity"], "warning");
        assert_eq!(a["annotations"]["lag_records"], "42");
        assert_eq!(a["startsAt"], "1970-01-01T00:00:01.000Z");
        assert_eq!(a["endsAt"], "0001-01-01T00:00:00Z");
        assert_eq!(a["fingerprint"].as_str().map(str::len), Some(16));
        let r = webhook_message(&notice(NoticeKind::Resolved), 9_000);
        assert_eq!(r["status"], "resolved");
        assert_eq!(r["alerts"][0]["endsAt"], "1970-01-01T00:00:09.000Z");
        assert_eq!(r["alerts"][0]["fingerprint"], a["fingerprint"]);
    }

    #[test]
    fn alertmanager_alert_ends_after_the_ttl_unless_resolved() {
        let a = alertmanager_alert(&notice(NoticeKind::Firing), 5_000, 60_000);
        assert_eq!(a["endsAt"], "1970-01-01T00:01:05.000Z");
        let r = alertmanager_alert(&notice(NoticeKind::Resolved), 9_500, 60_000);
        assert_eq!(r["endsAt"], "1970-01-01T00:00:09.000Z");
    }
}
