//! Samples over time, for soak runs: every `--sample-secs`, one row with the records
//! produced (acknowledged) and consumed in that interval, the produce-ack and
//! end-to-end latency of that interval alone, and the watched process's resident
//! memory, open descriptors and its data directory's allocated bytes, so that growth
//! over a run is visible.
//!
//! The counters and latencies are read on the load generator's executor (an interval's
//! histogram is the run's histogram minus the one at the previous sample, so the hot
//! path records into one histogram as before); the process and directory are read by
//! a thread of their own at the same ticks, so that walking a data directory never
//! delays the producers or the consumer. Rows and readings are joined by tick number.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::load::{histogram, Stats};

/// What to sample and how often.
#[derive(Debug, Clone, Serialize)]
pub struct SampleOpts {
    pub every_s: f64,
    /// Process whose RSS and open descriptors are read (e.g. the broker).
    pub pid: Option<u32>,
    /// Directory whose allocated bytes are summed (e.g. the broker's data dir).
    pub dir: Option<PathBuf>,
}

/// The watched process and directory at one tick; `None` where not watched or not
/// readable (the process gone, say).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Resources {
    pub rss_kib: Option<u64>,
    pub open_fds: Option<u64>,
    /// Sum of st_blocks * 512 over the directory's files (what the files occupy on
    /// disk, preallocation included).
    pub disk_bytes: Option<u64>,
}

/// One interval of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Seconds from the start of the run to the end of this interval.
    pub elapsed_s: f64,
    /// Records acknowledged to the producers in the interval.
    pub produced: u64,
    /// Records the consumer read in the interval.
    pub consumed: u64,
    pub produced_per_sec: f64,
    pub consumed_per_sec: f64,
    /// Produce-ack latency of the records acknowledged in the interval.
    pub produce_p50_ms: Option<f64>,
    pub produce_p99_ms: Option<f64>,
    pub produce_max_ms: Option<f64>,
    /// End-to-end latency of the records consumed in the interval.
    pub e2e_p99_ms: Option<f64>,
    #[serde(flatten)]
    pub resources: Resources,
}

fn tick_at(every: f64, k: u32) -> f64 {
    every * f64::from(k)
}

/// Whether tick `k` falls inside a run of `until` seconds (all ticks without one).
fn in_run(every: f64, k: u32, until: Option<f64>) -> bool {
    until.is_none_or(|u| tick_at(every, k) <= u + 1e-6)
}

/// Resident set of `pid` in KiB (VmRSS of /proc/PID/status).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU time of `pid` so far in seconds: user + system of all its threads (fields 14
/// and 15 of /proc/PID/stat, in clock ticks of 1/100 s, Linux's USER_HZ everywhere).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(cpu_ticks(&s)? as f64 / 100.0)
}

/// utime + stime of a /proc/PID/stat line.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: the fields after it
    // start past its last ')', at field 3.
    let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let utime: u64 = rest.nth(11)?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Open descriptors of `pid` (entries of /proc/PID/fd).
pub fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Bytes allocated to the files under `dir` (st_blocks * 512), following no symbolic
/// links; files deleted while it walks (retention) are skipped.
pub fn allocated_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    let mut first = true;
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(_) if !first => continue,
            Err(_) => return None,
        };
        first = false;
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    Some(total)
}

fn measure(opts: &SampleOpts) -> Resources {
    Resources {
        rss_kib: opts.pid.and_then(rss_kib),
        open_fds: opts.pid.and_then(open_fds),
        disk_bytes: opts.dir.as_deref().and_then(allocated_bytes),
    }
}

/// Sleeps until `at`, in steps of at most 100 ms, returning early (false) once `stop`
/// says so.
fn sleep_until(at: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= at {
            return true;
        }
        std::thread::sleep((at - now).min(Duration::from_millis(100)));
    }
}

/// The thread that reads the watched process and directory at every tick.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<(u32, Resources)>>>,
}

