//! `sluice lag`: consumer lag in the terminal, worst first.
//!
//! It reads the brokers' own evaluation (`GET /v1/groups/{group}` on their metrics
//! endpoints) rather than recomputing lag over the Kafka protocol, so the table shows
//! exactly what `/metrics` and the alerts see, with Burrow's status and the lag in
//! seconds (which the Kafka protocol cannot give without reading records). Each broker
//! answers for the groups it coordinates: with `--group`, FindCoordinator names the
//! broker to ask; otherwise every broker of the cluster (Metadata) is asked. A broker's
//! metrics endpoint is found by the default convention (its Kafka port + 552, on the
//! host it advertises) unless `--metrics HOST:PORT[,HOST:PORT...]` lists them.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::Duration;

use kafka_protocol::messages::{FindCoordinatorRequest, MetadataRequest};
use serde_json::Value;
use sluice_client::blocking::Conn;
use sluice_client::{code_err, sbs};

use sluice::base::config::METRICS_PORT_OFFSET;

/// Why `sluice lag` failed (or, for [`LagCliError::Http`], what it reports about one
/// endpoint while it goes on); the text is the message printed.
#[derive(Debug, thiserror::Error)]
pub enum LagCliError {
    /// The bootstrap broker could not be reached, or answered with an error code.
    #[error(transparent)]
    Client(#[from] sluice_client::Error),
    #[error("--interval {0}: must be above 0")]
    Interval(f64),
    /// --https-ca did not load.
    #[error("--https-ca: {0}")]
    HttpsCa(#[from] sluice_client::tls::TlsError),
    /// A metrics endpoint did not answer, or not with JSON.
    #[error("{url}: {reason}")]
    Http { url: String, reason: String },
    #[error("group {0}: no broker answered for it")]
    NoAnswer(String),
}

pub type Res<T> = Result<T, LagCliError>;

const CLIENT_ID: &str = "sluice-lag";
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug, Clone)]
pub struct LagArgs {
    /// Any broker of the cluster (Kafka port).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    /// Only this group.
    #[arg(long)]
    pub group: Option<String>,
    /// Metrics endpoints to ask, HOST:PORT[,HOST:PORT...] [default: every broker's
    /// Kafka port + 552].
    #[arg(long, value_delimiter = ',')]
    pub metrics: Vec<String>,
    /// Redraw every --interval seconds until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// Seconds between redraws with --watch.
    #[arg(long, default_value_t = 2.0)]
    pub interval: f64,
    /// Ask the metrics endpoints over https (brokers started with --metrics-tls),
    /// trusting the public authorities and --https-ca.
    #[arg(long)]
    pub https: bool,
    /// PEM file of a certificate authority the metrics endpoints' certificates are
    /// checked against (implies --https).
    #[arg(long)]
    pub https_ca: Option<std::path::PathBuf>,
}

/// One table row.
#[derive(Debug, Clone)]
struct Row {
    group: String,
    topic: String,
    partition: i64,
    committed: i64,
    end: i64,
    lag: i64,
    lag_seconds: f64,
    status: String,
    trend: String,
}

