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
//! when it comes or goes on this shard. Each partition is in the feed once, at its
//! latest change; a change costs a map update, and a position never becomes too old
//! to read from. The feed records nothing until it is first read (a broker with no
//! large follower session, as a single broker, pays one counter per change); a
//! position from before that reads as unknown: the reader reads everything.
//!
//! [`PartitionLog::set_on_change`]: sluice_storage::log::PartitionLog::set_on_change

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use foldhash::HashMap;
use std::sync::Arc;
use std::time::Duration;

use event_listener::Event;

/// A partition as the feed names it.
pub type Key = (Arc<str>, i32);

#[derive(Default)]
pub struct ChangeFeed {
    /// The position of the latest change (0: none yet).
    seq: Cell<u64>,
    /// The position recording began at (`None`: not read yet, nothing recorded).
    start: Cell<Option<u64>>,
    /// Each partition's latest change.
    at: RefCell<HashMap<Key, u64>>,
    /// The same, by position.
    order: RefCell<BTreeMap<u64, Key>>,
    /// Fires on every change.
    event: Event,
}

impl ChangeFeed {
    /// The position of the latest change: a reader at this position has seen
    /// everything so far.
    pub fn position(&self) -> u64 {
        self.seq.get()
    }

    /// Notes a change of `topic`-`partition`.
    pub fn changed(&self, topic: &Arc<str>, partition: i32) {
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        if self.start.get().is_none() {
            self.event.notify(usize::MAX);
            return;
        }
        let key = (topic.clone(), partition);
        let mut order = self.order.borrow_mut();
        if let Some(before) = self.at.borrow_mut().insert(key.clone(), seq) {
            order.remove(&before);
        }
        order.insert(seq, key);
        assert_eq!(
            order.len(),
            self.at.borrow().len(),
            "change feed out of step"
        );
        drop(order);
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
        let parts = self
            .order
            .borrow()
            .range(since.saturating_add(1)..)
            .map(|(_, (t, p))| (t.clone(), *p))
            .collect();
        (seq, Some(parts))
    }

    /// Waits until something changes after position `since`, or `timeout` (then
    /// false).
    pub async fn wait_past(&self, since: u64, timeout: Duration) -> bool {
        let moved: Box<dyn Fn() -> bool + '_> = Box::new(move || self.seq.get() > since);
        crate::base::util::wait_any(vec![(&self.event, moved)], timeout).await
    }

    /// Partitions the feed remembers (each one hosted on the shard at some time).
    pub fn len(&self) -> usize {
        self.at.borrow().len()
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