impl Watcher {
    /// Reads at `start + k * every` for k = 0, 1, 2, ... while inside `until` seconds
    /// (k = 0: at the start, before any load).
    pub fn start(opts: &SampleOpts, start: Instant, until: Option<f64>) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let (o, s) = (opts.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("bench-watch".into())
            .spawn(move || {
                let mut out = Vec::new();
                let mut k = 0;
                while in_run(o.every_s, k, until)
                    && sleep_until(start + Duration::from_secs_f64(tick_at(o.every_s, k)), &s)
                {
                    out.push((k, measure(&o)));
                    k += 1;
                }
                out
            })
            .ok();
        Watcher { stop, handle }
    }

    /// Stops the thread and returns its readings by tick.
    pub fn finish(mut self) -> Vec<(u32, Resources)> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn ms(h: &Histogram<u64>, q: f64) -> Option<f64> {
    (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0)
}

/// `now` minus `prev`: the latencies recorded between the two copies.
fn since(now: &Histogram<u64>, prev: &Histogram<u64>) -> Histogram<u64> {
    let mut h = now.clone();
    if h.subtract(prev).is_err() {
        // Cannot happen for copies of one histogram that only grows; an empty
        // interval rather than a wrong one if it does.
        h = histogram();
    }
    h
}

/// On the load generator's executor: a row at every tick (`start + k * every`) inside
/// `until` seconds, until `stop` is set. `consumed` is the histogram the consumer
/// records every record's end-to-end latency in (its length counts them).
pub async fn sample_loop(
    every_s: f64,
    start: Instant,
    until: Option<f64>,
    stats: Rc<Stats>,
    consumed: Rc<RefCell<Histogram<u64>>>,
    stop: Rc<Cell<bool>>,
) -> Vec<(u32, Row)> {
    let mut rows = Vec::new();
    let (mut prev_lat, mut prev_e2e) = (histogram(), histogram());
    let (mut prev_acked, mut prev_consumed) = (0u64, 0u64);
    let mut k = 1;
    while in_run(every_s, k, until) {
        let at = start + Duration::from_secs_f64(tick_at(every_s, k));
        while !stop.get() && Instant::now() < at {
            let left = at.saturating_duration_since(Instant::now());
            glommio::timer::sleep(left.min(Duration::from_millis(100))).await;
        }
        if stop.get() {
            break;
        }
        let lat = stats.latency.borrow().clone();
        let e2e = consumed.borrow().clone();
        let (iv_lat, iv_e2e) = (since(&lat, &prev_lat), since(&e2e, &prev_e2e));
        let (acked, read) = (stats.acked.get(), e2e.len());
        let secs = every_s.max(1e-9);
        let (produced, consumed_n) = (acked - prev_acked, read.saturating_sub(prev_consumed));
        rows.push((
            k,
            Row {
                elapsed_s: tick_at(every_s, k),
                produced,
                consumed: consumed_n,
                produced_per_sec: produced as f64 / secs,
                consumed_per_sec: consumed_n as f64 / secs,
                produce_p50_ms: ms(&iv_lat, 0.5),
                produce_p99_ms: ms(&iv_lat, 0.99),
                produce_max_ms: ms(&iv_lat, 1.0),
                e2e_p99_ms: ms(&iv_e2e, 0.99),
                resources: Resources::default(),
            },
        ));
        (prev_lat, prev_e2e, prev_acked, prev_consumed) = (lat, e2e, acked, read);
        k += 1;
    }
    rows
}

/// Joins the executor's rows with the watcher's readings of the same ticks; the
/// reading at the start becomes a first row at 0 s with no records.
pub fn join(rows: Vec<(u32, Row)>, readings: Vec<(u32, Resources)>) -> Vec<Row> {
    let first = readings.iter().find(|(k, _)| *k == 0).map(|(_, r)| Row {
        elapsed_s: 0.0,
        produced: 0,
        consumed: 0,
        produced_per_sec: 0.0,
        consumed_per_sec: 0.0,
        produce_p50_ms: None,
        produce_p99_ms: None,
        produce_max_ms: None,
        e2e_p99_ms: None,
        resources: *r,
    });
    first
        .into_iter()
        .chain(rows.into_iter().map(|(k, mut row)| {
            if let Some((_, r)) = readings.iter().find(|(t, _)| *t == k) {
                row.resources = *r;
            }
            row
        }))
        .collect()
}

/// The rows as a terminal table.
pub fn print_table(rows: &[Row]) {
    let opt = |v: Option<f64>, prec: usize| v.map_or("–".to_string(), |v| format!("{v:.prec$}"));
    println!(
        "{:>9} {:>12} {:>12} {:>9} {:>9} {:>9} {:>10} {:>9} {:>6} {:>10}",
        "elapsed s",
        "produced/s",
        "consumed/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "e2e p99",
        "RSS MiB",
        "fds",
        "disk MiB"
    );
    for r in rows {
        let x = &r.resources;
        println!(
            "{:>9.0} {:>12.0} {:>12.0} {:>9} {:>9} {:>9} {:>10} {:>9} {:>6} {:>10}",
            r.elapsed_s,
            r.produced_per_sec,
            r.consumed_per_sec,
            opt(r.produce_p50_ms, 3),
            opt(r.produce_p99_ms, 3),
            opt(r.produce_max_ms, 3),
            opt(r.e2e_p99_ms, 3),
            opt(x.rss_kib.map(|v| v as f64 / 1024.0), 1),
            x.open_fds.map_or("–".to_string(), |v| v.to_string()),
            opt(x.disk_bytes.map(|v| v as f64 / 1048576.0), 1),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_utime_plus_stime_whatever_the_command_name() {
        // Fields 14 and 15 (utime 7, stime 5); the name holds ") (" and spaces.
        let line = "42 (a) (b c) S 1 2 3 4 5 6 7 8 9 10 7 5 0 0 20 0 1 0 100 4096 10";
        assert_eq!(cpu_ticks(line), Some(12));
        assert_eq!(cpu_ticks("42 (truncated) S 1 2"), None);
        // This process: its CPU time grows while it computes.
        let pid = std::process::id();
        let start = cpu_seconds(pid).expect("own /proc/PID/stat");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut x = 0u64;
        while cpu_seconds(pid).expect("own stat") <= start {
            assert!(std::time::Instant::now() < deadline, "CPU time never grew");
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
    }

    #[test]
    fn ticks_stay_inside_the_run() {
        assert!(in_run(15.0, 8, Some(120.0)));
        assert!(!in_run(15.0, 9, Some(120.0)));
        assert!(in_run(15.0, 1000, None));
    }

    #[test]
    fn reads_this_process_and_a_directory() {
        let me = std::process::id();
        assert!(rss_kib(me).is_some_and(|v| v > 0));
        assert!(open_fds(me).is_some_and(|v| v > 0));
        let dir = std::env::temp_dir().join(format!("sluice-bench-sample-{me}"));
        std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
        std::fs::write(dir.join("sub/f"), vec![1u8; 10_000]).expect("write");
        let bytes = allocated_bytes(&dir);
        std::fs::remove_dir_all(&dir).ok();
        assert!(bytes.is_some_and(|b| b >= 8192), "{bytes:?}");
        assert!(allocated_bytes(Path::new("/nonexistent/sluice")).is_none());
    }

    #[test]
    fn an_interval_is_the_difference_of_two_copies() {
        let mut h = histogram();
        h.record(1000).expect("record");
        let prev = h.clone();
        h.record(5000).expect("record");
        h.record(7000).expect("record");
        let iv = since(&h, &prev);
        assert_eq!(iv.len(), 2);
        assert!(iv.min() >= 4990);
    }
}
