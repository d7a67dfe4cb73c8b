//! Replication throttles for partition moves, with Kafka's names: the dynamic broker
//! config `follower.replication.throttled.rate` (bytes/s, per broker) bounds what this
//! broker's followers fetch of the replicas the topic config
//! `follower.replication.throttled.replicas` lists (`partition:broker,...` or `*`),
//! while they are outside the ISR — a replica a move adds, or one catching up after an
//! outage — as Kafka's follower quota does. In-sync replicas are never slowed, so
//! acks=all producers do not wait on the throttle.
//!
//! Each shard meters its own fetchers (the broker's rate split evenly over its shards):
//! a bucket that allows a second's worth of bytes, drained at the rate; while it is
//! over, the shard's fetch requests leave the throttled partitions out, and otherwise
//! ask for at most a second's worth of each. The leader-side
//! pair (`leader.replication.throttled.*`) is accepted without effect: throttling the
//! fetching side bounds the same traffic.

use std::cell::RefCell;
use std::time::Instant;

use crate::base::ids::BrokerId;
use crate::base::metadata::MetadataImage;

/// The dynamic broker config of the follower-side rate.
pub const FOLLOWER_RATE: &str = "follower.replication.throttled.rate";
/// The dynamic broker config of the leader-side rate (accepted without effect).
pub const LEADER_RATE: &str = "leader.replication.throttled.rate";
/// The topic config listing the replicas throttled as followers.
pub const FOLLOWER_REPLICAS: &str = "follower.replication.throttled.replicas";

/// A byte meter: `level` bytes owed, paid back at `rate` per second.
#[derive(Debug)]
pub struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(now: Instant) -> Bucket {
        Bucket {
            level: 0.0,
            at: now,
        }
    }

    fn drain(&mut self, rate: f64, now: Instant) {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level - rate * secs).max(0.0);
        self.at = now;
    }

    /// More than a second's worth of bytes at `rate` is owed.
    pub fn exceeded(&mut self, rate: f64, now: Instant) -> bool {
        self.drain(rate, now);
        self.level > rate
    }

    pub fn record(&mut self, bytes: usize, rate: f64, now: Instant) {
        self.drain(rate, now);
        self.level += bytes as f64;
    }
}

thread_local! {
    /// This shard's follower meter (one per thread: a shard is a thread).
    static FOLLOWER: RefCell<Bucket> = RefCell::new(Bucket::new(Instant::now()));
}

/// This shard's share of the follower rate in bytes/s, if one is set on broker `me`
/// (a negative or unparsable value counts as none; Kafka's default is unbounded).
pub fn follower_rate(image: &MetadataImage, me: BrokerId, shards: usize) -> Option<f64> {
    let (v, _) = image.dynamic_broker_config(me, FOLLOWER_RATE)?;
    let rate = v
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|r| *r >= 0 && *r < i64::MAX)?;
    Some(rate as f64 / shards.max(1) as f64)
}

/// Whether `list` (a `*.replication.throttled.replicas` value) names broker `me`'s
/// replica of `partition`.
pub fn lists(list: &str, partition: i32, me: BrokerId) -> bool {
    let list = list.trim();
    list == "*"
        || list.split(',').any(|pair| {
            pair.split_once(':').is_some_and(|(p, b)| {
                p.trim().parse::<i32>() == Ok(partition) && b.trim().parse::<i32>() == Ok(me.get())
            })
        })
}

/// Whether broker `me`'s follower of `topic`-`partition` is throttled now: the topic
/// lists it, it is outside the ISR.
pub fn throttled(image: &MetadataImage, me: BrokerId, topic: &str, partition: i32) -> bool {
    let Some(meta) = image.topics.get(topic) else {
        return false;
    };
    let listed = meta
        .configs
        .get(FOLLOWER_REPLICAS)
        .is_some_and(|l| lists(l, partition, me));
    listed
        && meta
            .assignment(partition)
            .is_some_and(|a| !a.isr.contains(&me.get()))
}

/// Whether this shard's follower meter is over `rate`.
pub fn follower_exceeded(rate: f64) -> bool {
    FOLLOWER.with(|b| b.borrow_mut().exceeded(rate, Instant::now()))
}

/// Counts `bytes` fetched for throttled replicas on this shard's meter.
pub fn follower_fetched(bytes: usize, rate: f64) {
    FOLLOWER.with(|b| b.borrow_mut().record(bytes, rate, Instant::now()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_allows_a_seconds_worth_then_pays_back_at_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        assert!(!b.exceeded(100.0, t0));
        b.record(150, 100.0, t0);
        assert!(b.exceeded(100.0, t0));
        // Half a second later 50 bytes are paid back: 100 owed, not over.
        assert!(!b.exceeded(100.0, t0 + Duration::from_millis(500)));
        b.record(1, 100.0, t0 + Duration::from_millis(500));
        assert!(b.exceeded(100.0, t0 + Duration::from_millis(500)));
        assert!(!b.exceeded(100.0, t0 + Duration::from_secs(5)));
    }

    #[test]
    fn replica_lists_are_read_as_kafka_writes_them() {
        let me = BrokerId::new(2);
        assert!(lists("*", 7, me));
        assert!(lists("0:1, 3:2", 3, me));
        assert!(!lists("0:1,3:2", 0, me));
        assert!(!lists("", 0, me));
        assert!(!lists("3:20", 3, me));
    }
}
