//! The shard's log manager, [`Storage`]: opens and deletes the shard's logs and owns
//! what they share (the tail cache, the read handles of closed segments, the clock),
//! within the shard's budgets: descriptors of active logs
//! ([`StorageLimits::active_logs_max`], beyond it from a shared [`DescriptorPool`]),
//! read handles, reads from disk at once, and the closed segments' index memory. Its
//! background tasks run the passes over every log (retention, compaction, producer
//! expiry, interval flush, index memory); the work on one log is the log's own. The
//! clean stop of every log is in `close.rs`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt};
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use event_listener::Event;
use glommio::io::DmaFile;

use crate::cache::{LogId, TailCache};
use crate::file;
use crate::producer::{ProducerStateTable, PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT};
use crate::segment::{self, RecoveryReport};
use crate::small_files;
use crate::wal::{self, Wal};
use crate::{Clock, DescriptorPool, Error, FlushPolicy, LogConfig, StorageLimits};

use super::recovery::{read_meta_key, recover_dir};
use super::{LogState, PartitionLog};

/// Read handles of closed segments, least recently used closed first. Keyed by path
/// and segment generation, so a handle never outlives the file version it was opened
/// for: compaction swaps files under the same path with a new generation.
pub(super) struct ReadHandles {
    max: usize,
    tick: u64,
    files: HashMap<(PathBuf, u64), (Rc<DmaFile>, u64)>,
}

impl ReadHandles {
    pub(super) fn lookup(&mut self, path: &Path, generation: u64) -> Option<Rc<DmaFile>> {
        self.tick += 1;
        let tick = self.tick;
        let (f, t) = self.files.get_mut(&(path.to_path_buf(), generation))?;
        *t = tick;
        Some(f.clone())
    }

    pub(super) fn insert(&mut self, path: &Path, generation: u64, file: Rc<DmaFile>) {
        while self.files.len() >= self.max {
            let oldest = self
                .files
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.files.remove(&k),
                None => break,
            };
        }
        let tick = self.tick;
        self.files
            .insert((path.to_path_buf(), generation), (file, tick));
    }

    pub(super) fn forget(&mut self, path: &Path) {
        self.files.retain(|(p, _), _| p != path);
    }
}

/// The logs of a shard whose active segment's files are open, least recently appended
/// first: the descriptor budget ([`StorageLimits::active_logs_max`]). Touched on every
/// append (two map updates); a log leaves when its files close.
#[derive(Default)]
pub(super) struct ActiveLogs {
    tick: u64,
    order: BTreeMap<u64, LogId>,
    pub(super) logs: HashMap<LogId, (u64, Weak<PartitionLog>)>,
}

impl ActiveLogs {
    pub(super) fn touch(&mut self, id: LogId, log: &Weak<PartitionLog>) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((old, _)) = self.logs.insert(id, (tick, log.clone())) {
            self.order.remove(&old);
        }
        self.order.insert(tick, id);
    }

    fn forget(&mut self, id: LogId) {
        if let Some((tick, _)) = self.logs.remove(&id) {
            self.order.remove(&tick);
        }
    }

    /// The least recently appended log other than `except` that is idle (no roll,
    /// truncation or close running); it leaves the set. Logs that are gone are dropped
    /// on the way.
    fn take_victim(&mut self, except: Option<LogId>) -> Option<Rc<PartitionLog>> {
        let candidates: Vec<(u64, LogId)> = self.order.iter().map(|(t, id)| (*t, *id)).collect();
        for (tick, id) in candidates {
            if Some(id) == except {
                continue;
            }
            let Some(log) = self.logs.get(&id).and_then(|(_, w)| w.upgrade()) else {
                self.order.remove(&tick);
                self.logs.remove(&id);
                continue;
            };
            if log.busy.get() {
                continue;
            }
            self.order.remove(&tick);
            self.logs.remove(&id);
            return Some(log);
        }
        None
    }
}

/// A log's place in the descriptor budget, reserved while its files open: counted until
/// dropped (by then the log counts among the active ones, or its open failed).
pub(super) struct Opening<'a>(&'a Storage);

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.0.opening.set(self.0.opening.get() - 1);
        self.0.settle();
        self.0.closed_one.notify(usize::MAX);
    }
}

