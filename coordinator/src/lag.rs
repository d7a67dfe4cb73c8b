//! Consumer-lag evaluation with Burrow's rules, as a pure state machine: the broker's
//! lag sampler feeds each partition's committed offset, commit time and end offset in
//! (with the time), and reads a status back. No I/O, no clock.
//!
//! Each partition keeps two sliding windows of `window` entries (Burrow's `intervals`,
//! 10 by default):
//! - commits: (committed offset, commit time, lag when it was seen). A new entry is
//!   added when a new commit is seen (its commit time changed, even if the offset did
//!   not: that is how STALL is seen); a commit less than `min_distance_ms` after the
//!   previous entry replaces it instead (Burrow's `min-distance`).
//! - end offsets: the partition's end offset at each sample (Burrow's broker offsets),
//!   and the lag at each sample (for the trend).
//!
//! The status of a partition (Burrow's evaluator, in its order):
//! 1. current lag 0: OK.
//! 2. STOP: the time since the last commit exceeds the time the window spans (last
//!    commit − first commit), unless an end offset sampled in the window was at or below
//!    the last committed offset (the group was caught up recently).
//! 3. If some commit in the window had lag 0: OK. Otherwise:
//!    REWIND if the committed offset ever went back; STALL if every commit in the window
//!    has the same offset; WARN if the lag never decreased from one commit to the next.
//! 4. OK.
//!
//! A group's status is its worst partition's, with STOP/STALL/REWIND reported as ERR
//! (Burrow's group status); `complete` is the fraction of partitions whose commit window
//! is full.

use std::collections::VecDeque;

/// Burrow's statuses, in increasing severity (the order `max` uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    Ok,
    Warn,
    Err,
    Stop,
    Stall,
    Rewind,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Err => "ERR",
            Status::Stop => "STOP",
            Status::Stall => "STALL",
            Status::Rewind => "REWIND",
        }
    }

    /// Parses a status name (case-insensitive; `WARNING` and `ERROR` too).
    pub fn parse(s: &str) -> Option<Status> {
        Some(match s.to_ascii_uppercase().as_str() {
            "OK" => Status::Ok,
            "WARN" | "WARNING" => Status::Warn,
            "ERR" | "ERROR" => Status::Err,
            "STOP" => Status::Stop,
            "STALL" => Status::Stall,
            "REWIND" => Status::Rewind,
            _ => return None,
        })
    }

    /// A group reports its worst partition, with anything worse than ERR as ERR.
    pub fn as_group(self) -> Status {
        self.min(Status::Err)
    }

    /// A number for gauges: 0 OK, 1 WARN, 2 ERR, 3 STOP, 4 STALL, 5 REWIND.
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// Whether the lag went up, down, or stayed over the sampled window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trend {
    Up,
    Down,
    Flat,
}

impl Trend {
    pub fn name(self) -> &'static str {
        match self {
            Trend::Up => "up",
            Trend::Down => "down",
            Trend::Flat => "flat",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LagConfig {
    /// Entries per window (Burrow's `intervals`).
    pub window: usize,
    /// A commit closer than this to the previous entry replaces it.
    pub min_distance_ms: i64,
}

impl Default for LagConfig {
    fn default() -> Self {
        LagConfig {
            window: 10,
            min_distance_ms: 1_000,
        }
    }
}

/// One commit as the window keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitEntry {
    pub offset: i64,
    pub timestamp_ms: i64,
    /// End offset minus the committed offset when the commit was seen.
    pub lag: i64,
}

/// One partition's windows.
#[derive(Debug, Clone, Default)]
pub struct PartitionWindow {
    commits: VecDeque<CommitEntry>,
    /// End offsets sampled, oldest first.
    ends: VecDeque<i64>,
    /// Lag at each sample, oldest first.
    lags: VecDeque<i64>,
}

/// What the evaluation says about one partition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartitionEval {
    pub status: Status,
    pub lag: i64,
    /// Filled entries / window size of the commit window.
    pub complete: f64,
    pub trend: Trend,
}

fn push_bounded<T>(q: &mut VecDeque<T>, v: T, max: usize) {
    q.push_back(v);
    while q.len() > max.max(1) {
        q.pop_front();
    }
}

