//! What the coordinator shells (groups, transactions) share: the frame a coordinator
//! runs in on its shard, around its pure state machine. A shell keeps, per internal
//! topic partition it coordinates, whether that partition is loaded ([`Loads`]: one
//! load at a time, each partition replayed once per leadership); requests whose answer
//! the state machine defers wait by token ([`Tokens`], [`Waiters`]) and get
//! NOT_COORDINATOR if the partition moves away meanwhile ([`answer`]).
//!
//! Both write their records through a [`PartitionWriter`]: one append at a time, one
//! batch each, durable on every in-sync replica before the answer.
//!
//! Each ticks its timers with [`every`].
//!
//! Still per shell (a further step of issue 39): the replay of its records.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::rc::{Rc, Weak};
use std::time::Duration;

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::sync::{Permit, Semaphore};
use kafka_protocol::error::ResponseError;

use crate::base::error::ApiError;
use crate::base::util::{mark_transactional, now_ms};
use crate::partition::broker::Broker;
use sluice_storage::batch::build::{batch_nullable, NullableRecord};

/// Token numbers for deferred answers, never reused on this shard (they only grow).
pub struct Tokens(Cell<u64>);

impl Tokens {
    pub fn new() -> Tokens {
        Tokens(Cell::new(1))
    }

    pub fn next(&self) -> u64 {
        let token = self.0.get();
        self.0.set(token + 1);
        token
    }
}

impl Default for Tokens {
    fn default() -> Tokens {
        Tokens::new()
    }
}

/// Requests waiting for a deferred answer of one kind, by that kind's token type (so a
/// waiter can only receive its own answer type): what the shell keeps with each (`T`,
/// e.g. the group a JoinGroup waits in) and where the answer goes.
pub struct Waiters<K, R, T = ()> {
    map: RefCell<HashMap<K, (T, LocalSender<R>)>>,
}

impl<K: Hash + Eq + Debug, R, T> Waiters<K, R, T> {
    pub fn new() -> Waiters<K, R, T> {
        Waiters {
            map: RefCell::new(HashMap::new()),
        }
    }

    /// Registers a waiter for `token`'s answer; await it with [`answer`].
    pub fn register(&self, token: K, tag: T) -> LocalReceiver<R> {
        let (tx, rx) = local_channel::new_bounded(1);
        let old = self.map.borrow_mut().insert(token, (tag, tx));
        assert!(old.is_none(), "waiter token reused: tokens only grow");
        rx
    }

    /// Sends a deferred answer to its waiter, if it still waits.
    pub fn deliver(&self, token: &K, reply: R) {
        if let Some((_, tx)) = self.map.borrow_mut().remove(token) {
            // The requester may have gone (connection closed): nothing to do.
            let _ = tx.try_send(reply);
        }
    }

    /// What the shell keeps with `token`'s waiter, if it waits.
    pub fn tag(&self, token: &K) -> Option<T>
    where
        T: Clone,
    {
        self.map.borrow().get(token).map(|(tag, _)| tag.clone())
    }

    /// Keeps only the waiters whose tag `keep` accepts; the others' requests end with
    /// NOT_COORDINATOR ([`answer`]).
    pub fn retain(&self, mut keep: impl FnMut(&T) -> bool) {
        self.map.borrow_mut().retain(|_, (tag, _)| keep(tag));
    }
}

impl<K: Hash + Eq + Debug, R, T> Default for Waiters<K, R, T> {
    fn default() -> Self {
        Waiters::new()
    }
}

/// The deferred answer of a registered waiter. Its waiter dropped (the partition moved
/// to another coordinator while the request waited): NOT_COORDINATOR, and the client
/// finds the new one and retries.
pub async fn answer<R>(rx: LocalReceiver<R>) -> Result<R, ApiError> {
    rx.recv()
        .await
        .ok_or_else(|| ApiError::new(ResponseError::NotCoordinator))
}

/// The partitions of the shell's internal topic loaded on this shard, and the lock that
/// runs their loads one at a time.
pub struct Loads {
    topic: &'static str,
    loaded: RefCell<HashSet<i32>>,
    lock: Semaphore,
}

/// A load's turn (see [`Loads::turn`]): holds the load lock until it is dropped.
pub struct LoadTurn<'a> {
    loads: &'a Loads,
    partition: i32,
    _permit: Permit<'a>,
}

impl Loads {
    pub fn new(topic: &'static str) -> Loads {
        Loads {
            topic,
            loaded: RefCell::new(HashSet::new()),
            lock: Semaphore::new(1),
        }
    }