/// The storage of one shard.
pub struct Storage {
    pub(super) dir: PathBuf,
    pub(super) limits: StorageLimits,
    pub(super) cache: RefCell<TailCache>,
    pub(super) handles: RefCell<ReadHandles>,
    clock: Rc<dyn Clock>,
    next_id: Cell<LogId>,
    logs: RefCell<Vec<Weak<PartitionLog>>>,
    pub(super) active: RefCell<ActiveLogs>,
    /// Logs [`Self::make_room`] is closing now (their descriptors are still open).
    pub(super) closing: Cell<usize>,
    /// Logs whose files are being opened, each holding an [`Opening`].
    opening: Cell<usize>,
    /// Fires when one of them has closed, or a reserved place is given back.
    closed_one: Event,
    /// The most logs with open active files at once (closing ones included).
    pub(super) active_peak: Cell<usize>,
    /// Where places beyond [`StorageLimits::active_logs_max`] come from, if anywhere.
    pool: RefCell<Option<Arc<DescriptorPool>>>,
    /// Places this shard holds from `pool` now.
    borrowed: Cell<usize>,
    /// Reads from disk at once: each may hold a descriptor of a closed segment (one the
    /// read handles have evicted meanwhile too), so a fetch of thousands of partitions
    /// must not open them all together.
    pub(super) disk_reads: glommio::sync::Semaphore,
    /// Times a log's active files were opened on demand (its first append after an
    /// open, or after the budget closed them).
    pub(super) reactivations: Cell<u64>,
    /// Logs opened from their clean close's record (`partition.clean`, no segment read)
    /// and logs opened through recovery, since start.
    opened_clean: Cell<u64>,
    opened_recovered: Cell<u64>,
    /// `producer.id.expiration.check.interval.ms` and when the last check ran.
    expiry_check_interval_ms: Cell<u64>,
    last_expiry_check_ms: Cell<i64>,
    /// Advanced by every [`Self::limit_index_memory`] pass; a read stamps the segment
    /// it looks up with it ([`Segment::used`]).
    ///
    /// [`Segment::used`]: crate::segment::Segment::used
    pub(super) index_tick: Cell<u64>,
    /// Closed segments' in-memory index bytes as the last such pass left them.
    index_memory: Cell<u64>,
    /// The shard's journal ([`crate::wal`]), unless turned off.
    pub(super) wal: RefCell<Option<Rc<Wal>>>,
}

/// What one [`Storage::limit_index_memory`] pass found and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IndexSweep {
    /// In-memory index bytes of closed segments before the pass, and after it.
    pub before_bytes: u64,
    pub after_bytes: u64,
    /// Closed segments whose indexes it dropped from memory.
    pub unloaded_segments: u64,
}

/// How often the background task checks the shard's index memory against
/// [`StorageLimits::index_memory_max`]: between passes it can exceed the budget by what
/// reads load in that time.
pub const INDEX_SWEEP_MS: u64 = 5_000;

