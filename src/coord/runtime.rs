//! What the coordinator shells (groups, transactions) share: the frame a coordinator
//! runs in on its shard, around its pure state machine. Each shell holds one
//! [`Runtime`]: the loads of its internal topic's partitions, its writer to that topic,
//! its token numbers and its clock.
//!
//! Loads ([`Runtime::load`]): a partition is replayed from its log start to its end
//! into the coordinator, once per leadership and one load at a time ([`Loads`]); the
//! shell says how through [`Replay`] (how a load begins, how one record is applied,
//! what the coordinator does once every record is in).
//!
//! Requests whose answer the state machine defers wait by token ([`Tokens`],
//! [`Waiters`]) and get NOT_COORDINATOR if the partition moves away meanwhile
//! ([`answer`]).
//!
//! Both write their records through a [`PartitionWriter`]: one append at a time, one
//! batch each, durable on every in-sync replica before the answer.
//!
//! Time: the coordinators are pure and take the time as an argument; the shells read
//! it from their runtime's clock ([`Runtime::now_ms`]) and nowhere else, so a test can
//! hand a runtime a clock it drives.
//!
//! Each ticks its timers with [`every`].

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::fmt::{Debug, Display};
use std::future::Future;
use std::hash::Hash;
use std::rc::{Rc, Weak};
use std::time::Duration;

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::sync::{Permit, Semaphore};
use kafka_protocol::error::ResponseError;
use kafka_protocol::records::Record;

use crate::base::error::ApiError;
use crate::base::util::mark_transactional;
use crate::partition::broker::Broker;
use sluice_storage::batch::build::{batch_nullable, NullableRecord};
use sluice_storage::Clock;

/// One coordinator shell's frame on its shard: the loads of its internal topic's
/// partitions, its writer to that topic, its token numbers, and the clock it reads the
/// time from.
pub struct Runtime {
    loads: Loads,
    writer: PartitionWriter,
    tokens: Tokens,
    // Wall-clock time: the coordinators store timestamps (commits, transaction
    // starts) and compare them across restarts.
    clock: Rc<dyn Clock>,
}

/// A shell's part in loading a partition of its internal topic ([`Runtime::load`]):
/// how a load begins, how one record is applied to the coordinator, and what the
/// coordinator does once every record is in.
#[allow(async_fn_in_trait)]
pub trait Replay {
    /// What a load carries from its start to its end.
    type Load;
    /// What the coordinator asks for once the partition is loaded.
    type Effects;
    /// Why a record is skipped.
    type Skip: Display;

    /// A load of `partition` begins, at `now_ms`, before its first record. An error
    /// ends the load (the partition stays unloaded).
    fn begin(&self, broker: &Broker, partition: i32, now_ms: i64) -> Result<Self::Load, ApiError>;

    /// One record of the partition with its `key`, in log order (a record without a
    /// key is no coordinator's and is not applied). An error skips the record, as
    /// Kafka's loaders skip what they cannot read; the runtime logs it.
    fn apply(
        &self,
        load: &Self::Load,
        partition: i32,
        key: &[u8],
        record: &Record,
    ) -> Result<(), Self::Skip>;

    /// Reading the log failed part-way: what was applied is partial.
    fn abandon(&self, load: Self::Load, partition: i32);

    /// Every record is applied, at `now_ms`: the coordinator takes the partition as
    /// loaded. An error leaves it unloaded.
    fn loaded(
        &self,
        load: Self::Load,
        broker: &Broker,
        partition: i32,
        now_ms: i64,
    ) -> Result<Self::Effects, ApiError>;

    /// Runs the effects of [`Replay::loaded`].
    async fn run(&self, broker: &Broker, fx: Self::Effects);
}

impl Runtime {
    pub fn new(topic: &'static str, clock: Rc<dyn Clock>) -> Runtime {
        Runtime {
            loads: Loads::new(topic),
            writer: PartitionWriter::new(topic),
            tokens: Tokens::new(),
            clock,
        }
    }

    /// The time now, in milliseconds since the epoch: the one time source of the shell
    /// and its coordinator.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// A token number for a deferred answer ([`Tokens`]).
    pub fn next_token(&self) -> u64 {
        self.tokens.next()
    }

    pub fn is_loaded(&self, partition: i32) -> bool {
        self.loads.is_loaded(partition)
    }

    /// Forgets `partition` (its leadership changed here); true if it was loaded.
    pub fn forget(&self, partition: i32) -> bool {
        self.loads.forget(partition)
    }

    /// Loads `partition` into the shell's coordinator unless it is loaded: once its
    /// turn comes ([`Loads::turn`]), replays its log from start to end through
    /// `shell`, marks it loaded, then runs what the coordinator asked for on loading.
    /// A failed load leaves the partition unloaded, for the next request to load.
    pub async fn load<S: Replay>(
        &self,
        broker: &Broker,
        partition: i32,
        shell: &S,
    ) -> Result<(), ApiError> {
        let Some(turn) = self.loads.turn(partition).await else {
            return Ok(());
        };
        let topic = self.loads.topic;
        let load = shell.begin(broker, partition, self.now_ms())?;
        let replayed = broker
            .replay(topic, partition, |rec| {
                let Some(key) = rec.key.as_deref() else {
                    return;
                };
                if let Err(e) = shell.apply(&load, partition, key, &rec) {
                    tracing::warn!(partition, offset = rec.offset, error = %e, "skipping record");
                }
            })
            .await;
        let records = match replayed {
            Ok(n) => n,
            Err(e) => {
                shell.abandon(load, partition);
                return Err(e);
            }
        };
        let fx = shell.loaded(load, broker, partition, self.now_ms())?;
        turn.done();
        tracing::info!(partition, records, "loaded {topic} partition");
        // Run once the partition is marked loaded, so that a leadership change while
        // they run (appends wait) unloads it: `forget` only forgets a loaded partition.
        shell.run(broker, fx).await;
        Ok(())
    }

    /// Loads every partition of the shell's topic that this broker leads and whose
    /// home is this shard.
    pub async fn load_all_led<S: Replay>(
        &self,
        broker: &Broker,
        shell: &S,
    ) -> Result<(), ApiError> {
        let image = broker.image();
        let Some(meta) = image.topics.get(self.loads.topic) else {
            return Ok(());
        };
        for p in 0..meta.partitions {
            let leads = meta.assignment(p).map(|a| a.leader) == Some(broker.config.node_id);
            if leads && broker.owner(meta, p) == broker.shard {
                self.load(broker, p, shell).await?;
            }
        }
        Ok(())
    }

    /// Appends `records` to `partition` as one batch stamped now, through the shell's
    /// [`PartitionWriter`].
    pub async fn append(
        &self,
        broker: &Broker,
        partition: i32,
        records: &[NullableRecord<'_>],
        producer: Option<(i64, i16)>,
        still_valid: impl FnOnce() -> Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        self.writer
            .append(
                broker,
                &*self.clock,
                partition,
                records,
                producer,
                still_valid,
            )
            .await
    }
}

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
    /// (checked then, just before the write) allows it. The batch is stamped with
    /// `clock`'s time when it is built.
    pub async fn append(
        &self,
        broker: &Broker,
        clock: &dyn Clock,
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
        let mut batch = batch_nullable(clock.now_ms(), records);
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
                // The runtime's clock is the one it was given.
                let clock = Rc::new(sluice_storage::ManualClock(Cell::new(7)));
                let rt = Runtime::new("t", clock.clone());
                assert_eq!(rt.now_ms(), 7);
                clock.0.set(9);
                assert_eq!(rt.now_ms(), 9);
            })
        });
    }
}
