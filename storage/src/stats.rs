//! Latency histograms of the storage layer, read by the broker's metrics endpoint.
//!
//! A [`Histogram`] is a fixed array of atomic counters (Relaxed): recording one value is
//! a few uncontended atomic adds, and a reader sums a consistent-enough copy without any
//! lock. Its buckets are the Prometheus convention for request latencies, in seconds.
//!
//! [`FSYNC`] is process-wide: an `fdatasync` costs far more than an atomic add shared
//! between the shards, so one histogram for every shard is no measurable cost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in microseconds (the `+Inf` bucket is implicit):
/// 50 µs to 10 s, roughly ×2.5 apart.
pub const BUCKET_BOUNDS_US: [u64; 16] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 10_000_000,
];

/// A fixed-bucket latency histogram. `buckets[i]` counts values `<=` bound `i` (and `>`
/// bound `i-1`); the last counts the values above every bound.
pub struct Histogram {
    buckets: [AtomicU64; BUCKET_BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
}

/// A copy of a [`Histogram`]'s counters (non-cumulative), summable across shards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    pub buckets: [u64; BUCKET_BOUNDS_US.len() + 1],
    pub sum_us: u64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.sum_us += other.sum_us;
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub const fn new() -> Histogram {
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicU64 = AtomicU64::new(0);
        Histogram {
            buckets: [ZERO; BUCKET_BOUNDS_US.len() + 1],
            sum_us: AtomicU64::new(0),
        }
    }

    pub fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = BUCKET_BOUNDS_US.partition_point(|&b| b < us);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut s = HistogramSnapshot {
            sum_us: self.sum_us.load(Ordering::Relaxed),
            ..Default::default()
        };
        for (d, b) in s.buckets.iter_mut().zip(self.buckets.iter()) {
            *d = b.load(Ordering::Relaxed);
        }
        s
    }
}

/// Every `fdatasync` of a partition's append file (segments: group-committed syncs),
/// and every shared `syncfs` round that stood in for many of them.
pub static FSYNC: Histogram = Histogram::new();

/// Shared `syncfs` rounds run (each also counted once in [`FSYNC`]) and the file syncs
/// they stood in for: with thousands of partitions flushing at once, a shard syncs
/// their file system once per round instead of each file.
pub static FS_SYNC_ROUNDS: AtomicU64 = AtomicU64::new(0);
pub static FS_SYNC_FILES: AtomicU64 = AtomicU64::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_whose_bound_covers_them() {
        let h = Histogram::new();
        h.record(Duration::from_micros(50)); // bucket 0 (<= 50)
        h.record(Duration::from_micros(51)); // bucket 1 (<= 100)
        h.record(Duration::from_secs(60)); // +Inf
        let s = h.snapshot();
        assert_eq!(s.buckets[0], 1);
        assert_eq!(s.buckets[1], 1);
        assert_eq!(s.buckets[BUCKET_BOUNDS_US.len()], 1);
        assert_eq!(s.count(), 3);
        assert_eq!(s.sum_us, 50 + 51 + 60_000_000);
    }
}
