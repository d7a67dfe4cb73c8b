//! The I/O shell of ISR replication on a partition's home shard.
//!
//! A [`Replica`] wraps a partition's log with its [`ReplicaState`]
//! (`sluice_replication::isr`): the role from the committed metadata, the leader-epoch
//! history, the durable log end and the high watermark. Every decision is the state
//! machine's (and so runs in `make sim`); this shell does the I/O and feeds its results
//! back:
//! - **leader**: an [`isr::Leader`] tracks each follower's durable log end (their fetch
//!   offsets), computes the high watermark over the maximal ISR, proposes ISR shrinks
//!   (a periodic check) and expansions (on fetches) to the controller, and answers
//!   `acks=all` produces once the high watermark covers them;
//! - **follower**: an [`isr::Follower`] first truncates its log to where it agrees with
//!   the leader (OffsetForLeaderEpoch, KIP-101/279), then a per-shard fetcher
//!   (`crate::cluster::fetcher`) pulls batches from the leader with Fetch (carrying this broker's
//!   replica id), appends them with their offsets, makes them durable, and only then
//!   reports the new end in its next fetch — so the leader counts nothing that is not on
//!   disk.
//!
//! A follower's truncation, append or reset is a *log operation*
//! ([`LogOpGuard`]): begun and ended through the state machine, one at a time. A
//! leadership adopted while one runs takes effect when it ends, at the log end it left
//! (the partition lock rule, stated on [`ReplicaState`]); the fetcher rechecks the role
//! after each await and drops stale work.
//!
//! Each replica keeps its leader-epoch history in `leader-epoch-checkpoint` in the
//! partition directory, written atomically by one writer task per shard (latest state
//! wins): the replicas whose history changed wait in a queue, and each round writes all
//! of them with one file-system sync (a lone one with its own syncs), so a leadership
//! change or a fetch round that starts an epoch on thousands of partitions pays one
//! sync, not a data sync, rename and directory sync each. A new epoch's entry is durable
//! before the first batch of that epoch is appended ([`Replica::epochs_durable`]);
//! truncations are written lazily (opening a replica clamps the history to the log
//! end). Policy on a failed checkpoint write: the replica is failed for good — its
//! produces and replicated appends answer KAFKA_STORAGE_ERROR until the broker
//! restarts, as Kafka takes the log directory offline.
//! Consumers read only up to the high watermark.

use std::cell::{Cell, Ref, RefCell};
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use event_listener::Event;
use kafka_protocol::error::ResponseError;
use sluice_replication::cluster::PartitionState;
pub use sluice_replication::isr::Role;
use sluice_replication::isr::{
    self, LeaderEpochCache, LogOp, LogOpKind, OpEnded, ReplicaError, ReplicaState,
};
use sluice_storage::PartitionLog;

use crate::base::error::{self, ApiError};
use crate::base::ids::{BrokerId, LeaderEpoch, Offset};
use crate::base::util::{Sequencer, Turn};

const CHECKPOINT: &str = "leader-epoch-checkpoint";

/// The `replica_id` of a read by a consumer that may be served by a follower (Kafka's
/// `-2`, and any consumer's Fetch v11+, KIP-392): a follower answers it up to its own
/// high watermark. A plain consumer read (`-1`, Fetch v0–v10) needs the leader.
pub const ANY_REPLICA_CONSUMER: BrokerId = BrokerId::new(-2);

pub struct Replica {
    pub topic: Arc<str>,
    pub partition: i32,
    pub log: Rc<PartitionLog>,
    /// Role, epoch history, durable end, high watermark: the pure state machine. Never
    /// borrowed across an await.
    state: RefCell<ReplicaState>,
    /// Fires on durable progress, high-watermark moves and role changes.
    pub progress: Event,
    /// Fires after every batch a produce request appends (a producer's next batch may
    /// be waiting for it: `crate::partition::broker`'s sequence-gap wait).
    pub appended: Event,
    /// Transaction markers written here as leader (KIP-890 verification re-checks when
    /// one was written while it asked the coordinator).
    pub markers: Cell<u64>,
    /// Produce appends take turns in the order their requests reached this shard, so a
    /// request that finds nothing to wait for cannot overtake an earlier one still
    /// waiting (see [`Replica::append_turn`]).
    append_order: Sequencer,
    checkpoint: PathBuf,
    /// The shard's checkpoint writer.
    checkpoints: Rc<CheckpointWriter>,
    checkpoint_state: CheckpointState,
    /// The log end a leader's periodic check last saw past its durable end
    /// ([`Replica::unflushed_tail`]).
    unflushed_seen: Cell<Option<Offset>>,
    /// A flush that check asked for runs ([`Replica::flush_tail`]).
    tail_flushing: Cell<bool>,
    /// Told with every `progress` notification (the shard's change feed:
    /// `crate::partition::changes`).
    on_change: RefCell<Option<Rc<dyn Fn()>>>,
    /// Tiered storage: the first offset in the object store (`i64::MAX` when none),
    /// from the image (`crate::partition::tiered`).
    pub remote_start: Cell<i64>,
}

/// The leader-epoch checkpoint's writer state (see the module docs).
#[derive(Default)]
struct CheckpointState {
    /// Bumped by every change of the history.
    version: Cell<u64>,
    /// The version last written durably.
    persisted: Cell<u64>,
    /// In the shard's queue of checkpoints to write.
    queued: Cell<bool>,
    /// In a round being written.
    writing: Cell<bool>,
    /// The partition is being deleted or the shard closes: nothing more is written.
    retired: Cell<bool>,
    /// Set by a failed write: the replica refuses work from then on.
    failed: RefCell<Option<String>>,
    /// Fires after every write attempt.
    done: Event,
}

/// Checkpoints one round of [`write_checkpoints`] writes at most: the round is one job
/// on the shard's blocking thread (a buffered write and a rename each), which the
/// shard's other blocking work waits behind.
const CHECKPOINT_ROUND_MAX: usize = 4096;

/// The shard's replicas whose leader-epoch history changed since they were last queued
/// for a write, and whether the writer task runs.
#[derive(Default)]
struct CheckpointQueue {
    waiting: Vec<Rc<Replica>>,
    running: bool,
}

/// A replica in a round, the version of its history being written, and the file's bytes.
type CheckpointWrite = (Rc<Replica>, u64, Vec<u8>);

/// The shard's leader-epoch checkpoint writer: one per shard, owned by its partition
/// host (`Broker::checkpoints`) and handed to every replica the shard opens. Its task
/// ([`write_checkpoints`]) runs while replicas wait and ends when none do.
#[derive(Default)]
pub struct CheckpointWriter {
    queue: RefCell<CheckpointQueue>,
}