impl Storage {
    /// Opens the storage of this shard rooted at `dir`. Must run on the shard's executor
    /// before any other DMA file is opened on it (see [`crate::probe`]).
    pub async fn open(
        dir: &Path,
        limits: StorageLimits,
        clock: Rc<dyn Clock>,
    ) -> Result<Rc<Storage>, Error> {
        limits.validate()?;
        file::set_preallocated_max(limits.preallocated_bytes_max);
        file::set_shared_sync_min(limits.shared_sync_min);
        file::set_dsync_logs_max(limits.dsync_logs_max);
        file::set_atomic_writes_max(limits.atomic_writes_max);
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        // glommio opens directories by absolute path only (relative ones fail with EBADF).
        let dir = std::fs::canonicalize(dir).map_err(|e| Error::io(dir, e))?;
        crate::probe::prime_device(&dir).await?;
        // Recovery will count every valid byte it reads as durable, but a process that
        // died (SIGKILL, a panic) may have left completed writes it never synced: in
        // the page cache or only in the device's volatile cache, where a reader sees
        // them and a power loss drops them. A recovery that cuts a torn or padded tail
        // syncs that file anyway; a log ending on a page boundary, the small files
        // (leader-epoch checkpoints, producer snapshots, `partition.clean`) and renames
        // have no such sync. One `syncfs` before any log opens makes all of them
        // durable, so what this replica reports as held survives a power loss after
        // the restart too. A failing file system fails the start (what is on it is
        // then unknown), though the kernel reports a write-back error once: a second
        // start would not see it.
        small_files::FileSystem::open(&dir).await.sync().await?;
        let storage = Rc::new(Storage {
            dir,
            cache: RefCell::new(TailCache::new(limits.tail_cache_bytes)),
            handles: RefCell::new(ReadHandles {
                max: limits.open_segment_files_max,
                tick: 0,
                files: HashMap::new(),
            }),
            disk_reads: glommio::sync::Semaphore::new(
                (limits.open_segment_files_max as u64 / 2).max(1),
            ),
            limits,
            next_id: Cell::new(1),
            logs: RefCell::new(Vec::new()),
            active: RefCell::new(ActiveLogs::default()),
            closing: Cell::new(0),
            opening: Cell::new(0),
            closed_one: Event::new(),
            active_peak: Cell::new(0),
            pool: RefCell::new(None),
            borrowed: Cell::new(0),
            reactivations: Cell::new(0),
            opened_clean: Cell::new(0),
            opened_recovered: Cell::new(0),
            expiry_check_interval_ms: Cell::new(PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT),
            last_expiry_check_ms: Cell::new(clock.now_ms()),
            index_tick: Cell::new(1),
            index_memory: Cell::new(0),
            clock,
            wal: RefCell::new(None),
        });
        // The previous run's journals, before any log opens for use (a log opened
        // meanwhile would not see what they hold).
        storage.replay_journals().await?;
        if storage.limits.journal_chunk_bytes > 0 {
            let dir = wal::dir_of(&storage.dir, storage.limits.shard);
            let total = file::space_of(&storage.dir)
                .map_err(|e| Error::io(&storage.dir, e))?
                .total;
            let chunk_bytes = wal::chunk_bytes_for(
                storage.limits.journal_chunk_bytes,
                total,
                storage.limits.shards,
            );
            if chunk_bytes < storage.limits.journal_chunk_bytes {
                tracing::info!(
                    chunk_bytes,
                    file_system_bytes = total,
                    "shard journal chunks made smaller to fit the data directory's file system"
                );
            }
            let journal = Wal::new(dir, chunk_bytes, storage.limits.write_bytes_max)?;
            *storage.wal.borrow_mut() = Some(journal);
        }
        Ok(storage)
    }

    /// The shard's journal, if it keeps one.
    pub fn journal(&self) -> Option<Rc<Wal>> {
        self.wal.borrow().clone()
    }

    /// Logs whose active segment's files are open now.
    pub fn active_logs(&self) -> usize {
        self.active.borrow().logs.len()
    }

    /// The most logs that had their active segment's files open at once, those being
    /// closed to make room included: what the descriptor budget bounds.
    pub fn active_logs_peak(&self) -> usize {
        self.active_peak.get()
    }

    /// Logs counted against the budget now: with open active files, being closed
    /// (descriptors still open until the close returns), or being opened.
    fn in_use(&self) -> usize {
        self.active.borrow().logs.len() + self.closing.get() + self.opening.get()
    }

    /// Lets this shard hold active logs beyond its own share
    /// ([`StorageLimits::active_logs_max`]) with descriptors from `pool`, shared with
    /// the process's other shards (and its connections). Set once, at start-up.
    pub fn share_descriptors(&self, pool: Arc<DescriptorPool>) {
        *self.pool.borrow_mut() = Some(pool);
    }

    pub fn shared_descriptors(&self) -> Option<Arc<DescriptorPool>> {
        self.pool.borrow().clone()
    }

    /// The most logs this shard can have open at once: its own share and the whole
    /// shared pool.
    pub fn active_logs_allowed(&self) -> usize {
        self.limits.active_logs_max + self.pool.borrow().as_ref().map_or(0, |p| p.capacity())
    }

    /// One more place from the shared pool, if there is one left.
    fn borrow_place(&self) -> bool {
        let taken = self.pool.borrow().as_ref().is_some_and(|p| p.try_take());
        if taken {
            self.borrowed.set(self.borrowed.get() + 1);
        }
        taken
    }

    /// Gives the shared pool back the places the logs in use no longer need. Called
    /// whenever fewer logs count: a log forgotten before its close returns is given
    /// back a little early, which the process's reserve covers.
    fn settle(&self) {
        let needed = self.in_use().saturating_sub(self.limits.active_logs_max);
        while self.borrowed.get() > needed {
            self.borrowed.set(self.borrowed.get() - 1);
            if let Some(p) = self.pool.borrow().as_ref() {
                p.give_back();
            }
        }
    }