impl PartitionWindow {
    /// One sample: the committed offset and its commit time, and the partition's end
    /// offset (the high watermark, or the last stable offset for a read_committed
    /// view) now.
    pub fn observe(&mut self, cfg: &LagConfig, offset: i64, commit_ms: i64, end: i64) {
        let lag = (end - offset).max(0);
        push_bounded(&mut self.ends, end, cfg.window);
        push_bounded(&mut self.lags, lag, cfg.window);
        let entry = CommitEntry {
            offset,
            timestamp_ms: commit_ms,
            lag,
        };
        match self.commits.back_mut() {
            Some(last) if last.timestamp_ms == commit_ms && last.offset == offset => {}
            Some(last) if commit_ms - last.timestamp_ms < cfg.min_distance_ms => *last = entry,
            _ => push_bounded(&mut self.commits, entry, cfg.window),
        }
    }

    pub fn commits(&self) -> impl Iterator<Item = &CommitEntry> {
        self.commits.iter()
    }

    /// The partition's status at `now_ms` given its current lag.
    pub fn evaluate(&self, cfg: &LagConfig, now_ms: i64) -> PartitionEval {
        let lag = self.lags.back().copied().unwrap_or(0);
        let complete = self.commits.len() as f64 / cfg.window.max(1) as f64;
        let trend = match (self.lags.front(), self.lags.back()) {
            (Some(a), Some(b)) if b > a => Trend::Up,
            (Some(a), Some(b)) if b < a => Trend::Down,
            _ => Trend::Flat,
        };
        PartitionEval {
            status: self.status(lag, now_ms),
            lag,
            complete: complete.min(1.0),
            trend,
        }
    }

    fn status(&self, lag: i64, now_ms: i64) -> Status {
        let c: Vec<&CommitEntry> = self.commits.iter().collect();
        let (Some(first), Some(last)) = (c.first(), c.last()) else {
            return Status::Ok;
        };
        if lag <= 0 {
            return Status::Ok;
        }
        let stopped = now_ms - last.timestamp_ms > last.timestamp_ms - first.timestamp_ms;
        let recently_caught_up = self.ends.iter().any(|&e| e <= last.offset);
        if stopped && !recently_caught_up {
            return Status::Stop;
        }
        if c.iter().any(|e| e.lag == 0) {
            return Status::Ok;
        }
        let pairs = || c.windows(2).map(|w| (w[0], w[1]));
        if pairs().any(|(a, b)| b.offset < a.offset) {
            Status::Rewind
        } else if pairs().all(|(a, b)| b.offset == a.offset) {
            Status::Stall
        } else if pairs().all(|(a, b)| b.lag >= a.lag) {
            Status::Warn
        } else {
            Status::Ok
        }
    }
}