/// The shard's checkpoint writer: rounds while replicas wait. A round takes every
/// waiting replica's history as it is then and writes them together with one
/// file-system sync per data directory (`small_files::write_durably`); a lone one is
/// written with its own syncs (`file::write_atomic`), which write back nothing else on
/// the file system. A replica changed during a round waits for the next one.
async fn write_checkpoints(writer: Rc<CheckpointWriter>) {
    loop {
        let taken: Vec<Rc<Replica>> = {
            let mut q = writer.queue.borrow_mut();
            let n = q.waiting.len().min(CHECKPOINT_ROUND_MAX);
            q.running = n > 0;
            q.waiting.drain(..n).collect()
        };
        if taken.is_empty() {
            return;
        }
        // A retired replica's directory may be going away; a failed one stays failed.
        let (round, skipped): (Vec<_>, Vec<_>) = taken.into_iter().partition(|r| {
            let st = &r.checkpoint_state;
            !st.retired.get() && st.failed.borrow().is_none()
        });
        for r in skipped {
            r.checkpoint_state.queued.set(false);
            r.checkpoint_state.done.notify(usize::MAX);
        }
        if round.is_empty() {
            continue;
        }
        if let [r] = &round[..] {
            let (version, bytes) = r.checkpoint_now();
            let res = sluice_storage::file::write_atomic(&r.checkpoint, &bytes).await;
            r.checkpoint_written(version, res);
            continue;
        }
        // By data directory (the parent of the partition directories): one sync each.
        let mut by_dir: HashMap<PathBuf, Vec<CheckpointWrite>> = HashMap::new();
        for r in round {
            let (version, bytes) = r.checkpoint_now();
            let dir = r.log.dir().parent().unwrap_or(r.log.dir()).to_path_buf();
            by_dir.entry(dir).or_default().push((r, version, bytes));
        }
        for (dir, group) in by_dir {
            let (replicas, files): (Vec<_>, Vec<_>) = group
                .into_iter()
                .map(|(r, version, bytes)| ((r.clone(), version), (r.checkpoint.clone(), bytes)))
                .unzip();
            let results = sluice_storage::small_files::write_durably(&dir, files).await;
            for ((r, version), res) in replicas.into_iter().zip(results) {
                r.checkpoint_written(version, res);
            }
        }
    }
}

/// Wall-clock milliseconds, as the ISR state machines take them.
fn now_ms() -> u64 {
    crate::base::util::now_ms().max(0) as u64
}

fn fetch_error(e: &isr::FetchError) -> ApiError {
    let code = match e {
        isr::FetchError::NotAReplica(_) => ResponseError::NotLeaderOrFollower,
        isr::FetchError::FencedLeaderEpoch { .. } => ResponseError::FencedLeaderEpoch,
        isr::FetchError::UnknownLeaderEpoch { .. } => ResponseError::UnknownLeaderEpoch,
    };
    ApiError::with(code, e.to_string())
}

fn not_leader() -> ApiError {
    ApiError::with(
        ResponseError::NotLeaderOrFollower,
        "this broker is not the leader of the partition",
    )
}

/// Whom a replica follows after [`Replica::reconcile`], and whether it just started to
/// (new replica, new leader or new leader epoch: it must truncate, then fetch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Follow {
    pub leader: BrokerId,
    pub joined: bool,
}

/// A follower's log operation in flight (see [`ReplicaState`]'s partition-lock rule):
/// ended with [`Self::finish`], or, if dropped (an error, an early return), as not done.
/// Either way a leadership that waited for it then takes effect.
pub(crate) struct LogOpGuard<'a> {
    replica: &'a Rc<Replica>,
    op: Option<LogOp>,
}

impl LogOpGuard<'_> {
    pub(crate) fn kind(&self) -> LogOpKind {
        self.op.as_ref().expect("an unfinished operation").kind
    }

    /// During an append: a fetched batch of `batch_epoch` starts at `base`. True if the
    /// epoch history changed: its checkpoint must be durable before the batch goes in.
    pub(crate) fn fetched_batch(
        &self,
        batch_epoch: LeaderEpoch,
        base: Offset,
    ) -> Result<bool, ReplicaError> {
        let op = self.op.as_ref().expect("an unfinished operation");
        let changed =
            self.replica
                .state
                .borrow_mut()
                .fetched_batch(op, batch_epoch.get(), base.get())?;
        if changed {
            self.replica.persist_epochs();
        }
        Ok(changed)
    }

    /// Ends the operation: `durable_end` as [`ReplicaState::end_op`] takes it.
    pub(crate) fn finish(mut self, durable_end: Option<Offset>) -> OpEnded {
        let op = self.op.take().expect("an unfinished operation");
        self.replica.end_op(op, durable_end)
    }
}

impl Drop for LogOpGuard<'_> {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            self.replica.end_op(op, None);
        }
    }
}

impl Replica {
    /// The replica of `log`, its leader-epoch history read back from its checkpoint;
    /// `checkpoints` is the shard's writer, which writes that history when it changes.
    pub fn open(
        topic: &str,
        partition: i32,
        log: Rc<PartitionLog>,
        checkpoints: &Rc<CheckpointWriter>,
    ) -> Rc<Replica> {
        let checkpoint = log.dir().join(CHECKPOINT);
        let end = log.log_end_offset();
        let epochs = match std::fs::read_to_string(&checkpoint) {
            Ok(text) => LeaderEpochCache::decode(&text).unwrap_or_else(|e| {
                tracing::warn!(path = %checkpoint.display(), error = %e, "unreadable leader-epoch checkpoint; starting empty");
                LeaderEpochCache::default()
            }),
            Err(_) => LeaderEpochCache::default(),
        };
        let replica = Rc::new(Replica {
            topic: Arc::from(topic),
            partition,
            log,
            state: RefCell::new(ReplicaState::new(epochs, end, 0)),
            progress: Event::new(),
            appended: Event::new(),
            markers: Cell::new(0),
            append_order: Sequencer::default(),
            checkpoint,
            checkpoints: checkpoints.clone(),
            checkpoint_state: CheckpointState::default(),
            unflushed_seen: Cell::new(None),
            tail_flushing: Cell::new(false),
            on_change: RefCell::new(None),
            remote_start: Cell::new(i64::MAX),
        });
        // A leader's append takes its offsets only while this replica leads in the
        // append's epoch (see `PartitionLog::set_leader_fence`).
        let weak = Rc::downgrade(&replica);
        replica.log.set_leader_fence(move |epoch| {
            weak.upgrade().is_some_and(|r| {
                r.state
                    .try_borrow()
                    .is_ok_and(|s| s.leader_epoch() == Some(epoch))
            })
        });
        replica
    }

    /// A produce's turn to append to this partition, in the order the produce calls
    /// asked for it; held until its batches have their offsets. Kafka keeps a
    /// connection's order by handling its requests one at a time; here a connection's
    /// requests reach the shard in order but run concurrently, and an append may wait
    /// (the epoch's checkpoint, a roll, reopening the log): without the turn, a later
    /// request that found nothing to wait for appended first, and a producer without
    /// idempotence saw its records of one key stored out of order.
    /// The turn is taken when this is called; [`Turn::wait`] for it (glommio's
    /// semaphore is not enough: a permit given back is free to whoever asks first).
    pub fn append_turn(&self) -> Turn {
        self.append_order.turn()
    }

