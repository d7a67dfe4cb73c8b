//! One shard's change feed: which of its partitions may answer a fetch differently
//! than before, in the order they changed.
//!
//! A follower's fetch session names every partition it follows from this broker —
//! thousands at the design's size — and most of them have nothing new in any one
//! round. Reading them all each round (as Kafka does) made the fetch handler the
//! largest cost of a replicated 10,000-partition cluster. Instead a large session keeps
//! a position in each shard's feed and reads only the partitions that changed since
//! (with the ones its request lists, and the ones whose last answer left something to
//! say: see `crate::base::fetch_session`).
//!
//! A partition changes when its log does (an append as soon as it has its offsets, a
//! truncation, a move of its log start, a failure: [`PartitionLog::set_on_change`]),
//! when its replica notifies progress (high watermark, role, leader epoch, ISR), and
//! when it comes or goes on this shard. A reader sees each partition once, at its
//! latest change. A change costs an entry at the end of a log, by the partition's
//! number (its earlier entry goes stale; stale entries are dropped in bulk), and a
//! position never becomes too old to read from. The feed records nothing until it is
//! first read (a broker with no large follower session, as a single broker, pays one
//! counter per change); a position from before that reads as unknown: the reader
//! reads everything.
//!
//! [`PartitionLog::set_on_change`]: sluice_storage::log::PartitionLog::set_on_change

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use foldhash::HashMap;
use std::sync::Arc;
use std::time::Duration;

use event_listener::Event;

/// A partition as the feed names it.
pub type Key = (Arc<str>, i32);

/// A partition as the feed numbers it ([`ChangeFeed::id`]): a change by number costs no
/// hashing or comparing of the topic name (every append and high-watermark move of
/// every hosted partition is one).
pub type Id = u32;

#[derive(Default)]
pub struct ChangeFeed {
    /// The position of the latest change (0: none yet).
    seq: Cell<u64>,
    /// The position recording began at (`None`: not read yet, nothing recorded).
    start: Cell<Option<u64>>,
    /// Every partition numbered so far, by number, with its latest recorded change
    /// (0: none).
    parts: RefCell<Vec<(Key, u64)>>,
    /// Each numbered partition's number.
    ids: RefCell<HashMap<Key, Id>>,
    /// The recorded changes in position order, each a partition's number. An entry
    /// whose partition changed again later is stale: readers skip it, and the stale
    /// ones are dropped once they outnumber the live ones.
    order: RefCell<VecDeque<(u64, Id)>>,
    /// Partitions with a recorded change (the live entries of `order`).
    recorded: Cell<usize>,
    /// Fires on every change.
    event: Event,
}

impl ChangeFeed {
    /// The position of the latest change: a reader at this position has seen
    /// everything so far.
    pub fn position(&self) -> u64 {
        self.seq.get()
    }

    /// The number of `topic`-`partition`, given it the first time (a partition keeps
    /// its number while the feed lives, hosted again or not).
    pub fn id(&self, topic: &Arc<str>, partition: i32) -> Id {
        let key = (topic.clone(), partition);
        if let Some(id) = self.ids.borrow().get(&key) {
            return *id;
        }
        let mut parts = self.parts.borrow_mut();
        let id = Id::try_from(parts.len()).expect("fewer than 2^32 partitions");
        parts.push((key.clone(), 0));
        self.ids.borrow_mut().insert(key, id);
        id
    }

    /// Notes a change of `topic`-`partition`.
    pub fn changed(&self, topic: &Arc<str>, partition: i32) {
        let id = self.id(topic, partition);
        self.changed_id(id);
    }

    /// Notes a change of the partition numbered `id` ([`Self::id`]).
    pub fn changed_id(&self, id: Id) {
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        if self.start.get().is_none() {
            self.event.notify(usize::MAX);
            return;
        }
        let mut parts = self.parts.borrow_mut();
        if std::mem::replace(&mut parts[id as usize].1, seq) == 0 {
            self.recorded.set(self.recorded.get() + 1);
        }
        let mut order = self.order.borrow_mut();
        order.push_back((seq, id));
        if order.len() > 2 * self.recorded.get() + 64 {
            order.retain(|(at, id)| parts[*id as usize].1 == *at);
            assert_eq!(order.len(), self.recorded.get(), "change feed out of step");
        }
        drop((order, parts));
        self.event.notify(usize::MAX);
    }