/// A group's status and completeness from its partitions' evaluations.
pub fn group_status<'a>(parts: impl IntoIterator<Item = &'a PartitionEval>) -> (Status, f64) {
    let (mut worst, mut n, mut full) = (Status::Ok, 0usize, 0usize);
    for p in parts {
        worst = worst.max(p.status);
        n += 1;
        if p.complete >= 1.0 {
            full += 1;
        }
    }
    let complete = if n == 0 { 0.0 } else { full as f64 / n as f64 };
    (worst.as_group(), complete)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: LagConfig = LagConfig {
        window: 10,
        min_distance_ms: 1_000,
    };

    /// Feeds (offset, commit time, end) samples.
    fn window(samples: &[(i64, i64, i64)]) -> PartitionWindow {
        let mut w = PartitionWindow::default();
        for &(o, t, e) in samples {
            w.observe(&CFG, o, t, e);
        }
        w
    }

    #[test]
    fn caught_up_is_ok_even_if_old() {
        let w = window(&[(100, 1_000, 100)]);
        let e = w.evaluate(&CFG, 1_000_000);
        assert_eq!(e.status, Status::Ok);
        assert_eq!(e.lag, 0);
    }

    #[test]
    fn no_commit_since_the_window_span_with_lag_is_stop() {
        // Commits every 10 s, then none for 100 s while producers write.
        let w = window(&[(10, 10_000, 35), (20, 20_000, 45), (30, 30_000, 55)]);
        assert_eq!(w.evaluate(&CFG, 45_000).status, Status::Warn);
        assert_eq!(w.evaluate(&CFG, 60_001).status, Status::Stop);
    }

    #[test]
    fn stop_is_not_reported_if_an_end_sample_was_caught_up() {
        // The end was at the committed offset in a recent sample: not stopped yet.
        let w = window(&[(30, 30_000, 30), (30, 30_000, 35)]);
        assert_eq!(w.evaluate(&CFG, 90_000).status, Status::Ok);
    }

    #[test]
    fn committing_the_same_offset_behind_is_stall() {
        let w = window(&[(5, 1_000, 50), (5, 3_000, 50), (5, 5_000, 50)]);
        assert_eq!(w.commits().count(), 3);
        assert_eq!(w.evaluate(&CFG, 5_500).status, Status::Stall);
        assert_eq!(Status::Stall.as_group(), Status::Err);
    }

    #[test]
    fn offsets_going_back_is_rewind() {
        let w = window(&[(50, 1_000, 60), (40, 3_000, 60), (45, 5_000, 60)]);
        assert_eq!(w.evaluate(&CFG, 5_500).status, Status::Rewind);
    }

    #[test]
    fn moving_with_growing_lag_is_warn_and_shrinking_lag_is_ok() {
        let growing = window(&[(10, 1_000, 20), (20, 3_000, 35), (30, 5_000, 50)]);
        let e = growing.evaluate(&CFG, 5_500);
        assert_eq!(e.status, Status::Warn);
        assert_eq!(e.trend, Trend::Up);
        let shrinking = window(&[(10, 1_000, 50), (30, 3_000, 55), (50, 5_000, 56)]);
        let e = shrinking.evaluate(&CFG, 5_500);
        assert_eq!(e.status, Status::Ok);
        assert_eq!(e.trend, Trend::Down);
    }

    #[test]
    fn a_zero_lag_commit_in_the_window_makes_it_ok() {
        let w = window(&[(10, 1_000, 10), (10, 3_000, 20), (10, 5_000, 30)]);
        assert_eq!(w.evaluate(&CFG, 5_500).status, Status::Ok);
    }

    #[test]
    fn close_commits_replace_the_last_entry_and_the_window_is_bounded() {
        let w = window(&[(1, 1_000, 9), (2, 1_500, 9)]);
        let c: Vec<_> = w.commits().copied().collect();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].offset, 2);
        let many: Vec<_> = (0..25).map(|i| (i, i * 2_000, 100)).collect();
        let w = window(&many);
        assert_eq!(w.commits().count(), 10);
        assert_eq!(w.evaluate(&CFG, 50_000).complete, 1.0);
        // The same commit seen again by the next sample adds nothing.
        let w = window(&[(7, 1_000, 9), (7, 1_000, 12)]);
        assert_eq!(w.commits().count(), 1);
        assert!((w.evaluate(&CFG, 1_000).complete - 0.1).abs() < 1e-9);
    }

    #[test]
    fn group_is_its_worst_partition_capped_at_err_with_completeness() {
        let ok = PartitionEval {
            status: Status::Ok,
            lag: 0,
            complete: 1.0,
            trend: Trend::Flat,
        };
        let warn = PartitionEval {
            status: Status::Warn,
            complete: 0.5,
            ..ok
        };
        let stop = PartitionEval {
            status: Status::Stop,
            ..ok
        };
        assert_eq!(group_status([&ok, &warn]), (Status::Warn, 0.5));
        assert_eq!(group_status([&ok, &warn, &stop]).0, Status::Err);
        assert_eq!(group_status([]), (Status::Ok, 0.0));
    }

    #[test]
    fn status_names_round_trip() {
        for s in [
            Status::Ok,
            Status::Warn,
            Status::Err,
            Status::Stop,
            Status::Stall,
            Status::Rewind,
        ] {
            assert_eq!(Status::parse(s.name()), Some(s));
        }
        assert_eq!(Status::parse("warning"), Some(Status::Warn));
        assert_eq!(Status::parse("bad"), None);
    }
}