    /// Adopts the brokers the metadata says are fenced ([`isr::ReplicaState::set_ineligible`]);
    /// wakes the waiters if the high watermark moved.
    pub fn set_ineligible(&self, fenced: &[i32]) {
        let before = self.high_watermark();
        self.state.borrow_mut().set_ineligible(fenced);
        if self.high_watermark() != before {
            self.notify();
        }
    }

    pub(crate) fn notify(&self) {
        self.progress.notify(usize::MAX);
        if let Some(hook) = &*self.on_change.borrow() {
            hook();
        }
    }

    /// Installs the hook told whenever this replica or its log may answer a fetch
    /// differently (progress notifications and [`PartitionLog::set_on_change`]).
    pub fn set_on_change(&self, hook: Rc<dyn Fn()>) {
        let h = hook.clone();
        self.log.set_on_change(move || h());
        *self.on_change.borrow_mut() = Some(hook);
    }

    /// The replica's state machine, to read (never held across an await).
    pub fn state(&self) -> Ref<'_, ReplicaState> {
        self.state.borrow()
    }

    /// The role (a borrow of the state; never held across an await).
    pub fn role(&self) -> Ref<'_, Role> {
        Ref::map(self.state.borrow(), |s| s.role())
    }

    pub fn durable_end(&self) -> Offset {
        Offset::new(self.state.borrow().durable())
    }

    pub fn high_watermark(&self) -> Offset {
        Offset::new(self.state.borrow().high_watermark())
    }

    /// The log end offset (what the log holds, durable or not).
    pub fn log_end(&self) -> Offset {
        Offset::new(self.log.log_end_offset())
    }

    /// The local log start offset: what this broker's files hold (what replicas
    /// fetch from, ListOffsets' earliest-local).
    pub fn log_start(&self) -> Offset {
        Offset::new(self.log.log_start_offset())
    }

    /// The log start clients see: the first remote offset when the object store holds
    /// older records than the local log (tiered storage), else the local start.
    pub fn client_log_start(&self) -> Offset {
        Offset::new(self.log.log_start_offset().min(self.remote_start.get()))
    }

    /// The leader epoch if this replica leads.
    pub fn leader_epoch(&self) -> Option<LeaderEpoch> {
        self.state.borrow().leader_epoch().map(LeaderEpoch::new)
    }

    /// The leader epoch `offset` was written in, by this replica's epoch history (-1 if
    /// unknown): what ListOffsets answers beside an offset it found, so that a client
    /// validating its position (KIP-320) asks about the right epoch.
    pub fn epoch_of(&self, offset: Offset) -> LeaderEpoch {
        LeaderEpoch::new(self.state.borrow().epochs().epoch_for(offset.get()))
    }

    /// Whether this replica leads with a high watermark still below the start of its
    /// leader epoch (a new leader whose followers have not fetched in its epoch yet):
    /// its high watermark is then older than what the previous leader reported, and
    /// Kafka answers a client's ListOffsets for "latest", or a lookup past the high
    /// watermark, with the retriable OFFSET_NOT_AVAILABLE
    /// (`Partition.fetchOffsetForTimestamp`).
    pub fn high_watermark_lags_epoch_start(&self) -> bool {
        self.state
            .borrow()
            .leader()
            .is_some_and(|l| l.epoch_start_offset() > l.high_watermark())
    }

    /// Schedules a write of the leader-epoch history (never blocks; see the module docs).
    pub(crate) fn persist_epochs(self: &Rc<Self>) {
        let st = &self.checkpoint_state;
        st.version.set(st.version.get() + 1);
        if st.queued.get() || st.retired.get() || st.failed.borrow().is_some() {
            return;
        }
        st.queued.set(true);
        let start = {
            let mut q = self.checkpoints.queue.borrow_mut();
            q.waiting.push(self.clone());
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            glommio::spawn_local(write_checkpoints(self.checkpoints.clone())).detach();
        }
    }

    /// This replica's checkpoint as it is now, for a round of [`write_checkpoints`]:
    /// the version it writes and the file's contents.
    fn checkpoint_now(&self) -> (u64, Vec<u8>) {
        let st = &self.checkpoint_state;
        st.queued.set(false);
        st.writing.set(true);
        let text = self.state.borrow().epochs().encode();
        (st.version.get(), text.into_bytes())
    }

    /// A round wrote (or failed to write) `version` of this replica's checkpoint.
    fn checkpoint_written(&self, version: u64, res: Result<(), sluice_storage::Error>) {
        let st = &self.checkpoint_state;
        st.writing.set(false);
        match res {
            Ok(()) => st.persisted.set(st.persisted.get().max(version)),
            Err(e) => {
                tracing::error!(topic = %self.topic, partition = self.partition, error = %e, "writing the leader-epoch checkpoint failed; the replica refuses work until restart");
                *st.failed.borrow_mut() = Some(e.to_string());
            }
        }
        st.done.notify(usize::MAX);
    }

    /// Writes no more checkpoints of this replica (its partition is being deleted, or
    /// the shard closes) and waits until a round writing one has ended, so that nothing
    /// writes into the partition's directory while it is removed.
    pub(crate) async fn retire(&self) {
        let st = &self.checkpoint_state;
        st.retired.set(true);
        // Waiters for a version no round will write now give up (`epochs_durable`).
        st.done.notify(usize::MAX);
        while st.writing.get() {
            let listener = st.done.listen();
            if st.writing.get() {
                listener.await;
            }
        }
    }

    /// Waits until the leader-epoch history as it is now is durable; fails once a
    /// checkpoint write failed. Immediate when nothing changed.
    pub(crate) async fn epochs_durable(&self) -> Result<(), ApiError> {
        let st = &self.checkpoint_state;
        let target = st.version.get();
        let settled = || -> Option<Result<(), ApiError>> {
            if let Some(e) = st.failed.borrow().as_ref() {
                return Some(Err(ApiError::with(
                    ResponseError::KafkaStorageError,
                    format!(
                        "leader-epoch checkpoint of {}-{} failed: {e}",
                        self.topic, self.partition
                    ),
                )));
            }
            if st.persisted.get() >= target {
                return Some(Ok(()));
            }
            st.retired.get().then(|| {
                Err(ApiError::with(
                    ResponseError::NotLeaderOrFollower,
                    format!(
                        "{}-{} was closed or deleted on this broker",
                        self.topic, self.partition
                    ),
                ))
            })
        };
        // The produce path's usual case: nothing to wait for, no listener allocated.
        loop {
            if let Some(r) = settled() {
                return r;
            }
            let listener = st.done.listen();
            // Checked again with the listener registered: no write finishes unseen.
            if let Some(r) = settled() {
                return r;
            }
            listener.await;
        }
    }

    /// Makes a leader's appends so far durable (as the topic's flush policy asks) and
    /// counts them, if this replica still leads in `epoch`: a deposed leader's late
    /// appends must never count as held (the fetcher truncates them away).
    pub async fn flush(&self, epoch: LeaderEpoch) -> Result<(), ApiError> {
        let end = self.log_end();
        self.log
            .flush_for_ack()
            .await
            .map_err(|e| error::from_storage(&e))?;
        let moved = self
            .state
            .borrow_mut()
            .leader_flushed(epoch.get(), end.get(), self.log.log_end_offset())
            .map_err(|_| not_leader())?;
        // Pair assertion: a leader that counted its flush holds durably what it had
        // before the flush, and its high watermark stays within that.
        let durable = self.durable_end();
        assert!(
            durable >= end.min(self.log_end()) && self.high_watermark() <= durable,
            "{}-{}: flushed to {end}, durable end {durable}, high watermark {}",
            self.topic,
            self.partition,
            self.high_watermark()
        );
        if moved {
            self.notify();
        }
        Ok(())
    }

    /// Adopts the committed assignment. Returns the leader to follow if this replica
    /// just became (or stays) a follower.
    pub fn reconcile(
        self: &Rc<Self>,
        me: BrokerId,
        a: &PartitionState,
        lag_max_ms: u64,
    ) -> Option<Follow> {
        let end = self.log.log_end_offset();
        let before = self.leader_epoch();
        let hw_before = self.high_watermark();
        let r = self
            .state
            .borrow_mut()
            .reconcile(me.get(), a, end, now_ms(), lag_max_ms);
        if r.epochs_changed {
            self.persist_epochs();
        }
        let (leading, pending) = {
            let s = self.state.borrow();
            (
                s.leader_epoch().map(LeaderEpoch::new),
                s.pending_leader_epoch(),
            )
        };
        // Pair assertions: what the state machine established, checked where the shell
        // takes it. A replica's leader epoch never goes back (images arrive in order),
        // and its high watermark never passes what its log holds.
        if let (Some(was), Some(now)) = (before, leading) {
            assert!(
                now >= was,
                "{}-{}: leader epoch went back from {was} to {now}",
                self.topic,
                self.partition
            );
        }
        assert!(
            self.high_watermark() <= self.log_end(),
            "{}-{}: high watermark {} above the log end {}",
            self.topic,
            self.partition,
            self.high_watermark(),
            self.log_end()
        );
        // Adopting an assignment moves no log: a leader that stays leader in the same
        // epoch keeps its high watermark (it never goes back under a leader).
        if leading.is_some() && leading == before {
            assert!(
                self.high_watermark() >= hw_before,
                "{}-{}: high watermark went back from {hw_before} to {} in epoch {:?}",
                self.topic,
                self.partition,
                self.high_watermark(),
                leading
            );
        }
        // The assignment adopted is the one this replica now acts on: leading means the
        // assignment names it leader in that epoch; following means it does not lead.
        if let Some(epoch) = leading {
            assert!(
                a.leader == me.get() && a.leader_epoch == epoch.get(),
                "{}-{}: leads in epoch {epoch} but the assignment says leader {} epoch {}",
                self.topic,
                self.partition,
                a.leader,
                a.leader_epoch
            );
        }
        if let Some((leader, _)) = r.follow {
            assert!(
                leading.is_none() && leader != me.get(),
                "{}-{}: follows {leader} while leading in {leading:?}",
                self.topic,
                self.partition
            );
        }
        if let (Some(epoch), true) = (leading, leading != before) {
            tracing::info!(topic = %self.topic, partition = self.partition, %epoch, isr = ?a.isr, "leading");
        } else if let Some(epoch) = pending {
            tracing::info!(topic = %self.topic, partition = self.partition, epoch, "leading once the fetcher's log operation on this partition ends");
        } else if let Some((leader, true)) = r.follow {
            tracing::info!(topic = %self.topic, partition = self.partition, leader, epoch = a.leader_epoch, "following");
        }
        if r.changed {
            self.notify();
        }
        r.follow.map(|(leader, joined)| Follow {
            leader: BrokerId::new(leader),
            joined,
        })
    }

    /// Ends a log operation (through its [`LogOpGuard`]).
    fn end_op(self: &Rc<Self>, op: LogOp, durable_end: Option<Offset>) -> OpEnded {
        let kind = op.kind;
        let ended = self.state.borrow_mut().end_op(
            op,
            durable_end.map(Offset::get),
            self.log.log_end_offset(),
            now_ms(),
        );
        match ended {
            Ok(ended) => {
                // Pair assertion: a log operation that moved the durable end moved it
                // to the end its caller made durable.
                assert!(
                    !ended.durable_moved || durable_end == Some(self.durable_end()),
                    "{}-{}: {kind:?} ended at {durable_end:?}, durable end {}",
                    self.topic,
                    self.partition,
                    self.durable_end()
                );
                if ended.epochs_changed {
                    self.persist_epochs();
                }
                if let Some(epoch) = ended.leading {
                    tracing::info!(topic = %self.topic, partition = self.partition, epoch, ?kind, "leading (after the log operation it waited for)");
                }
                self.notify();
                ended
            }
            Err(e) => {
                // The guard owns the only ticket: not reachable, and harmless if it were.
                tracing::error!(topic = %self.topic, partition = self.partition, error = %e, "ending a log operation");
                OpEnded::default()
            }
        }
    }

    /// A truncating follower in `epoch` got an OffsetForLeaderEpoch answer. `Ok(None)`:
    /// nothing to cut; `Ok(Some(guard))`: truncate the log to the guard's offset.
    pub(crate) fn begin_truncation(
        self: &Rc<Self>,
        epoch: LeaderEpoch,
        response_epoch: LeaderEpoch,
        response_end: Offset,
    ) -> Result<Option<LogOpGuard<'_>>, ReplicaError> {
        let entries = self.state.borrow().epochs().entries().len();
        let op = self.state.borrow_mut().begin_truncation(
            epoch.get(),
            self.log.log_end_offset(),
            response_epoch.get(),
            response_end.get(),
        )?;
        if op.is_none() && self.state.borrow().epochs().entries().len() != entries {
            // Nothing cut, but epochs past the log end forgotten (KIP-279's next round).
            self.persist_epochs();
        }
        Ok(op.map(|op| {
            // Pair assertion: a cut the state machine begins is at or below the log end,
            // and the high watermark followed it down.
            let log_end = self.log_end();
            assert!(
                matches!(op.kind, LogOpKind::Truncate { to } if Offset::new(to) <= log_end)
                    && self.high_watermark() <= log_end,
                "{}-{}: truncation {:?} of a log ending at {log_end}",
                self.topic,
                self.partition,
                op.kind
            );
            // The history was cut (lazily written) and the high watermark may have moved.
            self.persist_epochs();
            self.notify();
            LogOpGuard {
                replica: self,
                op: Some(op),
            }
        }))
    }

    /// A fetching follower in `epoch` appends what its fetch from `fetch_offset` got.
    pub(crate) fn begin_append(
        self: &Rc<Self>,
        epoch: LeaderEpoch,
        fetch_offset: Offset,
    ) -> Result<LogOpGuard<'_>, ReplicaError> {
        let op = self.state.borrow_mut().begin_append(
            epoch.get(),
            fetch_offset.get(),
            self.log.log_end_offset(),
        )?;
        // Pair assertion: an append begins only where the log ends.
        assert_eq!(
            self.log_end(),
            fetch_offset,
            "{}-{}: append begun away from the log end",
            self.topic,
            self.partition
        );
        Ok(LogOpGuard {
            replica: self,
            op: Some(op),
        })
    }

    /// A fetching follower whose log ends past its durable end syncs that tail before
    /// it fetches (see `isr::ReplicaState::begin_tail_sync`). `Ok(None)`: nothing to
    /// sync.
    pub(crate) fn begin_tail_sync(
        self: &Rc<Self>,
        epoch: LeaderEpoch,
    ) -> Result<Option<LogOpGuard<'_>>, ReplicaError> {
        let op = self
            .state
            .borrow_mut()
            .begin_tail_sync(epoch.get(), self.log.log_end_offset())?;
        Ok(op.map(|op| LogOpGuard {
            replica: self,
            op: Some(op),
        }))
    }

    /// A follower behind the leader's log start starts its log over at `start`.
    pub(crate) fn begin_reset(
        self: &Rc<Self>,
        epoch: LeaderEpoch,
        start: Offset,
    ) -> Result<LogOpGuard<'_>, ReplicaError> {
        let op = self.state.borrow_mut().begin_reset(
            epoch.get(),
            start.get(),
            self.log.log_end_offset(),
        )?;
        Ok(LogOpGuard {
            replica: self,
            op: Some(op),
        })
    }

    /// A fetch response in `epoch` carried the leader's high watermark.
    pub(crate) fn fetched_high_watermark(&self, epoch: LeaderEpoch, leader_hw: Offset) {
        let before = self.high_watermark();
        let taken = self
            .state
            .borrow_mut()
            .fetched_high_watermark(epoch.get(), leader_hw.get());
        // Pair assertion: the high watermark a follower takes from its leader is what
        // it reports from then on, and never above what it holds durably.
        if let Ok(hw) = taken {
            let hw = Offset::new(hw);
            assert!(
                hw == self.high_watermark() && hw <= self.durable_end().max(before),
                "{}-{}: took high watermark {hw} (leader's {leader_hw}, durable end {}, was {before})",
                self.topic,
                self.partition,
                self.durable_end()
            );
        }
    }

    /// The log's start moved (the leader's, followed): the epoch history follows.
    pub(crate) fn log_start_moved(&self, start: Offset) {
        self.state.borrow_mut().log_start_moved(start.get());
    }

    /// acks=all gate before appending.
    pub fn check_min_isr(&self, min_insync: usize) -> Result<LeaderEpoch, ApiError> {
        match self.state.borrow().leader() {
            Some(l) => {
                l.check_min_isr(min_insync)
                    .map_err(|e| ApiError::with(ResponseError::NotEnoughReplicas, e.to_string()))?;
                Ok(LeaderEpoch::new(l.leader_epoch()))
            }
            None => Err(not_leader()),
        }
    }

    /// Waits until the high watermark covers `end` (acks=all), or the deadline.
    pub async fn wait_acked(
        &self,
        end: Offset,
        epoch: LeaderEpoch,
        min_insync: usize,
        timeout: Duration,
    ) -> Result<(), ApiError> {
        let (end, epoch) = (end.get(), epoch.get());
        let deadline = std::time::Instant::now() + timeout;
        // Checked first and listened for only when it must wait (then checked again,
        // so progress between the check and the listen is seen): at 10,000 partitions
        // most appends are covered by the time they get here, and a listener is an
        // allocation per append.
        let mut listener = None;
        loop {
            match self.state.borrow().leader() {
                Some(l) if l.leader_epoch() == epoch => match l.acked(end, min_insync) {
                    isr::AckState::Acked => {
                        // Pair assertion: acknowledged means covered by the high
                        // watermark, with enough in-sync replicas.
                        assert!(
                            l.high_watermark() >= end && l.isr().len() >= min_insync,
                            "{}-{}: acked up to {end} with high watermark {} and ISR {:?}",
                            self.topic,
                            self.partition,
                            l.high_watermark(),
                            l.isr()
                        );
                        return Ok(());
                    }
                    isr::AckState::NotEnoughReplicasAfterAppend => {
                        return Err(ApiError::with(
                            ResponseError::NotEnoughReplicasAfterAppend,
                            format!(
                                "the ISR has fewer than min.insync.replicas={min_insync} members"
                            ),
                        ))
                    }
                    isr::AckState::Pending => {}
                },
                // Leadership moved: the record may or may not survive; the client retries.
                _ => return Err(not_leader()),
            }
            let Some(heard) = listener.take() else {
                listener = Some(self.progress.listen());
                continue;
            };
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(ApiError::with(
                    ResponseError::RequestTimedOut,
                    "the in-sync replicas did not confirm the write in time",
                ));
            }
            futures_lite::future::or(heard, glommio::timer::sleep(left)).await;
        }
    }

    /// What a fetch may read up to: followers the whole log (appended batches whose
    /// write is still running included), consumers up to the high watermark. Also
    /// records the follower's progress.
    ///
    /// Followers are not held to the leader's durable end: they write (and make durable)
    /// a batch while the leader's own write of it runs, as Kafka's and Redpanda's
    /// followers do, instead of one device round trip after it. The high watermark still
    /// waits for both: it is the minimum of the leader's durable end and the followers'
    /// fetch offsets (their durable ends). A follower may so hold records the leader
    /// then loses in a crash; they were never acknowledged, and the leader epoch the
    /// restarted leader's re-registration bumps makes the follower truncate them
    /// (OffsetForLeaderEpoch), as the replication simulation (`sluice_replication::sim`)
    /// checks.
    pub fn fetch_bound(
        &self,
        replica_id: BrokerId,
        current_leader_epoch: LeaderEpoch,
        fetch_offset: Offset,
    ) -> Result<(Offset, Offset, Option<isr::AlterIsr>), ApiError> {
        let (bound, hw, alter) =
            self.fetch_bound_raw(replica_id, current_leader_epoch.get(), fetch_offset.get())?;
        // Pair assertion: a read never goes past the log, nor past the high watermark
        // it reports unless it is a follower's (which reads the whole log); an ISR
        // change proposed on a fetch names this leader's epoch and the fetching replica.
        let (bound, hw) = (Offset::new(bound), Offset::new(hw));
        assert!(
            bound <= self.log_end()
                && hw <= self.log_end()
                && (replica_id.is_some() || bound <= hw),
            "{}-{}: fetch bound {bound}, high watermark {hw}, log end {} (replica {replica_id})",
            self.topic,
            self.partition,
            self.log_end()
        );
        if let Some(a) = &alter {
            self.assert_isr_proposal(a);
            assert!(
                a.new_isr.contains(&replica_id.get()),
                "{}-{}: ISR expansion {a:?} on a fetch by {replica_id} leaves it out",
                self.topic,
                self.partition
            );
        }
        Ok((bound, hw, alter))
    }

    fn fetch_bound_raw(
        &self,
        replica_id: BrokerId,
        current_leader_epoch: i32,
        fetch_offset: i64,
    ) -> Result<(i64, i64, Option<isr::AlterIsr>), ApiError> {
        let mut state = self.state.borrow_mut();
        state
            .check_known_epoch(current_leader_epoch)
            .map_err(|e| fetch_error(&e))?;
        if let (Some(f), ANY_REPLICA_CONSUMER) = (state.follower(), replica_id) {
            return self.follower_read_bound(f, fetch_offset);
        }
        let Some(l) = state.leader_mut() else {
            return Err(not_leader());
        };
        if replica_id.is_some() {
            // Never record progress the follower cannot have: past our log end (a
            // divergent log) it must truncate first.
            let (start, end) = (self.log.log_start_offset(), self.log.log_end_offset());
            if fetch_offset > end || fetch_offset < start {
                return Err(ApiError::with(
                    ResponseError::OffsetOutOfRange,
                    format!("fetch offset {fetch_offset} outside [{start}, {end}]"),
                ));
            }
            let before = l.high_watermark();
            let ok = l
                .on_follower_fetch(
                    replica_id.get(),
                    current_leader_epoch,
                    fetch_offset,
                    now_ms(),
                )
                .map_err(|e| fetch_error(&e))?;
            if ok.high_watermark != before {
                drop(state);
                self.notify();
            }
            return Ok((end, ok.high_watermark, ok.alter_isr));
        }
        if current_leader_epoch >= 0 {
            l.check_epoch(current_leader_epoch)
                .map_err(|e| fetch_error(&e))?;
        }
        Ok((l.high_watermark(), l.high_watermark(), None))
    }

    /// A consumer's read on a follower (KIP-392), as Kafka serves it: up to the high
    /// watermark this follower learned from its leader's fetch responses, never past it
    /// (records above it may still be truncated away). An offset in (high watermark, log
    /// end] reads nothing; one outside [log start, log end] is OFFSET_OUT_OF_RANGE, on
    /// which the consumer goes back to the leader.
    fn follower_read_bound(
        &self,
        f: &isr::Follower,
        fetch_offset: i64,
    ) -> Result<(i64, i64, Option<isr::AlterIsr>), ApiError> {
        let (start, end) = (self.log.log_start_offset(), self.log.log_end_offset());
        if fetch_offset < start || fetch_offset > end {
            return Err(ApiError::with(
                ResponseError::OffsetOutOfRange,
                format!("fetch offset {fetch_offset} outside this follower's [{start}, {end}]"),
            ));
        }
        let hw = f.high_watermark().min(end);
        Ok((hw, hw, None))
    }

    /// OffsetForLeaderEpoch on the leader: the end offset of `epoch` in this log.
    pub fn epoch_end(
        &self,
        current_leader_epoch: LeaderEpoch,
        epoch: LeaderEpoch,
    ) -> Result<(LeaderEpoch, Offset), ApiError> {
        let (found, end) = self
            .state
            .borrow()
            .epoch_end(
                current_leader_epoch.get(),
                epoch.get(),
                self.log.log_end_offset(),
            )
            .map_err(|e| match e {
                ReplicaError::Fetch(f) => fetch_error(&f),
                _ => not_leader(),
            })?;
        Ok((LeaderEpoch::new(found), Offset::new(end)))
    }

    /// The leader's periodic ISR check.
    pub fn isr_tick(&self) -> Option<isr::AlterIsr> {
        let alter = self.state.borrow_mut().leader_mut()?.tick(now_ms());
        if let Some(a) = &alter {
            self.assert_isr_proposal(a);
        }
        alter
    }

    /// Pair assertion on an ISR change this leader proposes (what the state machine
    /// sets, checked before the controller is asked): it is in this leader's current
    /// epoch, and the leader is in the ISR it publishes.
    fn assert_isr_proposal(&self, a: &isr::AlterIsr) {
        let state = self.state.borrow();
        let leader = state.leader();
        assert!(
            leader.is_some_and(|l| l.leader_epoch() == a.leader_epoch && a.new_isr.contains(&l.me())),
            "{}-{}: ISR change {a:?} proposed by a replica not leading in its epoch, or leaving the leader out",
            self.topic,
            self.partition
        );
    }

    /// The leader's periodic check for a tail past its durable end that no produce is
    /// flushing: the epoch to [`Self::flush`] in once two checks in a row found the log
    /// ending at the same place past the durable end (a produce cancelled between its
    /// append and its flush, a refused batch after accepted ones, a leadership taken
    /// over at the end of a follower's append cut short). Each produce flushes the whole
    /// log, so only an idle partition keeps such a tail, unacknowledged, below no high
    /// watermark; its records become readable once it is flushed.
    /// While that flush ([`Self::flush_tail`]) runs, none more is asked for.
    pub(crate) fn unflushed_tail(&self) -> Option<LeaderEpoch> {
        let epoch = self.leader_epoch()?;
        if self.tail_flushing.get() {
            return None;
        }
        let end = self.log_end();
        let stale = (end > self.durable_end()).then_some(end);
        let again = stale.is_some() && self.unflushed_seen.get() == stale;
        self.unflushed_seen.set(stale);
        self.tail_flushing.set(again);
        again.then_some(epoch)
    }

    /// The flush [`Self::unflushed_tail`] asked for.
    pub(crate) async fn flush_tail(&self, epoch: LeaderEpoch) -> Result<(), ApiError> {
        struct Done<'a>(&'a Cell<bool>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.set(false);
            }
        }
        let _done = Done(&self.tail_flushing);
        self.flush(epoch).await
    }

    /// True while this replica follows in leader epoch `epoch`.
    pub(crate) fn follows_in(&self, epoch: LeaderEpoch) -> bool {
        self.state.borrow().follows_in(epoch.get())
    }

    /// Back to OffsetForLeaderEpoch before any further fetch (same leader and epoch).
    pub(crate) fn restart_truncation(&self, epoch: LeaderEpoch) {
        self.state.borrow_mut().restart_truncation(epoch.get());
    }

    pub(crate) fn alter_rejected(&self, alter: &isr::AlterIsr) {
        if let Some(l) = self.state.borrow_mut().leader_mut() {
            if l.leader_epoch() == alter.leader_epoch {
                l.on_alter_rejected(alter);
            }
        }
    }
}