    /// The partitions changed after position `since`, each once, and the position
    /// they bring the reader to; `None` if the feed cannot say (it was not recording
    /// then). `u64::MAX` asks for the position alone (and starts the recording).
    pub fn since(&self, since: u64) -> (u64, Option<Vec<Key>>) {
        let seq = self.seq.get();
        let start = match self.start.get() {
            Some(start) => start,
            None => {
                self.start.set(Some(seq));
                seq
            }
        };
        if since == u64::MAX {
            return (seq, Some(Vec::new()));
        }
        if since < start {
            return (seq, None);
        }
        let numbered = self.parts.borrow();
        let order = self.order.borrow();
        let from = order.partition_point(|(at, _)| *at <= since);
        let parts = order
            .range(from..)
            .filter_map(|(at, id)| {
                let (key, latest) = &numbered[*id as usize];
                (latest == at).then(|| key.clone())
            })
            .collect();
        (seq, Some(parts))
    }

    /// Waits until something changes after position `since`, or `timeout` (then
    /// false).
    pub async fn wait_past(&self, since: u64, timeout: Duration) -> bool {
        let moved: Box<dyn Fn() -> bool + '_> = Box::new(move || self.seq.get() > since);
        crate::base::util::wait_any(vec![(&self.event, moved)], timeout).await
    }

    /// Partitions whose changes the feed has recorded (each one hosted on the shard at
    /// some time).
    pub fn len(&self) -> usize {
        self.recorded.get()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_sees_each_changed_partition_once_from_its_position() {
        let feed = ChangeFeed::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        // Nothing recorded before the first read: a change then is unknown to a reader
        // at an older position.
        feed.changed(&a, 9);
        assert_eq!(feed.len(), 0);
        assert_eq!(feed.since(u64::MAX), (1, Some(vec![])));
        assert_eq!(feed.since(0), (1, None));
        assert_eq!(feed.since(1), (1, Some(vec![])));
        feed.changed(&a, 0);
        feed.changed(&b, 1);
        feed.changed(&a, 0);
        let (pos, parts) = feed.since(1);
        assert_eq!(pos, 4);
        assert_eq!(
            parts.unwrap(),
            vec![(Arc::from("b"), 1), (Arc::from("a"), 0)]
        );
        // From the position a reader had after the first change: both again (a changed
        // since), in the order of their latest change.
        assert_eq!(feed.since(2).1.unwrap().len(), 2);
        assert_eq!(feed.since(4), (4, Some(vec![])));
        feed.changed(&b, 2);
        assert_eq!(feed.since(pos), (5, Some(vec![(Arc::from("b"), 2)])));
        assert_eq!(feed.len(), 3);
    }

    #[test]
    fn a_partition_keeps_its_number_and_changes_by_it_as_by_name() {
        let feed = ChangeFeed::default();
        let a: Arc<str> = "a".into();
        let id = feed.id(&a, 0);
        assert_eq!(feed.id(&Arc::from("a"), 0), id);
        assert_ne!(feed.id(&a, 1), id);
        assert_eq!(feed.since(u64::MAX), (0, Some(vec![])));
        feed.changed_id(id);
        feed.changed(&a, 0);
        assert_eq!(feed.since(0), (2, Some(vec![(a.clone(), 0)])));
        assert_eq!(feed.len(), 1);
    }

    #[test]
    fn stale_entries_are_dropped_and_positions_still_read_right() {
        let feed = ChangeFeed::default();
        let t: Arc<str> = "t".into();
        let ids: Vec<Id> = (0..3).map(|p| feed.id(&t, p)).collect();
        feed.since(u64::MAX);
        // Many more changes than partitions: the log is compacted several times.
        for round in 0..100u64 {
            for id in &ids {
                feed.changed_id(*id);
            }
            let at = feed.position();
            assert_eq!(at, (round + 1) * 3);
            // From just before the last partition's change: only that one.
            assert_eq!(feed.since(at - 1), (at, Some(vec![(t.clone(), 2)])));
        }
        assert!(feed.order.borrow().len() <= 2 * 3 + 64);
        let at = feed.position();
        feed.changed_id(ids[0]);
        assert_eq!(
            feed.since(at - 3),
            (
                at + 1,
                Some(vec![(t.clone(), 1), (t.clone(), 2), (t.clone(), 0)])
            )
        );
        assert_eq!(feed.len(), 3);
    }

    #[test]
    fn a_wait_ends_at_a_change_or_its_timeout() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let feed = std::rc::Rc::new(ChangeFeed::default());
                let t: Arc<str> = "t".into();
                assert!(!feed.wait_past(0, Duration::from_millis(5)).await);
                feed.changed(&t, 0);
                // Already past: at once.
                assert!(feed.wait_past(0, Duration::from_secs(60)).await);
                let f = feed.clone();
                let waiter =
                    glommio::spawn_local(
                        async move { f.wait_past(1, Duration::from_secs(60)).await },
                    );
                glommio::yield_if_needed().await;
                glommio::timer::sleep(Duration::from_millis(1)).await;
                feed.changed(&t, 1);
                assert!(waiter.await);
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