pub fn run(a: &LagArgs) -> Res<()> {
    if !(a.interval > 0.0 && a.interval.is_finite()) {
        return Err(LagCliError::Interval(a.interval));
    }
    let mut agent = ureq::AgentBuilder::new().timeout(HTTP_TIMEOUT);
    if a.https || a.https_ca.is_some() {
        agent = agent.tls_config(sluice_client::tls::https_config(a.https_ca.as_deref())?);
    }
    let agent = agent.build();
    loop {
        let (rows, problems) = collect(&agent, a)?;
        let table = render(&rows, a.group.as_deref());
        let mut page = String::new();
        if a.watch {
            // Clear the screen and go home, then draw.
            page.push_str("\x1b[2J\x1b[H");
            page.push_str(&format!(
                "sluice lag  every {}s  {}\n",
                a.interval,
                sluice::observe::lag::rfc3339(sluice::base::util::now_ms())
            ));
        }
        page.push_str(&table);
        // A closed pipe (`sluice lag --watch | head`) ends the command quietly.
        let mut out = std::io::stdout().lock();
        if out
            .write_all(page.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(());
        }
        drop(out);
        for p in &problems {
            eprintln!("sluice lag: {p}");
        }
        if !a.watch {
            if let Some(g) = &a.group {
                if rows.iter().all(|r| &r.group != g) && !problems.is_empty() {
                    return Err(LagCliError::NoAnswer(g.clone()));
                }
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

/// The metrics endpoints to ask.
fn endpoints(a: &LagArgs) -> Res<Vec<String>> {
    if !a.metrics.is_empty() {
        return Ok(a.metrics.clone());
    }
    let mut c = Conn::open(&a.bootstrap, CLIENT_ID)?;
    let hosts: Vec<(String, i32)> = match &a.group {
        Some(g) => {
            let r = c.call(
                3,
                &FindCoordinatorRequest::default()
                    .with_key(sbs(g))
                    .with_key_type(0),
            )?;
            code_err("FindCoordinator", r.error_code)?;
            vec![(r.host.to_string(), r.port)]
        }
        None => {
            let r = c.call(4, &MetadataRequest::default().with_topics(Some(vec![])))?;
            r.brokers
                .iter()
                .map(|b| (b.host.to_string(), b.port))
                .collect()
        }
    };
    Ok(hosts
        .into_iter()
        .map(|(h, p)| {
            let host = if h.contains(':') { format!("[{h}]") } else { h };
            format!("{host}:{}", p + i32::from(METRICS_PORT_OFFSET))
        })
        .collect())
}

fn get(agent: &ureq::Agent, url: &str) -> Res<Option<Value>> {
    let http = |reason: String| LagCliError::Http {
        url: url.to_string(),
        reason,
    };
    match agent.get(url).call() {
        Ok(r) => r
            .into_string()
            .map_err(|e| http(e.to_string()))
            .and_then(|s| serde_json::from_str(&s).map_err(|e| http(e.to_string())))
            .map(Some),
        Err(ureq::Error::Status(404, _)) => Ok(None),
        Err(e) => Err(http(e.to_string())),
    }
}

/// Rows from every endpoint, and what went wrong on the way.
fn collect(agent: &ureq::Agent, a: &LagArgs) -> Res<(Vec<Row>, Vec<LagCliError>)> {
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for ep in endpoints(a)? {
        let scheme = if a.https || a.https_ca.is_some() {
            "https"
        } else {
            "http"
        };
        let base = format!("{scheme}://{ep}");
        let groups: Vec<String> = match &a.group {
            Some(g) => vec![g.clone()],
            None => match get(agent, &format!("{base}/v1/groups")) {
                Ok(Some(v)) => v["groups"]
                    .as_array()
                    .map(|gs| {
                        gs.iter()
                            .filter_map(|g| g["group"].as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
                Ok(None) => Vec::new(),
                Err(e) => {
                    problems.push(e);
                    continue;
                }
            },
        };
        for g in groups {
            if !seen.insert(g.clone()) {
                continue;
            }
            let url = format!("{base}/v1/groups/{}", percent_encode(&g));
            match get(agent, &url) {
                Ok(Some(v)) => rows.extend(rows_of(&g, &v)),
                Ok(None) => {
                    seen.remove(&g);
                }
                Err(e) => problems.push(e),
            }
        }
    }
    // Worst first: status, then age, then records.
    rows.sort_by(|x, y| {
        severity(&y.status)
            .cmp(&severity(&x.status))
            .then(y.lag_seconds.total_cmp(&x.lag_seconds))
            .then(y.lag.cmp(&x.lag))
            .then((&x.group, &x.topic, x.partition).cmp(&(&y.group, &y.topic, y.partition)))
    });
    Ok((rows, problems))
}

fn rows_of(group: &str, v: &Value) -> Vec<Row> {
    let parts = v["status"]["partitions"].as_array().cloned();
    parts
        .unwrap_or_default()
        .iter()
        .map(|p| Row {
            group: group.to_string(),
            topic: p["topic"].as_str().unwrap_or("?").to_string(),
            partition: p["partition"].as_i64().unwrap_or(-1),
            committed: p["committed_offset"].as_i64().unwrap_or(-1),
            end: p["high_watermark"].as_i64().unwrap_or(-1),
            lag: p["current_lag"].as_i64().unwrap_or(0),
            lag_seconds: p["lag_seconds"].as_f64().unwrap_or(0.0),
            status: p["status"].as_str().unwrap_or("?").to_string(),
            trend: p["trend"].as_str().unwrap_or("flat").to_string(),
        })
        .collect()
}

fn severity(status: &str) -> u8 {
    sluice_coordinator::lag::Status::parse(status).map_or(0, |s| s.code())
}

fn arrow(trend: &str) -> &'static str {
    match trend {
        "up" => "↑",
        "down" => "↓",
        _ => "→",
    }
}

/// Seconds as a short human age: 850ms, 42s, 3m07s, 2h05m.
fn age(s: f64) -> String {
    if s < 1.0 {
        return format!("{}ms", (s * 1000.0).round() as i64);
    }
    let t = s.round() as i64;
    match t {
        0..=59 => format!("{t}s"),
        60..=3599 => format!("{}m{:02}s", t / 60, t % 60),
        _ => format!("{}h{:02}m", t / 3600, t % 3600 / 60),
    }
}

fn render(rows: &[Row], group: Option<&str>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if rows.is_empty() {
        match group {
            Some(g) => {
                let _ = writeln!(out, "group {g}: no committed offsets to show");
            }
            None => {
                let _ = writeln!(out, "no consumer groups with committed offsets");
            }
        }
        return out;
    }
    let gw = rows.iter().map(|r| r.group.len()).max().unwrap_or(5).max(5);
    let tw = rows.iter().map(|r| r.topic.len()).max().unwrap_or(5).max(5);
    let _ = writeln!(
        out,
        "{:<gw$}  {:<tw$}  {:>9}  {:>12}  {:>12}  {:>10}  {:>8}  {:<6}  TREND",
        "GROUP", "TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "LAG-AGE", "STATUS"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<gw$}  {:<tw$}  {:>9}  {:>12}  {:>12}  {:>10}  {:>8}  {:<6}  {}",
            r.group,
            r.topic,
            r.partition,
            r.committed,
            r.end,
            r.lag,
            age(r.lag_seconds),
            r.status,
            arrow(&r.trend)
        );
    }
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(0.25), "250ms");
        assert_eq!(age(42.2), "42s");
        assert_eq!(age(187.0), "3m07s");
        assert_eq!(age(7_500.0), "2h05m");
    }

    #[test]
    fn worst_rows_first_in_aligned_columns() {
        let row = |g: &str, lag: i64, s: &str| Row {
            group: g.into(),
            topic: "t".into(),
            partition: 0,
            committed: 1,
            end: 1 + lag,
            lag,
            lag_seconds: 1.0,
            status: s.into(),
            trend: "up".into(),
        };
        let t = render(&[row("a", 5, "STOP"), row("bb", 0, "OK")], None);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("GROUP"));
        assert!(lines[1].starts_with("a ") && lines[1].contains("STOP") && lines[1].ends_with('↑'));
        assert_eq!(lines[1].find("t "), lines[2].find("t "));
        assert_eq!(percent_encode("a b/c"), "a%20b%2Fc");
    }
}