/// Per-shard registry of running fetchers, one per leader. A fetcher long-polls its
/// leader for the partitions it had when the poll began; a partition that starts
/// following that leader meanwhile (a new replica, a new leader, a new epoch) wakes it
/// through [`FetcherWake`], so the partition's first fetch does not wait for the poll to
/// end (acks=all on a new topic, or after a leader change, waits for that fetch).
#[derive(Default)]
pub struct Fetchers {
    running: RefCell<HashMap<BrokerId, Rc<FetcherWake>>>,
}

/// Counts the partitions that joined a fetcher, and wakes it when one does.
#[derive(Default)]
pub struct FetcherWake {
    joined: Cell<u64>,
    event: Event,
}

impl FetcherWake {
    /// How many partitions have joined so far.
    pub fn joined(&self) -> u64 {
        self.joined.get()
    }

    /// Completes once a partition joined after [`Self::joined`] returned `seen`.
    pub async fn joined_since(&self, seen: u64) {
        while self.joined.get() == seen {
            let listener = self.event.listen();
            if self.joined.get() != seen {
                return;
            }
            listener.await;
        }
    }
}

impl Fetchers {
    /// A partition of this shard started following `leader`. True if a fetcher for it
    /// must be started; otherwise the running one is woken.
    pub fn joined(&self, leader: BrokerId) -> bool {
        let mut running = self.running.borrow_mut();
        match running.get(&leader) {
            Some(wake) => {
                wake.joined.set(wake.joined.get() + 1);
                wake.event.notify(usize::MAX);
                false
            }
            None => {
                running.insert(leader, Rc::default());
                true
            }
        }
    }