    pub fn is_loaded(&self, partition: i32) -> bool {
        self.loaded.borrow().contains(&partition)
    }

    /// Forgets `partition` (its leadership changed here); true if it was loaded.
    pub fn forget(&self, partition: i32) -> bool {
        self.loaded.borrow_mut().remove(&partition)
    }

    /// `None` if `partition` is loaded; else the turn to load it, once every earlier
    /// load has ended and the partition is still not loaded. The load marks it with
    /// [`LoadTurn::done`]; a turn dropped without it (a failed load) leaves it to the
    /// next request.
    pub async fn turn(&self, partition: i32) -> Option<LoadTurn<'_>> {
        if self.is_loaded(partition) {
            return None;
        }
        let permit = self
            .lock
            .acquire_permit(1)
            .await
            .expect("load lock never closes");
        if self.is_loaded(partition) {
            return None;
        }
        Some(LoadTurn {
            loads: self,
            partition,
            _permit: permit,
        })
    }
}

impl LoadTurn<'_> {
    /// The partition is loaded (the lock is released when the turn is dropped).
    pub fn done(&self) {
        let fresh = self.loads.loaded.borrow_mut().insert(self.partition);
        // Loads run one at a time, each after checking the partition is not loaded;
        // only a load inserts.
        assert!(
            fresh,
            "{} partition {} was loaded twice",
            self.loads.topic, self.partition
        );
    }
}

/// A shell's writer to its internal topic: one append at a time, so records reach the
/// log in the order the coordinator produced them; each append is one batch and waits
/// for every in-sync replica (as Kafka's required acks -1 for both internal topics).
pub struct PartitionWriter {
    topic: &'static str,
    lock: Semaphore,
}

impl PartitionWriter {
    pub fn new(topic: &'static str) -> PartitionWriter {
        PartitionWriter {
            topic,
            lock: Semaphore::new(1),
        }
    }

    /// Appends `records` (key, value or tombstone) to `partition` as one batch,
    /// transactional for `producer` if given, once its turn comes and `still_valid`
    /// (checked then, just before the write) allows it.
    pub async fn append(
        &self,
        broker: &Broker,
        partition: i32,
        records: &[NullableRecord<'_>],
        producer: Option<(i64, i16)>,
        still_valid: impl FnOnce() -> Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        let _turn = self
            .lock
            .acquire_permit(1)
            .await
            .expect("append lock never closes");
        still_valid()?;
        let mut batch = batch_nullable(now_ms(), records);
        if let Some((producer_id, epoch)) = producer {
            mark_transactional(&mut batch, producer_id, epoch);
        }
        broker
            .append_replicated(self.topic, partition, bytes::Bytes::from(batch))
            .await
    }
}

/// Runs `turn` every `period` on this shard while both the broker and the shell live:
/// the ticker ends once either is dropped (the shard is stopping).
pub fn every<S, F, Fut>(period: Duration, broker: &Rc<Broker>, shell: &Rc<S>, turn: F)
where
    S: 'static,
    F: Fn(Rc<Broker>, Rc<S>) -> Fut + 'static,
    Fut: Future<Output = ()>,
{
    let (b, st): (Weak<Broker>, Weak<S>) = (Rc::downgrade(broker), Rc::downgrade(shell));
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(period).await;
            let (Some(b), Some(st)) = (b.upgrade(), st.upgrade()) else {
                return;
            };
            turn(b, st).await;
        }
    })
    .detach();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grow_and_waiters_get_their_answer_or_not_coordinator() {
        sluice_shard::run_unpinned("coord-runtime-test", 8 << 20, || {
            Box::pin(async {
                let tokens = Tokens::new();
                let (a, b) = (tokens.next(), tokens.next());
                assert!(b > a);
                let w: Waiters<u64, &str, &str> = Waiters::new();
                let ra = w.register(a, "g1");
                let rb = w.register(b, "g2");
                assert_eq!(w.tag(&a), Some("g1"));
                w.deliver(&a, "joined");
                assert_eq!(answer(ra).await.unwrap(), "joined");
                w.retain(|g| *g != "g2");
                assert_eq!(
                    answer(rb).await.unwrap_err().code,
                    ResponseError::NotCoordinator
                );
                let loads = Loads::new("t");
                let turn = loads.turn(3).await.expect("not loaded yet");
                turn.done();
                drop(turn);
                assert!(loads.turn(3).await.is_none());
                assert!(loads.forget(3) && !loads.forget(3));
                assert!(loads.turn(3).await.is_some());
            })
        });
    }
}