    /// Takes log `id` out of the logs with open active files.
    pub(super) fn forget_active(&self, id: LogId) {
        self.active.borrow_mut().forget(id);
        self.settle();
    }

    /// Reserves one log's place in [`StorageLimits::active_logs_max`] (or, beyond it, in
    /// the shared pool) for opening its files, else first closes the files of the least
    /// recently appended idle logs of this shard. Many
    /// appends reopening logs at once (a produce spread over thousands of partitions)
    /// wait for closes to finish instead of opening past the process's limit. Only if
    /// every open log is busy and nothing is closing or opening is the budget exceeded
    /// for a moment rather than an append refused.
    pub(super) async fn make_room(&self, except: Option<LogId>) -> Opening<'_> {
        loop {
            let victim = {
                let own = self.limits.active_logs_max + self.borrowed.get();
                if self.in_use() < own || self.borrow_place() {
                    return self.reserve();
                }
                self.active.borrow_mut().take_victim(except)
            };
            let Some(log) = victim else {
                if self.closing.get() == 0 && self.opening.get() == 0 {
                    return self.reserve();
                }
                let freed = self.closed_one.listen();
                if self.in_use() < self.limits.active_logs_max + self.borrowed.get() {
                    continue;
                }
                freed.await;
                continue;
            };
            self.closing.set(self.closing.get() + 1);
            let closed = log.deactivate().await;
            self.closing.set(self.closing.get() - 1);
            self.settle();
            self.closed_one.notify(usize::MAX);
            // A failure fails that log (and is reported by it), not this one.
            if let Err(e) = closed {
                tracing::warn!(log = %log.name, error = %e, "closing an idle log's files failed");
            }
        }
    }

    fn reserve(&self) -> Opening<'_> {
        self.opening.set(self.opening.get() + 1);
        self.active_peak
            .set(self.active_peak.get().max(self.in_use()));
        Opening(self)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn limits(&self) -> &StorageLimits {
        &self.limits
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    pub fn cache_used_bytes(&self) -> usize {
        self.cache.borrow().used_bytes()
    }

    /// Times a log's active segment files were opened on demand (see
    /// [`StorageLimits::active_logs_max`]).
    pub fn reactivations(&self) -> u64 {
        self.reactivations.get()
    }

    /// Logs opened since start from their clean close's record (no segment read, no
    /// recovery), and logs opened through recovery (no valid record: a crash, a failed
    /// close, or a new partition).
    pub fn logs_opened(&self) -> (u64, u64) {
        (self.opened_clean.get(), self.opened_recovered.get())
    }

    /// Bytes the shard's segment files hold preallocated but not yet written (bounded
    /// by [`StorageLimits::preallocated_bytes_max`]).
    pub fn preallocated_unwritten_bytes(&self) -> u64 {
        file::preallocated_unwritten()
    }

    /// Opens (recovering) or creates the log in directory `name` under the data dir.
    ///
    /// Opening holds no descriptor afterwards: the active segment's files open with the
    /// first append (within [`StorageLimits::active_logs_max`]). A log closed cleanly
    /// (its `partition.clean` matching the directory) reads no segment at all: its
    /// segments are recovered one by one when first read, and the producer state comes
    /// from the snapshot the close wrote. Otherwise every segment is recovered now
    /// (the table in [`crate::segment`]).
    pub async fn open_log(
        self: &Rc<Self>,
        name: &str,
        config: LogConfig,
    ) -> Result<Rc<PartitionLog>, Error> {
        let (log, _) = self.open_log_with_report(name, config).await?;
        Ok(log)
    }

    pub async fn open_log_with_report(
        self: &Rc<Self>,
        name: &str,
        config: LogConfig,
    ) -> Result<(Rc<PartitionLog>, RecoveryReport), Error> {
        config.validate()?;
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let mut report = RecoveryReport::default();
        let found = recover_dir(&dir, self, &config, &mut report).await?;
        let opened = if found.clean {
            &self.opened_clean
        } else {
            &self.opened_recovered
        };
        opened.set(opened.get() + 1);
        let log_start = found.log_start;
        let segments = found.segments;
        let clean_offset = read_meta_key(&dir, "clean_offset")?
            .unwrap_or(0)
            .max(log_start);
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let log = Rc::new_cyclic(|me| PartitionLog {
            id,
            me: me.clone(),
            name: name.to_string(),
            dir,
            storage: self.clone(),
            config: RefCell::new(config),
            state: RefCell::new(LogState {
                segments,
                log_start,
                clean_offset,
            }),
            busy: Cell::new(false),
            idle_event: Event::new(),
            append_event: Event::new(),
            last_flush_ms: Cell::new(self.now_ms()),
            closed: Cell::new(false),
            failure: RefCell::default(),
            leader_fence: RefCell::new(None),
            remote_end: Cell::new(i64::MIN),
            on_change: RefCell::new(None),
            swapping: Cell::new(None),
            compacting: Cell::new(false),
            meta_writing: Cell::new(false),
            meta_dirty: Cell::new(false),
            producers: RefCell::new(ProducerStateTable::default()),
            snapshots: RefCell::new(found.snapshots),
            clean_marker: Cell::new(found.clean),
            last_journaled: RefCell::new(None),
            unjournaled: Cell::new(0),
            unjournaled_synced: Cell::new(0),
            last_journaled_ms: Cell::new(0),
            idle_watched: Cell::new(false),
        });
        // R15–R19: the producer state and the `.txnindex` entries it derives.
        let limit = found.txn_damaged_from.unwrap_or(i64::MAX);
        log.rebuild_producer_state(limit, &mut report).await?;
        log.touch_active();
        {
            let mut logs = self.logs.borrow_mut();
            logs.retain(|w| w.strong_count() > 0);
            logs.push(Rc::downgrade(&log));
        }
        // Reopened after a failure: what this run's journal holds for it and its
        // segment files may lack.
        if let Some(journal) = self.journal() {
            let ops = journal.records_for(name).await?;
            if !ops.is_empty() {
                let r = log.replay(ops).await?;
                tracing::info!(
                    log = name,
                    appended = r.appended,
                    already_there = r.skipped,
                    cuts = r.cut,
                    "replayed the shard journal into a reopened log"
                );
            }
            journal.forget_failed(name);
        }
        Ok((log, report))
    }

    /// Closes `log` and deletes its directory. A failed log (see
    /// [`PartitionLog::failure`]) is deleted too: deleting a topic must free its space
    /// even when its disk is full or failing.
    pub async fn delete_log(&self, log: &Rc<PartitionLog>) -> Result<(), Error> {
        // Recorded before the directory goes: a replay must not put what the journal
        // holds for it into a new log of the same name.
        if let Err(e) = log.journal_op(crate::wal::Op::Delete).await {
            tracing::warn!(log = %log.name, error = %e, "the deletion could not be journaled; the directory goes anyway (a replay skips logs whose directory is gone)");
        }
        if let Err(e) = log.close().await {
            if log.failure().is_none() {
                return Err(e);
            }
        }
        self.cache.borrow_mut().invalidate(log.id);
        let bases: Vec<i64> = log
            .state
            .borrow()
            .segments
            .iter()
            .map(|s| s.base_offset)
            .collect();
        for b in bases {
            self.handles
                .borrow_mut()
                .forget(&log.dir.join(segment::file_name(b, "log")));
        }
        std::fs::remove_dir_all(&log.dir).map_err(|e| Error::io(&log.dir, e))?;
        file::sync_dir(&self.dir).await
    }

    fn live_logs(&self) -> Vec<Rc<PartitionLog>> {
        self.logs
            .borrow()
            .iter()
            .filter_map(|w| w.upgrade())
            .collect()
    }

    /// The open logs a background pass works on, those `wanted` picks (asked first: a
    /// pass over 10,000 logs every 100 ms collects only the few it works on). Failed
    /// ones are left alone (the broker reopens them), so one failed partition neither
    /// stops the pass for the others nor floods the log with its error.
    fn working_logs(&self, wanted: impl Fn(&PartitionLog) -> bool) -> Vec<Rc<PartitionLog>> {
        self.logs
            .borrow()
            .iter()
            .filter_map(|w| w.upgrade())
            .filter(|l| wanted(l) && !l.closed.get() && l.failure().is_none())
            .collect()
    }

    /// One retention pass over every open log of this shard that is not failed. A log
    /// whose pass fails does not stop the others; the first error is returned after.
    pub async fn enforce_retention(&self) -> Result<u32, Error> {
        let mut deleted = 0;
        let mut first_err = None;
        for log in self.working_logs(|_| true) {
            match log.enforce_retention().await {
                Ok(n) => deleted += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(deleted), Err)
    }

    /// One compaction pass over every open log with `cleanup.policy` compact that is
    /// not failed; errors as in [`Storage::enforce_retention`].
    pub async fn compact_all(&self) -> Result<u32, Error> {
        let (cleaned, first_err) = self.compact_round().await;
        first_err.map_or(Ok(cleaned), Err)
    }

    /// One cleaner round over every log: how many were cleaned, and the first error
    /// (a failing log does not hide the others' work from the cleaner loop).
    async fn compact_round(&self) -> (u32, Option<Error>) {
        let mut cleaned = 0;
        let mut first_err = None;
        for log in self.working_logs(|_| true) {
            match log.compact().await {
                Ok(Some(_)) => cleaned += 1,
                Ok(None) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        (cleaned, first_err)
    }

    /// Forgets, in every open log, the producers idle for longer than the log's
    /// `producer.id.expiration.ms`; returns how many. The background loop runs this
    /// every `producer.id.expiration.check.interval.ms` (see
    /// [`Storage::set_producer_expiration_check_interval_ms`]).
    pub fn expire_producers(&self) -> usize {
        let now = self.now_ms();
        self.last_expiry_check_ms.set(now);
        self.live_logs()
            .iter()
            .filter(|l| !l.closed.get())
            .map(|l| l.expire_producers(now))
            .sum()
    }

    /// Kafka's `producer.id.expiration.check.interval.ms` (default 600000): how often
    /// the background loop expires producers. Checked on each retention pass, so it is
    /// effectively at least `retention_check_ms`.
    pub fn set_producer_expiration_check_interval_ms(&self, ms: u64) {
        self.expiry_check_interval_ms.set(ms);
    }

    /// Expires producers if the check interval has passed since the last check.
    fn expire_producers_if_due(&self) -> usize {
        let due = self.now_ms() - self.last_expiry_check_ms.get()
            >= self.expiry_check_interval_ms.get() as i64;
        if due {
            self.expire_producers()
        } else {
            0
        }
    }

    /// Syncs every log (not failed) whose `flush.ms` interval has elapsed; errors as
    /// in [`Storage::enforce_retention`].
    pub async fn flush_due(&self) -> Result<(), Error> {
        let now = self.now_ms();
        let due = self.working_logs(|l| match l.config.borrow().flush {
            FlushPolicy::IntervalMs(ms) => now - l.last_flush_ms.get() >= ms as i64,
            _ => false,
        });
        let mut first_err = None;
        for log in due {
            if let Err(e) = log.flush().await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Keeps the in-memory offset and time indexes of the shard's closed segments
    /// within [`StorageLimits::index_memory_max`]: over it, the segments read least
    /// recently lose theirs (read back from their files, which hold exactly those
    /// entries, on next use; see [`Segment::unload_indexes`]) until the rest fit. The
    /// active segments' indexes are left alone: they are written only when sealed. A
    /// log busy with another operation is skipped until the next pass.
    ///
    /// [`Segment::unload_indexes`]: crate::segment::Segment::unload_indexes
    pub fn limit_index_memory(&self) -> IndexSweep {
        self.index_tick.set(self.index_tick.get() + 1);
        let mut candidates = Vec::new();
        let mut total = 0;
        for log in self.live_logs() {
            let st = log.state.borrow();
            let last = st.segments.len().saturating_sub(1);
            for s in &st.segments[..last] {
                if s.loaded && !s.indexes_dirty && s.active.is_none() {
                    let bytes = s.index_memory();
                    total += bytes;
                    candidates.push((
                        s.used.get(),
                        log.clone(),
                        s.base_offset,
                        s.generation,
                        bytes,
                    ));
                }
            }
        }
        let mut sweep = IndexSweep {
            before_bytes: total,
            after_bytes: total,
            unloaded_segments: 0,
        };
        let max = self.limits.index_memory_max;
        if total <= max {
            self.index_memory.set(total);
            return sweep;
        }
        candidates.sort_by_key(|c| c.0);
        for (_, log, base, generation, bytes) in candidates {
            if total <= max {
                break;
            }
            if log.unload_segment(base, generation) {
                total -= bytes;
                sweep.unloaded_segments += 1;
            }
        }
        sweep.after_bytes = total;
        self.index_memory.set(total);
        sweep
    }

    /// Closed segments' in-memory index bytes as the last
    /// [`Self::limit_index_memory`] pass left them.
    pub fn index_memory(&self) -> u64 {
        self.index_memory.get()
    }

    /// Spawns the background retention-and-producer-expiry, compaction, interval-flush
    /// and index-memory loops on a low-share task queue of the current executor, so they
    /// yield to appends and fetches.
    ///
    /// Compaction runs as Kafka's log cleaner does: a round over every log (each cleans
    /// all its closed segments whose dirty ratio calls for it, see
    /// [`Storage::compact_all`]), the next round at once after one that cleaned
    /// something, and after an idle one a rest of `cleaner_backoff_ms`
    /// (log.cleaner.backoff.ms). So a compacted log's segment is cleaned within about
    /// `cleaner_backoff_ms` of its roll.
    pub fn spawn_background(
        self: &Rc<Self>,
        retention_check_ms: u64,
        cleaner_backoff_ms: u64,
        flush_check_ms: u64,
    ) -> Result<(), Error> {
        let tq = glommio::executor().create_task_queue(
            glommio::Shares::Static(25),
            glommio::Latency::NotImportant,
            "storage-background",
        );
        let weak = Rc::downgrade(self);
        glommio::spawn_local_into(
            async move {
                loop {
                    glommio::timer::sleep(Duration::from_millis(retention_check_ms)).await;
                    let Some(s) = weak.upgrade() else { break };
                    if let Err(e) = s.enforce_retention().await {
                        tracing::error!(error = %e, "retention pass failed");
                    }
                    let expired = s.expire_producers_if_due();
                    if expired > 0 {
                        tracing::info!(expired, "expired idle producer ids");
                    }
                }
            },
            tq,
        )
        .map_err(|e| Error::Config(format!("spawning retention task: {e}")))?
        .detach();
        let weak = Rc::downgrade(self);
        glommio::spawn_local_into(
            async move {
                loop {
                    let cleaned = {
                        let Some(s) = weak.upgrade() else { break };
                        let (n, failed) = s.compact_round().await;
                        if let Some(e) = failed {
                            tracing::error!(error = %e, "compaction pass failed");
                        }
                        n
                    };
                    // After a round that cleaned, the next at once (a round cut
                    // short by the key map's budget continues); a short pause still
                    // lets a log that keeps reporting work not spin the task queue.
                    let rest = if cleaned > 0 {
                        Duration::from_millis(cleaner_backoff_ms.min(100))
                    } else {
                        Duration::from_millis(cleaner_backoff_ms)
                    };
                    glommio::timer::sleep(rest).await;
                }
            },
            tq,
        )
        .map_err(|e| Error::Config(format!("spawning compaction task: {e}")))?
        .detach();
        let weak = Rc::downgrade(self);
        glommio::spawn_local_into(
            async move {
                loop {
                    glommio::timer::sleep(Duration::from_millis(flush_check_ms)).await;
                    let Some(s) = weak.upgrade() else { break };
                    if let Err(e) = s.flush_due().await {
                        tracing::error!(error = %e, "interval flush failed");
                    }
                }
            },
            tq,
        )
        .map_err(|e| Error::Config(format!("spawning flush task: {e}")))?
        .detach();
        let weak = Rc::downgrade(self);
        glommio::spawn_local_into(
            async move {
                loop {
                    glommio::timer::sleep(Duration::from_millis(INDEX_SWEEP_MS)).await;
                    let Some(s) = weak.upgrade() else { break };
                    let sweep = s.limit_index_memory();
                    if sweep.unloaded_segments > 0 {
                        tracing::debug!(?sweep, "dropped closed segments' indexes from memory");
                    }
                }
            },
            tq,
        )
        .map_err(|e| Error::Config(format!("spawning index-memory task: {e}")))?
        .detach();
        let weak = Rc::downgrade(self);
        glommio::spawn_local_into(
            async move {
                loop {
                    glommio::timer::sleep(Duration::from_millis(wal::IDLE_CHECK_MS)).await;
                    let Some(s) = weak.upgrade() else { break };
                    if let Some(j) = s.journal() {
                        j.write_behind_idle(s.now_ms(), wal::IDLE_WRITE_BEHIND_MS);
                    }
                }
            },
            tq,
        )
        .map_err(|e| Error::Config(format!("spawning journal write-behind task: {e}")))?
        .detach();
        Ok(())
    }
}