    /// The wake-up of the running fetcher for `leader`.
    pub fn wake(&self, leader: BrokerId) -> Option<Rc<FetcherWake>> {
        self.running.borrow().get(&leader).cloned()
    }

    pub fn release(&self, leader: BrokerId) {
        self.running.borrow_mut().remove(&leader);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_storage::{LogConfig, Storage, StorageLimits, SystemClock};

    /// Broker 1 leads in `epoch`, alone.
    fn leads(epoch: i32) -> PartitionState {
        PartitionState {
            replicas: vec![1],
            isr: vec![1],
            leader: 1,
            leader_epoch: epoch,
            partition_epoch: epoch,
            slots: Vec::new(),
        }
    }

    fn on_executor<T: Send + 'static>(
        f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
    ) -> T {
        sluice_shard::run_unpinned("replica-test", 8 << 20, f)
    }

    /// A new log `t-0` in a new storage at `path`.
    async fn new_log(path: &std::path::Path) -> Rc<PartitionLog> {
        let s = Storage::open(path, StorageLimits::default(), Rc::new(SystemClock))
            .await
            .unwrap();
        s.open_log("t-0", LogConfig::default()).await.unwrap()
    }

    /// A new epoch's entry is on disk once `epochs_durable` returns, without a blocking
    /// write; a replica reopened on the same log reads it back.
    #[test]
    fn leader_epoch_checkpoint_is_written_without_blocking_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let epochs = on_executor(move || {
            Box::pin(async move {
                let cp = Rc::new(CheckpointWriter::default());
                let log = new_log(&path).await;
                let r = Replica::open("t", 0, log.clone(), &cp);
                let batch = sluice_storage::batch::build::simple(1, 1, 10);
                r.reconcile(BrokerId::new(1), &leads(3), 0);
                log.append(&batch, 3).await.unwrap();
                r.reconcile(BrokerId::new(1), &leads(5), 0);
                log.append(&batch, 5).await.unwrap();
                r.epochs_durable().await.unwrap();
                log.flush().await.unwrap();
                let again = Replica::open("t", 0, log, &cp);
                let latest = again.state().epochs().latest_epoch();
                latest
            })
        });
        assert_eq!(epochs, 5);
    }

    /// Replicas whose epochs change together are written in one round (one file-system
    /// sync): each is durable once `epochs_durable` returns and reads back, and a file
    /// that cannot be written fails its own replica only.
    /// A leader's append takes its offsets only while the replica leads in the
    /// append's epoch: one that checked its leadership, then waited past its demotion
    /// (a deposed leader's late produce), is refused where the offsets are due, and
    /// the log does not move. A follower's copies are not fenced.
    #[test]
    fn a_deposed_leaders_late_append_is_refused_where_it_takes_its_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let (late, end, copied) = on_executor(move || {
            Box::pin(async move {
                let cp = Rc::new(CheckpointWriter::default());
                let log = new_log(&path).await;
                let r = Replica::open("t", 0, log.clone(), &cp);
                let batch = sluice_storage::batch::build::simple(1, 2, 10);
                r.reconcile(BrokerId::new(1), &leads(3), 0);
                log.append(&batch, 3).await.unwrap();
                let mut follows = leads(4);
                follows.leader = 2;
                follows.replicas = vec![1, 2];
                follows.isr = vec![1, 2];
                r.reconcile(BrokerId::new(1), &follows, 0);
                assert!(r.state().follower().is_some());
                let late = log.append(&batch, 3).await.map(|_| ());
                let end = log.log_end_offset();
                let mut copy = batch.clone();
                sluice_storage::batch::assign(&mut copy, end, 4, None);
                let copied = log.append_with_offsets(copy.into()).await.is_ok();
                (late, end, copied)
            })
        });
        assert!(
            matches!(late, Err(sluice_storage::Error::NotLeader { epoch: 3 })),
            "{late:?}"
        );
        assert_eq!(end, 2, "the refused append took no offsets");
        assert!(copied, "a follower's copy is not fenced");
    }

    /// A new leader whose high watermark is below its epoch's start (records the old
    /// leader may have reported as committed) says so until a follower's fetch in its
    /// epoch moves the high watermark up to it.
    #[test]
    fn a_new_leaders_high_watermark_lags_its_epoch_start_until_a_follower_fetches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let seen = on_executor(move || {
            Box::pin(async move {
                let cp = Rc::new(CheckpointWriter::default());
                let log = new_log(&path).await;
                let r = Replica::open("t", 0, log.clone(), &cp);
                let batch = sluice_storage::batch::build::simple(1, 2, 10);
                r.reconcile(BrokerId::new(1), &leads(3), 0);
                log.append(&batch, 3).await.unwrap();
                let mut seen = vec![r.high_watermark_lags_epoch_start()];
                let mut with_follower = leads(4);
                with_follower.replicas = vec![1, 2];
                with_follower.isr = vec![1, 2];
                r.reconcile(BrokerId::new(1), &with_follower, 0);
                seen.push(r.high_watermark_lags_epoch_start());
                r.flush_tail(LeaderEpoch::new(4)).await.unwrap();
                r.fetch_bound(BrokerId::new(2), LeaderEpoch::new(4), Offset::new(2))
                    .unwrap();
                seen.push(r.high_watermark_lags_epoch_start());
                (seen, r.high_watermark())
            })
        });
        assert_eq!(seen, (vec![false, true, false], Offset::new(2)));
    }

    /// A leader's tail that no produce flushed is found by two periodic checks in a
    /// row, flushed, and counted; a tail still growing is left to its produce.
    #[test]
    fn a_leaders_tail_no_produce_flushes_is_found_and_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let (checks, durable) = on_executor(move || {
            Box::pin(async move {
                let cp = Rc::new(CheckpointWriter::default());
                let log = new_log(&path).await;
                let r = Replica::open("t", 0, log.clone(), &cp);
                let batch = sluice_storage::batch::build::simple(1, 2, 10);
                r.reconcile(BrokerId::new(1), &leads(3), 0);
                let mut checks = vec![r.unflushed_tail()];
                // Appended, and its produce gone before the flush.
                log.append(&batch, 3).await.unwrap();
                checks.push(r.unflushed_tail());
                log.append(&batch, 3).await.unwrap();
                checks.push(r.unflushed_tail());
                checks.push(r.unflushed_tail());
                // None more while that flush runs.
                checks.push(r.unflushed_tail());
                r.flush_tail(LeaderEpoch::new(3)).await.unwrap();
                checks.push(r.unflushed_tail());
                (checks, r.durable_end())
            })
        });
        let three = Some(LeaderEpoch::new(3));
        assert_eq!(checks, [None, None, None, three, None, None]);
        assert_eq!(durable, Offset::new(4));
    }

    #[test]
    fn a_round_of_checkpoints_is_durable_together_and_fails_only_its_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let (results, reread) = on_executor(move || {
            Box::pin(async move {
                let cp = Rc::new(CheckpointWriter::default());
                let s = Storage::open(&path, StorageLimits::default(), Rc::new(SystemClock))
                    .await
                    .unwrap();
                let mut replicas = Vec::new();
                for p in 0..4 {
                    let log = s
                        .open_log(&format!("t-{p}"), LogConfig::default())
                        .await
                        .unwrap();
                    if p == 2 {
                        std::fs::create_dir(log.dir().join("leader-epoch-checkpoint.tmp")).unwrap();
                    }
                    replicas.push(Replica::open("t", p, log, &cp));
                }
                for r in &replicas {
                    r.reconcile(BrokerId::new(1), &leads(7), 0);
                }
                let mut results = Vec::new();
                for r in &replicas {
                    results.push(r.epochs_durable().await.map_err(|e| e.code));
                }
                let reread: Vec<Option<i32>> = replicas
                    .iter()
                    .map(|r| {
                        let text = std::fs::read_to_string(r.log.dir().join(CHECKPOINT)).ok()?;
                        Some(LeaderEpochCache::decode(&text).unwrap().latest_epoch())
                    })
                    .collect();
                (results, reread)
            })
        });
        let storage_error = Err(ResponseError::KafkaStorageError);
        assert_eq!(results, [Ok(()), Ok(()), storage_error, Ok(())]);
        assert_eq!(reread, [Some(7), Some(7), None, Some(7)]);
    }

    /// A replica retired (its partition deleted, or the shard closing) while queued for
    /// a checkpoint writes nothing more into its directory, and a wait for its history
    /// gives up with a retriable error instead of hanging.
    #[test]
    fn a_retired_replica_writes_no_checkpoint_and_its_waiters_give_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let (waited, written, other) = on_executor(move || {
            Box::pin(async move {
                let cp = Rc::new(CheckpointWriter::default());
                let s = Storage::open(&path, StorageLimits::default(), Rc::new(SystemClock))
                    .await
                    .unwrap();
                let gone = Replica::open(
                    "t",
                    0,
                    s.open_log("t-0", LogConfig::default()).await.unwrap(),
                    &cp,
                );
                let kept = Replica::open(
                    "t",
                    1,
                    s.open_log("t-1", LogConfig::default()).await.unwrap(),
                    &cp,
                );
                // `kept`'s write starts at once; `gone` waits for the next round.
                kept.reconcile(BrokerId::new(1), &leads(4), 0);
                gone.reconcile(BrokerId::new(1), &leads(4), 0);
                gone.retire().await;
                let waited = gone.epochs_durable().await.map_err(|e| e.code);
                // The writer takes the next round as `kept`'s write ends.
                let other = kept.epochs_durable().await.map_err(|e| e.code);
                let written = gone.log.dir().join(CHECKPOINT).exists();
                (waited, written, other)
            })
        });
        assert_eq!(waited, Err(ResponseError::NotLeaderOrFollower));
        assert!(!written, "a retired replica's checkpoint was written");
        assert_eq!(other, Ok(()));
    }

    /// Produce appends keep their arrival order when an earlier one waits: a turn given
    /// back goes to the request queued for it, not to one that arrives meanwhile and
    /// finds nothing to wait for (the e2e keyed round trip once saw a key's records
    /// stored out of order that way, behind a new epoch's checkpoint write).
    #[test]
    fn append_turns_go_in_arrival_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let order = on_executor(move || {
            Box::pin(async move {
                let cp = Rc::new(CheckpointWriter::default());
                let log = new_log(&path).await;
                let r = Replica::open("t", 0, log, &cp);
                let order = Rc::new(RefCell::new(Vec::new()));
                let first = r.append_turn();
                first.wait().await;
                let queued = glommio::spawn_local({
                    let (r, order) = (r.clone(), order.clone());
                    async move {
                        let turn = r.append_turn();
                        turn.wait().await;
                        order.borrow_mut().push("queued");
                    }
                });
                // The queued request asks for its turn while the first holds it.
                futures_lite::future::yield_now().await;
                drop(first);
                // A later request asks before the queued one has run again.
                {
                    let turn = r.append_turn();
                    turn.wait().await;
                    order.borrow_mut().push("later");
                }
                queued.await;
                let order = order.borrow().clone();
                order
            })
        });
        assert_eq!(order, ["queued", "later"]);
    }

    /// The stated policy: a failed checkpoint write fails the replica for good.
    #[test]
    fn a_failed_checkpoint_write_fails_the_replica() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let (first, later) = on_executor(move || {
            Box::pin(async move {
                let cp = Rc::new(CheckpointWriter::default());
                let log = new_log(&path).await;
                // A directory where the checkpoint's temp file must go: the write fails.
                std::fs::create_dir(log.dir().join("leader-epoch-checkpoint.tmp")).unwrap();
                let r = Replica::open("t", 0, log, &cp);
                r.reconcile(BrokerId::new(1), &leads(1), 0);
                let first = r.epochs_durable().await;
                // Nothing changed since, and still refused.
                let later = r.epochs_durable().await;
                (first, later)
            })
        });
        assert_eq!(first.unwrap_err().code, ResponseError::KafkaStorageError);
        assert_eq!(later.unwrap_err().code, ResponseError::KafkaStorageError);
    }
}
