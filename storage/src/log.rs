//! A partition log ([`PartitionLog`]) and the per-shard [`Storage`] that opens logs and
//! owns what they share: the tail cache, the read-handle cache of closed segments, the
//! clock, and the background retention, compaction, producer-expiry and interval-flush
//! tasks.
//!
//! `partition.meta` holds `log_start_offset=N` (one `key=value` a line, written
//! atomically) so that `delete_records_before` and retention survive restarts.
//!
//! ## Producer state and snapshots
//!
//! Every log keeps its producer state ([`crate::producer`]) up to date with every
//! append, built when the log is opened. `<offset, 20 digits>.snapshot` files hold the
//! state as it was below `offset` (format in [`crate::producer`]), written atomically
//! (temp file, fdatasync, rename, directory fsync):
//!
//! - when a segment rolls, at the new segment's base (after the old segment, its
//!   `.txnindex` included, is sealed);
//! - when the log is closed, at the log end;
//! - after a recovery that had to replay more than the active segment, at the active
//!   segment's base.
//!
//! Opening loads the newest snapshot at or below the recovered log end and replays
//! only the batches after it (recovery rows R16–R19 in [`crate::segment`]). A
//! truncation deletes the snapshots above the new end and rebuilds the same way;
//! `reset_to` deletes them all; retention and DeleteRecords delete the snapshots below
//! the newest one at or below the new log start (which keeps the state of producers
//! whose batches are gone, as Kafka does).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use event_listener::{Event, EventListener};
use glommio::io::DmaFile;

use crate::batch::{self, BatchError};
use crate::cache::{CachedBatch, LogId, TailCache};
use crate::compact::{self, AbortedSet, Filtered, KeyMap, MarkerTracker};
use crate::fault::{self, FaultOp};
use crate::file;
use crate::index::AbortedTxn;
use crate::producer::{
    BatchMeta, CompletedTxn, ProducerStateTable, TxnError, Verdict,
    PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT,
};
use crate::segment::{self, RecoveryReport, Segment};
use crate::small_files::{self, FileWrite};
use crate::{Clock, DescriptorPool, Error, FlushPolicy, LogConfig, StorageLimits, TimestampType};

const META_FILE: &str = "partition.meta";

/// Written by a clean close, last: every segment's base, next offset, size and largest
/// timestamp. While it exists and the `.log` files are the ones it lists with those
/// sizes, opening the log reads no segment (see [`Storage::open_log`]). The first change
/// to any of the log's files after an open removes it (durably) first.
const CLEAN_FILE: &str = "partition.clean";
const CLEAN_HEADER: &str = "sluice-clean-v1";

/// `<offset, 20 digits>.snapshot`: a producer-state snapshot valid below `offset`.
pub fn snapshot_file_name(offset: i64) -> String {
    segment::file_name(offset, "snapshot")
}

/// Parses a snapshot file name into its offset.
pub fn parse_snapshot_name(name: &str) -> Option<i64> {
    let stem = name.strip_suffix(".snapshot")?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// The result of an append: the offsets the batch was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: i64,
    pub last_offset: i64,
    /// The broker's timestamp for LogAppendTime topics, -1 for CreateTime.
    pub log_append_time_ms: i64,
    pub record_count: i32,
}

/// What one compaction pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactStats {
    pub segments_rewritten: u32,
    pub segments_removed: u32,
    pub records_removed: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Everything below this offset is now clean.
    pub clean_offset: i64,
}

/// A closed segment as the cleaner saw it when it started.
#[derive(Debug, Clone, Copy)]
struct CleanCandidate {
    base: i64,
    size: u64,
    next_offset: i64,
    generation: u64,
}

/// The state of one compaction pass over the cleanable segments, oldest first.
struct CleanPass {
    /// The latest offset of every key in the dirty segments.
    map: KeyMap,
    /// Tombstones and markers older than this may go (`delete.retention.ms`).
    horizon: i64,
    aborted: AbortedSet,
    /// Batches the producer state remembers.
    keeps: crate::producer::CleanerKeeps,
    markers: MarkerTracker,
}

impl CleanPass {
    /// What stays of batch `b` (header `h`), and whether that differs from `b`. Notes
    /// the offsets of the ABORT markers that stay in `kept_aborts`.
    fn clean_batch(
        &mut self,
        h: &batch::BatchHeader,
        b: Bytes,
        kept_aborts: &mut std::collections::HashSet<i64>,
    ) -> (Option<Bytes>, bool) {
        if h.is_control() {
            let marker = batch::parse_end_txn_marker(&b);
            let data_gone = self.markers.on_marker(h, marker);
            if data_gone && h.max_timestamp < self.horizon && !self.keeps.keeps(h) {
                return (None, true);
            }
            if marker.is_some_and(|m| !m.commit) {
                kept_aborts.insert(h.base_offset);
            }
            return (Some(b), false);
        }
        let aborted = self.aborted.covering(h);
        self.markers.on_data(h, aborted);
        let filtered = if aborted.is_some() || h.record_count == 0 {
            // An aborted transaction's records all go; an emptied batch has none.
            Filtered::Dropped
        } else {
            compact::filter_batch(&b, |r| compact::keep_record(&self.map, r, self.horizon))
        };
        match filtered {
            Filtered::Unchanged => (Some(b), false),
            Filtered::Rewritten(v) => (Some(Bytes::from(v)), true),
            // A batch the producer state remembers stays, empty.
            Filtered::Dropped if self.keeps.keeps(h) => {
                if h.record_count == 0 {
                    (Some(b), false)
                } else {
                    (Some(Bytes::from(batch::emptied(&b))), true)
                }
            }
            Filtered::Dropped => (None, true),
        }
    }
}

/// Whole batches read from a log.
#[derive(Debug, Clone, Default)]
pub struct ReadResult {
    /// Concatenated batches, verbatim as stored.
    pub records: Bytes,
    /// Offset after the last batch returned (= the requested offset if none).
    pub next_offset: i64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
}

/// Read handles of closed segments, least recently used closed first. Keyed by path
/// and segment generation, so a handle never outlives the file version it was opened
/// for: compaction swaps files under the same path with a new generation.
struct ReadHandles {
    max: usize,
    tick: u64,
    files: HashMap<(PathBuf, u64), (Rc<DmaFile>, u64)>,
}

impl ReadHandles {
    fn lookup(&mut self, path: &Path, generation: u64) -> Option<Rc<DmaFile>> {
        self.tick += 1;
        let tick = self.tick;
        let (f, t) = self.files.get_mut(&(path.to_path_buf(), generation))?;
        *t = tick;
        Some(f.clone())
    }

    fn insert(&mut self, path: &Path, generation: u64, file: Rc<DmaFile>) {
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

    fn forget(&mut self, path: &Path) {
        self.files.retain(|(p, _), _| p != path);
    }
}

/// The logs of a shard whose active segment's files are open, least recently appended
/// first: the descriptor budget ([`StorageLimits::active_logs_max`]). Touched on every
/// append (two map updates); a log leaves when its files close.
#[derive(Default)]
struct ActiveLogs {
    tick: u64,
    order: BTreeMap<u64, LogId>,
    logs: HashMap<LogId, (u64, Weak<PartitionLog>)>,
}

impl ActiveLogs {
    fn touch(&mut self, id: LogId, log: &Weak<PartitionLog>) {
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

async fn open_read(path: &Path) -> Result<Rc<DmaFile>, Error> {
    fault::check_io(path, FaultOp::Open)?;
    Ok(Rc::new(
        glommio::io::OpenOptions::new()
            .read(true)
            .dma_open(path)
            .await
            .map_err(|e| Error::io(path, e))?,
    ))
}

/// A log's place in the descriptor budget, reserved while its files open: counted until
/// dropped (by then the log counts among the active ones, or its open failed).
struct Opening<'a>(&'a Storage);

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.0.opening.set(self.0.opening.get() - 1);
        self.0.settle();
        self.0.closed_one.notify(usize::MAX);
    }
}

/// The storage of one shard.
pub struct Storage {
    dir: PathBuf,
    limits: StorageLimits,
    cache: RefCell<TailCache>,
    handles: RefCell<ReadHandles>,
    clock: Rc<dyn Clock>,
    next_id: Cell<LogId>,
    logs: RefCell<Vec<Weak<PartitionLog>>>,
    active: RefCell<ActiveLogs>,
    /// Logs [`Self::make_room`] is closing now (their descriptors are still open).
    closing: Cell<usize>,
    /// Logs whose files are being opened, each holding an [`Opening`].
    opening: Cell<usize>,
    /// Fires when one of them has closed, or a reserved place is given back.
    closed_one: Event,
    /// The most logs with open active files at once (closing ones included).
    active_peak: Cell<usize>,
    /// Where places beyond [`StorageLimits::active_logs_max`] come from, if anywhere.
    pool: RefCell<Option<Arc<DescriptorPool>>>,
    /// Places this shard holds from `pool` now.
    borrowed: Cell<usize>,
    /// Reads from disk at once: each may hold a descriptor of a closed segment (one the
    /// read handles have evicted meanwhile too), so a fetch of thousands of partitions
    /// must not open them all together.
    disk_reads: glommio::sync::Semaphore,
    /// Times a log's active files were opened on demand (its first append after an
    /// open, or after the budget closed them).
    reactivations: Cell<u64>,
    /// Logs opened from their clean close's record (`partition.clean`, no segment read)
    /// and logs opened through recovery, since start.
    opened_clean: Cell<u64>,
    opened_recovered: Cell<u64>,
    /// `producer.id.expiration.check.interval.ms` and when the last check ran.
    expiry_check_interval_ms: Cell<u64>,
    last_expiry_check_ms: Cell<i64>,
    /// Advanced by every [`Self::limit_index_memory`] pass; a read stamps the segment
    /// it looks up with it ([`Segment::used`]).
    index_tick: Cell<u64>,
    /// Closed segments' in-memory index bytes as the last such pass left them.
    index_memory: Cell<u64>,
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
        Ok(Rc::new(Storage {
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
        }))
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
    fn forget_active(&self, id: LogId) {
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
    async fn make_room(&self, except: Option<LogId>) -> Opening<'_> {
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
            failure: RefCell::new(None),
            leader_fence: RefCell::new(None),
            swapping: Cell::new(None),
            compacting: Cell::new(false),
            meta_writing: Cell::new(false),
            meta_dirty: Cell::new(false),
            producers: RefCell::new(ProducerStateTable::default()),
            snapshots: RefCell::new(found.snapshots),
            clean_marker: Cell::new(found.clean),
        });
        // R15–R19: the producer state and the `.txnindex` entries it derives.
        let limit = found.txn_damaged_from.unwrap_or(i64::MAX);
        log.rebuild_producer_state(limit, &mut report).await?;
        log.touch_active();
        let mut logs = self.logs.borrow_mut();
        logs.retain(|w| w.strong_count() > 0);
        logs.push(Rc::downgrade(&log));
        Ok((log, report))
    }

    /// Closes `log` and deletes its directory. A failed log (see
    /// [`PartitionLog::failure`]) is deleted too: deleting a topic must free its space
    /// even when its disk is full or failing.
    pub async fn delete_log(&self, log: &Rc<PartitionLog>) -> Result<(), Error> {
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

    /// The open logs a background pass works on: failed ones are left alone (the
    /// broker reopens them), so one failed partition neither stops the pass for the
    /// others nor floods the log with its error.
    fn working_logs(&self) -> Vec<Rc<PartitionLog>> {
        self.live_logs()
            .into_iter()
            .filter(|l| !l.closed.get() && l.failure().is_none())
            .collect()
    }

    /// One retention pass over every open log of this shard that is not failed. A log
    /// whose pass fails does not stop the others; the first error is returned after.
    pub async fn enforce_retention(&self) -> Result<u32, Error> {
        let mut deleted = 0;
        let mut first_err = None;
        for log in self.working_logs() {
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
        let mut cleaned = 0;
        let mut first_err = None;
        for log in self.working_logs() {
            match log.compact().await {
                Ok(Some(_)) => cleaned += 1,
                Ok(None) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(cleaned), Err)
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
        let mut first_err = None;
        for log in self.working_logs() {
            if let FlushPolicy::IntervalMs(ms) = log.config().flush {
                if now - log.last_flush_ms.get() >= ms as i64 {
                    if let Err(e) = log.flush().await {
                        first_err.get_or_insert(e);
                    }
                }
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

    /// Spawns the background retention-compaction-and-producer-expiry, interval-flush
    /// and index-memory loops on a low-share task queue of the current executor, so they
    /// yield to appends and fetches.
    pub fn spawn_background(
        self: &Rc<Self>,
        retention_check_ms: u64,
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
                    if let Err(e) = s.compact_all().await {
                        tracing::error!(error = %e, "compaction pass failed");
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
        Ok(())
    }
}

/// Logs one round of a clean stop closes together ([`Storage::close_logs`]): each round
/// ends with one file-system sync, so fewer, larger rounds sync less; the bound keeps
/// the files a round holds in memory (indexes, snapshots) small.
const CLOSE_ROUND_LOGS: usize = 1024;

/// Logs of a round that run their first step ([`PartitionLog::close_begin`]) at once:
/// each may wait on a sync of its `.log` (data not yet durable) and on its trim.
const CLOSE_LANES: usize = 32;

/// What a log's clean close still writes after [`PartitionLog::close_begin`].
struct RoundClose {
    /// Indexes, `.txnindex` and the producer snapshot.
    writes: Vec<FileWrite>,
    /// The snapshot's offset, if one is among `writes`.
    snapshot: Option<i64>,
    /// `partition.clean`, written only once the `writes` are durable.
    marker: FileWrite,
}

/// What [`Storage::close_logs`] did.
#[derive(Debug, Default)]
pub struct CloseReport {
    /// Logs now marked clean (`partition.clean` written and synced).
    pub marked_clean: usize,
    /// Logs that needed nothing: unchanged since a clean open, or closed already.
    pub unchanged: usize,
    /// Logs whose close failed, with the error: they are recovered when next opened.
    pub failed: Vec<(String, Error)>,
    /// File-system syncs made (one per round, and one for the last round's records).
    pub fs_syncs: u32,
    /// Time spent in each step, over all rounds: making the `.log`s durable and trimming
    /// them, writing the indexes and snapshots, the syncs, writing the records.
    pub begin: Duration,
    pub write: Duration,
    pub sync: Duration,
    pub records: Duration,
}

impl Storage {
    /// Closes `logs` for a clean stop (every log of the shard) with one file-system
    /// sync per round of [`CLOSE_ROUND_LOGS`] logs instead of syncs per file: each log's
    /// `.log` is made durable and trimmed, the round's indexes and producer snapshots
    /// are written without syncs ([`crate::small_files`]), one `syncfs` makes them
    /// durable, and only then are the round's `partition.clean` records written; the
    /// next round's sync (or a last one) makes those durable. So a record on disk only
    /// ever describes durable files, as with [`PartitionLog::close`], which closes one
    /// log with a sync per file (a lone close should not write back the whole file
    /// system). A log whose close fails is failed and left without a record: its next
    /// open recovers it.
    pub async fn close_logs(&self, logs: Vec<Rc<PartitionLog>>) -> CloseReport {
        let mut report = CloseReport::default();
        // Opened before the first write its syncs answer for (see `FileSystem`).
        let fs = small_files::FileSystem::open(&self.dir).await;
        let mut unsynced_records = false;
        let mut logs = logs.into_iter().peekable();
        while logs.peek().is_some() {
            let round: Vec<Rc<PartitionLog>> = logs.by_ref().take(CLOSE_ROUND_LOGS).collect();
            let t = std::time::Instant::now();
            let begun = begin_round(round).await;
            report.begin += t.elapsed();
            let mut pending = Vec::with_capacity(begun.len());
            for (log, res) in begun {
                match res {
                    Ok(Some(close)) => pending.push((log, close)),
                    Ok(None) => report.unchanged += 1,
                    Err(e) => report.failed.push((log.name.clone(), e)),
                }
            }
            if pending.is_empty() {
                continue;
            }
            let groups = pending
                .iter_mut()
                .map(|(_, c)| std::mem::take(&mut c.writes))
                .collect();
            let t = std::time::Instant::now();
            let written = small_files::write_unsynced(groups).await;
            report.write += t.elapsed();
            let mut durable = Vec::with_capacity(pending.len());
            for ((log, close), res) in pending.into_iter().zip(written) {
                match res {
                    Ok(()) => durable.push((log, close)),
                    Err(e) => close_failed(&mut report, &log, e),
                }
            }
            // The barrier: the records below describe only files this sync made durable
            // (and it makes the previous round's records durable too).
            report.fs_syncs += 1;
            let t = std::time::Instant::now();
            let synced = fs.sync().await;
            report.sync += t.elapsed();
            if let Err(e) = synced {
                let cause = e.to_string();
                for (log, _) in durable {
                    let e = Error::io(&self.dir, std::io::Error::other(cause.clone()));
                    close_failed(&mut report, &log, e);
                }
                continue;
            }
            unsynced_records = false;
            let (closed, markers): (Vec<_>, Vec<_>) = durable
                .into_iter()
                .map(|(log, c)| ((log, c.snapshot), vec![c.marker]))
                .unzip();
            let t = std::time::Instant::now();
            let written = small_files::write_unsynced(markers).await;
            report.records += t.elapsed();
            for ((log, snapshot), res) in closed.into_iter().zip(written) {
                if let Some(end) = snapshot {
                    log.snapshots.borrow_mut().insert(end);
                }
                match res {
                    Ok(()) => {
                        log.clean_marker.set(true);
                        self.cache.borrow_mut().invalidate(log.id);
                        report.marked_clean += 1;
                        unsynced_records = true;
                    }
                    Err(e) => close_failed(&mut report, &log, e),
                }
            }
        }
        if unsynced_records {
            report.fs_syncs += 1;
            let t = std::time::Instant::now();
            let synced = fs.sync().await;
            report.sync += t.elapsed();
            if let Err(e) = synced {
                // The records' state is unknown: each describes durable files, so one
                // that reached the disk is right and one that did not means recovery.
                tracing::error!(error = %e, "syncing the last clean-close records failed");
                report.failed.push((self.dir.display().to_string(), e));
            }
        }
        report
    }
}

/// A log and the outcome of its [`PartitionLog::close_begin`].
type Begun = (Rc<PartitionLog>, Result<Option<RoundClose>, Error>);

/// The first step of a round's closes, [`CLOSE_LANES`] at a time; results in order.
async fn begin_round(round: Vec<Rc<PartitionLog>>) -> Vec<Begun> {
    let n = round.len();
    let mut lanes: Vec<Vec<(usize, Rc<PartitionLog>)>> =
        (0..CLOSE_LANES).map(|_| Vec::new()).collect();
    for (i, log) in round.into_iter().enumerate() {
        lanes[i % CLOSE_LANES].push((i, log));
    }
    let tasks: Vec<_> = lanes
        .into_iter()
        .filter(|l| !l.is_empty())
        .map(|lane| {
            glommio::spawn_local(async move {
                let mut out = Vec::with_capacity(lane.len());
                for (i, log) in lane {
                    let res = log.close_begin().await;
                    out.push((i, log, res));
                }
                out
            })
        })
        .collect();
    let mut done: Vec<Option<Begun>> = (0..n).map(|_| None).collect();
    for t in tasks {
        for (i, log, res) in t.await {
            done[i] = Some((log, res));
        }
    }
    done.into_iter()
        .map(|d| d.expect("every log of the round ran"))
        .collect()
}

/// A log whose clean close failed after its first step: failed (so nothing else uses
/// it), and left without a record.
fn close_failed(report: &mut CloseReport, log: &Rc<PartitionLog>, e: Error) {
    log.note_failure(&e);
    log.storage.cache.borrow_mut().invalidate(log.id);
    report.failed.push((log.name.clone(), e));
}

struct LogState {
    /// Ordered by base offset; the last one is active.
    segments: Vec<Segment>,
    log_start: i64,
    /// Compaction has cleaned everything below this offset (the first dirty offset).
    clean_offset: i64,
}

impl LogState {
    fn active(&self) -> &Segment {
        self.segments
            .last()
            .expect("a log always has an active segment")
    }

    fn active_mut(&mut self) -> &mut Segment {
        self.segments
            .last_mut()
            .expect("a log always has an active segment")
    }

    fn log_end(&self) -> i64 {
        self.active().next_offset
    }

    fn segment_index_for(&self, offset: i64) -> usize {
        self.segments
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1)
    }

    fn check_invariants(&self) {
        let end = self.log_end();
        assert!(
            self.log_start <= end,
            "log start {} beyond log end {end}",
            self.log_start
        );
        for w in self.segments.windows(2) {
            assert!(
                w[0].base_offset < w[1].base_offset,
                "segment bases must increase"
            );
            assert!(
                w[0].next_offset <= w[1].base_offset,
                "segments must not overlap"
            );
        }
    }
}

/// One partition's log. Lives on one shard; share it with `Rc`.
pub struct PartitionLog {
    id: LogId,
    /// This log, for the shard's set of logs with open files ([`ActiveLogs`]).
    me: Weak<PartitionLog>,
    name: String,
    dir: PathBuf,
    storage: Rc<Storage>,
    config: RefCell<LogConfig>,
    state: RefCell<LogState>,
    /// Set while a roll, truncation or close runs; appends wait for it to clear.
    busy: Cell<bool>,
    idle_event: Event,
    append_event: Event,
    last_flush_ms: Cell<i64>,
    closed: Cell<bool>,
    /// The first I/O error of the log (see [`PartitionLog::failure`]); it refuses all
    /// work from then on.
    failure: RefCell<Option<String>>,
    /// See [`PartitionLog::set_leader_fence`].
    leader_fence: RefCell<Option<LeaderFence>>,
    /// The closed segment whose files compaction is swapping right now.
    swapping: Cell<Option<i64>>,
    /// A compaction pass is running (one at a time per log).
    compacting: Cell<bool>,
    /// `partition.meta` is being written (one writer at a time; see `write_meta`).
    meta_writing: Cell<bool>,
    meta_dirty: Cell<bool>,
    /// Producer state (idempotence and transactions), built when the log is opened
    /// (from a snapshot and the log after it) and kept up to date by every append;
    /// rebuilt the same way by a truncation.
    producers: RefCell<ProducerStateTable>,
    /// Offsets of the producer snapshots on disk.
    snapshots: RefCell<std::collections::BTreeSet<i64>>,
    /// `partition.clean` exists and describes the files (see [`CLEAN_FILE`]).
    clean_marker: Cell<bool>,
}

/// The outcome of [`PartitionLog::append_checked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    Appended(AppendInfo),
    /// A retry of a batch already in the log (appended again: nothing).
    Duplicate(BatchMeta),
}

/// Whether this broker still leads the partition in a leader epoch (see
/// [`PartitionLog::set_leader_fence`]).
pub type LeaderFence = Box<dyn Fn(i32) -> bool>;

/// An appended batch on its way to the device: [`PartitionLog::written`] waits for
/// (and, if no write is in flight, starts) the write that carries it. Dropped
/// unawaited, the bytes stay accepted and go out with the next write of the log.
#[must_use = "an append is acknowledged only once it is written"]
pub struct Staged {
    file: Rc<file::AppendFile>,
    target: u64,
}

impl Staged {
    /// The outcome of an append once its write (if it made one) is done.
    async fn settle(appended: (Judged, Option<Staged>)) -> Result<Judged, Error> {
        let (judged, staged) = appended;
        if let Some(s) = staged {
            s.file.wait_written(s.target).await?;
        }
        Ok(judged)
    }
}

/// The outcome of [`PartitionLog::append_judged`] and [`PartitionLog::append_marker`]:
/// [`Checked`] plus refusals by the transaction rules. (A separate type so that
/// callers matching [`Checked`] or [`Error`] exhaustively keep compiling; the broker
/// maps [`TxnError`] to Kafka's codes: `NotTransactional` → INVALID_TXN_STATE,
/// `CoordinatorFenced` → TRANSACTION_COORDINATOR_FENCED.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    Appended(AppendInfo),
    /// A retry of a batch already in the log (appended again: nothing).
    Duplicate(BatchMeta),
    /// Refused by the transaction rules; nothing appended.
    Refused(TxnError),
}

/// How an append is judged against the producer state before it gets offsets.
#[derive(Debug, Clone, Copy)]
enum Judge {
    /// Replicated or replayed data: recorded, not checked (the leader checked).
    Trusted,
    /// A client's batch on the leader: the sequence rules, and with `txn` the
    /// transaction rule too.
    Client { txn: bool },
    /// A batch of the broker's own coordinators (group offsets and metadata, transaction
    /// state): only the producer-epoch rule, as Kafka's coordinator-origin appends. A
    /// transactional offset commit of a producer fenced since (a newer epoch's marker
    /// is in the log) is refused, and cannot reopen a transaction nobody will end.
    Coordinator,
    /// An end-transaction marker written by this leader: the epoch rules.
    Marker {
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
    },
}

/// Clears a flag when dropped, even if the holder's future is cancelled.
struct FlagGuard<'a>(&'a Cell<bool>);

impl Drop for FlagGuard<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Clears the swap marker when dropped.
struct SwapGuard<'a>(&'a PartitionLog);

impl Drop for SwapGuard<'_> {
    fn drop(&mut self) {
        self.0.swapping.set(None);
    }
}

/// Clears `busy` when dropped, even if the holder's future is cancelled.
struct BusyGuard<'a>(&'a PartitionLog);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.busy.set(false);
        self.0.idle_event.notify(usize::MAX);
    }
}

impl PartitionLog {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> LogConfig {
        self.config.borrow().clone()
    }

    /// Changes the topic settings; they apply to the next append, roll and retention pass.
    pub fn set_config(&self, config: LogConfig) -> Result<(), Error> {
        config.validate()?;
        *self.config.borrow_mut() = config;
        Ok(())
    }

    pub fn log_start_offset(&self) -> i64 {
        self.state.borrow().log_start
    }

    pub fn log_end_offset(&self) -> i64 {
        self.state.borrow().log_end()
    }

    pub fn size_bytes(&self) -> u64 {
        self.state.borrow().segments.iter().map(|s| s.size).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.state.borrow().segments.len()
    }

    /// Base offset and logical size of the active segment.
    pub fn active_segment(&self) -> (i64, u64) {
        let st = self.state.borrow();
        (st.active().base_offset, st.active().size)
    }

    /// Base offsets of the segments, oldest first.
    pub fn segment_bases(&self) -> Vec<i64> {
        self.state
            .borrow()
            .segments
            .iter()
            .map(|s| s.base_offset)
            .collect()
    }

    /// Each segment as ListOffsets v0 (Kafka's "offsets before" a time) sees it, oldest
    /// first: (base offset, logical size, last modification time of its `.log` in ms
    /// since the epoch, as Kafka's `LogSegment.lastModified`: 0 if the file cannot be
    /// read, as Java's `File.lastModified`). A `stat` per segment: the metadata the
    /// kernel caches, no data read.
    pub fn segment_times(&self) -> Vec<(i64, u64, i64)> {
        let modified_ms = |path: &Path| {
            std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as i64)
        };
        self.state
            .borrow()
            .segments
            .iter()
            .map(|s| (s.base_offset, s.size, modified_ms(&s.path("log"))))
            .collect()
    }

    /// Why the log is failed, if it is: an I/O error on one of its files (a write or
    /// sync of the active segment, a read of any segment, index, snapshot or
    /// `partition.meta`, a write of a snapshot, index or `partition.meta`, a directory
    /// sync) left the state of that file unknown. From then on every method that does
    /// I/O answers [`Error::Failed`] (or the [`Error::Io`] that caused it) and nothing is
    /// acknowledged, and the active segment's files start no more writes. A failure is
    /// never cleared: drop the log (every `Rc` of it) and open it again
    /// ([`Storage::open_log`], which re-reads the files: recovery) once the cause is
    /// gone. The broker polls this to take the partition offline.
    pub fn failure(&self) -> Option<String> {
        if let Some(cause) = self.failure.borrow().as_ref() {
            return Some(cause.clone());
        }
        self.files_failure()
    }

    /// A failure of the active segment's files (a write or sync that failed in the
    /// background, seen before any caller reported it).
    fn files_failure(&self) -> Option<String> {
        let st = self.state.borrow();
        st.active().active.as_ref()?.failure()
    }

    /// Runs `work` (a public method's body) unless the log is failed, and fails the log
    /// if `work` meets an I/O error.
    async fn guarded<T>(&self, work: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        if let Some(cause) = self.failure() {
            return Err(Error::Failed(cause));
        }
        let res = work.await;
        if let Err(e) = &res {
            self.note_failure(e);
        }
        res
    }

    /// Records the first I/O error as the log's failure. [`Error::Failed`] comes from a
    /// failed file: an active segment's (which [`Self::files_failure`] names), a temp
    /// file's (a snapshot, an index, `partition.meta`, a compaction's output), or from
    /// an active segment's file refusing work while a truncation runs, which is no
    /// failure.
    fn note_failure(&self, e: &Error) {
        let cause = match e {
            Error::Io { .. } => Some(e.to_string()),
            Error::Failed(msg) => self.files_failure().or_else(|| {
                let st = self.state.borrow();
                let truncating = st.active().active.as_ref().is_some_and(|a| a.truncating());
                (!truncating).then(|| msg.clone())
            }),
            _ => None,
        };
        let Some(cause) = cause else { return };
        if self.failure.borrow().is_some() {
            return;
        }
        tracing::debug!(log = %self.name, cause, "log failed");
        // The active files stop changing (a write still pending would otherwise land
        // while recovery of a reopened log reads the file).
        if let Some(a) = self.state.borrow().active().active.as_ref() {
            a.fail(&cause);
        }
        *self.failure.borrow_mut() = Some(cause);
        // Nothing is served from a failed log: free its cached batches.
        self.storage.cache.borrow_mut().invalidate(self.id);
        self.append_event.notify(usize::MAX);
    }

    fn check_open(&self) -> Result<(), Error> {
        if self.closed.get() {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    async fn wait_idle(&self) {
        while self.busy.get() {
            let l = self.idle_event.listen();
            if !self.busy.get() {
                break;
            }
            l.await;
        }
    }

    /// Counts this log's active files as the most recently used.
    fn touch_active(&self) {
        if self.state.borrow().active().active.is_some() {
            let mut active = self.storage.active.borrow_mut();
            active.touch(self.id, &self.me);
            // Without the places being opened: this log may still hold its own.
            let open = active.logs.len() + self.storage.closing.get();
            self.storage
                .active_peak
                .set(self.storage.active_peak.get().max(open));
        }
    }

    /// Closes the active segment's file (its `.log`, the one descriptor an active log
    /// holds) of this idle log (the shard's descriptor budget,
    /// [`StorageLimits::active_logs_max`]) with only the file work that is needed (see
    /// [`release_file`]): its bytes made durable if they are not yet, its page padding
    /// and preallocated space trimmed without a sync of its own, and its in-memory
    /// indexes written whole only if they hold entries (those bound the recovery after
    /// a crash; empty ones bound nothing and stay for the next seal to write). So on
    /// disk the segment is a closed one until the next append, roll or truncation
    /// reopens it. Reads are served from read handles meanwhile. False if they were not
    /// open.
    pub async fn deactivate(&self) -> Result<bool, Error> {
        self.guarded(self.deactivate_unguarded()).await
    }

    async fn deactivate_unguarded(&self) -> Result<bool, Error> {
        let _guard = self.lock().await;
        self.storage.forget_active(self.id);
        if self.closed.get() {
            return Ok(false);
        }
        let Some(log) = self
            .state
            .borrow()
            .active()
            .active
            .as_ref()
            .map(|a| a.log.clone())
        else {
            return Ok(false);
        };
        // Appends wait for the lock: everything pushed so far is in `log`.
        release_file(&log).await?;
        self.write_dirty_indexes(false).await?;
        self.state.borrow_mut().active_mut().detach();
        tracing::debug!(log = %self.name, "closed an idle log's files");
        Ok(true)
    }

    /// Seals the active segment's `.log` (if open: written, synced, preallocation
    /// trimmed), then writes what memory holds newer than the files: the offset and time
    /// indexes, now pointing into synced bytes only, and the `.txnindex`, each only if
    /// changed since last written (a log of small appends closes without rewriting
    /// them). Under the log's lock.
    async fn seal_active(&self, log: Option<Rc<file::AppendFile>>) -> Result<(), Error> {
        if let Some(f) = log {
            f.seal().await?;
        }
        self.write_dirty_indexes(true).await
    }

    /// Writes the active segment's offset and time indexes (unless `empty_too` is false
    /// and they hold no entry) and its `.txnindex`, each only if it changed since last
    /// written, durably. The `.log` must be synced: only entries into synced bytes may
    /// reach the index files. Under the log's lock.
    async fn write_dirty_indexes(&self, empty_too: bool) -> Result<(), Error> {
        let (indexes, txn_file) = {
            let st = self.state.borrow();
            let seg = st.active();
            (
                seg.indexes_dirty.then(|| seg.index_files()),
                seg.txn_dirty.then(|| seg.txn_index_file()),
            )
        };
        if let Some(i) = indexes.filter(|i| empty_too || !i.is_empty()) {
            i.write().await?;
            self.state.borrow_mut().active_mut().indexes_dirty = false;
        }
        if let Some(t) = txn_file {
            t.write().await?;
            self.state.borrow_mut().active_mut().txn_dirty = false;
        }
        Ok(())
    }

    /// Reopens the active segment's files if [`Self::deactivate`] closed them, first
    /// making room in the descriptor budget. On return the files are open and the log
    /// is idle; the caller must use them before its next await.
    async fn ensure_active(&self) -> Result<(), Error> {
        loop {
            self.wait_idle().await;
            if self.state.borrow().active().active.is_some() {
                self.touch_active();
                return Ok(());
            }
            let _place = self.storage.make_room(Some(self.id)).await;
            let _guard = self.lock().await;
            self.check_open()?;
            self.reactivate_locked().await?;
        }
    }

    /// Whether to open this log's active segment write-through (`O_DSYNC`, when the
    /// shard has room; see [`crate::file::DEFAULT_DSYNC_LOGS_MAX`]): suits a log synced
    /// before every acknowledgement; one flushed on an interval would wait for each
    /// write's sync for nothing. A log keeps the mode its segment opened with until the
    /// next opens (both are correct for either policy).
    fn write_through(&self) -> bool {
        matches!(self.config.borrow().flush, FlushPolicy::Always)
    }

    /// Under the lock: opens the last segment's files for appending if they are closed.
    async fn reactivate_locked(&self) -> Result<(), Error> {
        let last = self.state.borrow().active().base_offset;
        self.load_segment(last).await?;
        let activation = {
            let st = self.state.borrow();
            st.active()
                .active
                .is_none()
                .then(|| st.active().activation())
        };
        if activation.is_some() {
            self.drop_clean_marker().await?;
        }
        if let Some(a) = activation {
            let path = self.state.borrow().active().path("log");
            self.storage.handles.borrow_mut().forget(&path);
            let files = a
                .open(self.storage.limits.write_bytes_max, self.write_through())
                .await?;
            let n = &self.storage.reactivations;
            n.set(n.get() + 1);
            self.state.borrow_mut().active_mut().attach(files);
            self.touch_active();
        }
        Ok(())
    }

    /// Recovers segment `base` if a clean open left it unread (see [`Segment::loaded`]):
    /// reads its indexes and validates the batches after the last entry. A segment that
    /// no longer matches what the clean close recorded fails the log; the reopen then
    /// recovers every segment.
    async fn load_segment(&self, base: i64) -> Result<(), Error> {
        let (generation, expect) = {
            let st = self.state.borrow();
            match st.segments.iter().find(|s| s.base_offset == base) {
                Some(s) if !s.loaded => (s.generation, (s.next_offset, s.size)),
                _ => return Ok(()),
            }
        };
        let interval = self.config.borrow().index_interval_bytes;
        let mut report = RecoveryReport::default();
        let (seg, found) = Segment::recover(
            &self.dir,
            base,
            self.storage.now_ms(),
            interval,
            &mut report,
        )
        .await?;
        if found.truncated || (seg.next_offset, seg.size) != expect {
            let path = seg.path("log");
            let _ = self.drop_clean_marker().await;
            return Err(Error::io(
                &path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "segment changed since the clean close: ends at {} ({} bytes), not {} ({} bytes)",
                        seg.next_offset, seg.size, expect.0, expect.1
                    ),
                ),
            ));
        }
        let mut st = self.state.borrow_mut();
        let same = st
            .segments
            .iter_mut()
            .find(|s| s.base_offset == base && s.generation == generation && !s.loaded);
        if let Some(s) = same {
            s.load_from(seg);
            s.used.set(self.storage.index_tick.get());
        }
        Ok(())
    }

    /// Drops closed segment `base`'s in-memory indexes if it is still the one of
    /// `generation` and the log is not busy ([`Storage::limit_index_memory`]).
    fn unload_segment(&self, base: i64, generation: u64) -> bool {
        if self.busy.get() || self.closed.get() {
            return false;
        }
        let mut st = self.state.borrow_mut();
        let last = st.segments.len().saturating_sub(1);
        st.segments[..last]
            .iter_mut()
            .find(|s| s.base_offset == base && s.generation == generation)
            .is_some_and(|s| s.unload_indexes())
    }

    /// Before the first change to the log's files after a clean open: removes
    /// `partition.clean`, durably, since it no longer describes them.
    async fn drop_clean_marker(&self) -> Result<(), Error> {
        if !self.clean_marker.get() {
            return Ok(());
        }
        let path = self.dir.join(CLEAN_FILE);
        match file::remove(&path).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&path, e)),
        }
        file::sync_dir(&self.dir).await?;
        self.clean_marker.set(false);
        Ok(())
    }

    /// The last step of a clean close: records every segment in `partition.clean`.
    async fn write_clean_marker(&self) -> Result<(), Error> {
        let text = self.clean_marker_text();
        file::write_atomic(&self.dir.join(CLEAN_FILE), text.as_bytes()).await?;
        self.clean_marker.set(true);
        Ok(())
    }

    /// What `partition.clean` records: every segment's base, end, size and largest
    /// timestamp.
    fn clean_marker_text(&self) -> String {
        let mut text = format!("{CLEAN_HEADER}\n");
        for s in &self.state.borrow().segments {
            text.push_str(&format!(
                "{} {} {} {}\n",
                s.base_offset, s.next_offset, s.size, s.max_timestamp
            ));
        }
        text
    }

    async fn lock(&self) -> BusyGuard<'_> {
        self.wait_idle().await;
        self.busy.set(true);
        BusyGuard(self)
    }

    /// The event that fires on every append, as soon as the batch has its offsets (the
    /// log end moved; its write may still run), and when the log fails.
    pub fn append_event(&self) -> &Event {
        &self.append_event
    }

    /// A listener that fires on the next append; check the log end after creating it.
    pub fn listen_appends(&self) -> EventListener {
        self.append_event.listen()
    }

    /// Waits until the log end passes `offset` or `timeout` elapses; returns whether it did.
    pub async fn wait_for_append(&self, offset: i64, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.log_end_offset() > offset {
                return true;
            }
            if self.failure.borrow().is_some() {
                return false;
            }
            let listener = self.listen_appends();
            if self.log_end_offset() > offset {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let fired = futures_lite::future::or(
                async {
                    listener.await;
                    true
                },
                async {
                    glommio::timer::sleep(left).await;
                    false
                },
            )
            .await;
            if !fired {
                return self.log_end_offset() > offset;
            }
        }
    }

    /// Validates `batch` (one complete v2 batch), assigns it the next offsets and
    /// `leader_epoch`, and appends it. Returns once the bytes are written to the device
    /// (not yet fdatasync'ed: see [`PartitionLog::flush`]). On error nothing is written.
    pub async fn append(&self, batch: &[u8], leader_epoch: i32) -> Result<AppendInfo, Error> {
        self.check_size(batch)?;
        let header = batch::validate(batch, true)?;
        let batch = Bytes::copy_from_slice(batch);
        self.guarded(self.append_validated(batch, header, leader_epoch, Judge::Trusted))
            .await
    }

    /// [`Self::append`] bounded by `max_bytes` instead of the topic's
    /// `max.message.bytes`: for the broker's own coordinators, whose records grow with
    /// their state (a group's members and assignments), not with what a client sends.
    /// A transactional batch of a producer epoch older than the partition has seen is
    /// refused ([`Error::Sequence`] with `StaleEpoch`); sequences are not checked (the
    /// coordinators' batches carry none).
    pub async fn append_bounded(
        &self,
        batch: &[u8],
        leader_epoch: i32,
        max_bytes: usize,
    ) -> Result<AppendInfo, Error> {
        if batch.len() > max_bytes {
            return Err(BatchError::TooLarge {
                size: batch.len(),
                max: max_bytes,
            }
            .into());
        }
        let header = batch::validate(batch, true)?;
        let batch = Bytes::copy_from_slice(batch);
        self.guarded(self.append_validated(batch, header, leader_epoch, Judge::Coordinator))
            .await
    }

    /// `max.message.bytes`: refuses a batch larger than the topic allows.
    fn check_size(&self, batch: &[u8]) -> Result<(), Error> {
        let max = self.config.borrow().max_message_bytes;
        if batch.len() > max {
            return Err(BatchError::TooLarge {
                size: batch.len(),
                max,
            }
            .into());
        }
        Ok(())
    }

    /// Like [`Self::append`], for a leader taking a batch from a client: a batch of an
    /// idempotent producer is first judged against the producer state
    /// ([`crate::producer`]) in the same step that assigns its offsets, so concurrent
    /// batches of one producer are judged in the order they are appended. A retry of a
    /// batch already in the log appends nothing and answers with that batch's offsets
    /// (durable only as far as the log is: the caller flushes before acknowledging);
    /// an out-of-order or stale-epoch batch is refused with [`Error::Sequence`], a
    /// control batch with [`BatchError::ControlBatchFromClient`].
    ///
    /// The transaction rule (no plain batch while the producer's transaction is open)
    /// is [`Self::append_judged`]'s; this one, which predates it, lets such a batch in.
    pub async fn append_checked(&self, batch: &[u8], leader_epoch: i32) -> Result<Checked, Error> {
        let appended = self.guarded(async {
            let batch = Bytes::copy_from_slice(batch);
            Staged::settle(self.append_client(batch, leader_epoch, false).await?).await
        });
        match appended.await? {
            Judged::Appended(info) => Ok(Checked::Appended(info)),
            Judged::Duplicate(meta) => Ok(Checked::Duplicate(meta)),
            Judged::Refused(e) => unreachable!("the transaction rule is off: {e}"),
        }
    }

    /// [`Self::append_checked`] with Kafka's transaction rule as well: a producer with an
    /// open transaction may only write transactional batches
    /// ([`Judged::Refused`] with [`TxnError::NotTransactional`] otherwise).
    pub async fn append_judged(&self, batch: &[u8], leader_epoch: i32) -> Result<Judged, Error> {
        self.guarded(async {
            let batch = Bytes::copy_from_slice(batch);
            Staged::settle(self.append_client(batch, leader_epoch, true).await?).await
        })
        .await
    }

    /// [`Self::append_judged`] up to the moment its offsets are assigned and its bytes
    /// accepted: an appended batch comes with its [`Staged`] write, which the caller
    /// awaits with [`Self::written`]. The next append may be judged and staged
    /// meanwhile, so appends that arrive while a write is in flight go out together in
    /// the next one (group commit): with a write-through log the write is the sync,
    /// and a caller that awaited each write before letting the next batch in would
    /// make one device round trip per batch. A large `batch` is kept as it is (a slice
    /// of the request, say), not copied: only its header is rewritten, beside it.
    pub async fn append_judged_staged(
        &self,
        batch: Bytes,
        leader_epoch: i32,
    ) -> Result<(Judged, Option<Staged>), Error> {
        self.guarded(self.append_client(batch, leader_epoch, true))
            .await
    }

    /// Installs the check that a leader's append (offsets assigned here: client
    /// batches, markers, coordinator writes) makes, synchronously with taking its
    /// offsets: whether this broker still leads in the append's leader epoch. Refused
    /// with [`Error::NotLeader`] otherwise. A follower's copies are not checked.
    pub fn set_leader_fence(&self, leads_in: impl Fn(i32) -> bool + 'static) {
        *self.leader_fence.borrow_mut() = Some(Box::new(leads_in));
    }

    /// Waits until a staged append is written to the device (not yet synced, unless
    /// the log is write-through; see [`Self::flush`]).
    pub async fn written(&self, staged: Staged) -> Result<(), Error> {
        self.guarded(staged.file.wait_written(staged.target)).await
    }

    async fn append_client(
        &self,
        batch: Bytes,
        leader_epoch: i32,
        txn: bool,
    ) -> Result<(Judged, Option<Staged>), Error> {
        self.check_size(&batch)?;
        let header = batch::validate(&batch, true)?;
        if header.is_control() {
            return Err(BatchError::ControlBatchFromClient.into());
        }
        self.append_staged(batch, header, leader_epoch, true, Judge::Client { txn })
            .await
    }

    /// Writes an end-transaction marker for `producer_id` at `producer_epoch` (a
    /// leader, for the transaction coordinator's WriteTxnMarkers): COMMIT or ABORT,
    /// stamped with `coordinator_epoch`. Kafka's checks, in the step that assigns the
    /// offset: a producer epoch below the producer's current one is refused with
    /// [`Error::Sequence`] (INVALID_PRODUCER_EPOCH), a coordinator epoch below the last
    /// marker's with [`Judged::Refused`] ([`TxnError::CoordinatorFenced`]). A marker for
    /// a producer with no open transaction (a retry) is written, and closes nothing.
    /// Closing an aborted transaction adds it to the segment's `.txnindex`. Followers
    /// copy markers with [`Self::append_with_offsets`], which updates the same state.
    pub async fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        leader_epoch: i32,
    ) -> Result<Judged, Error> {
        let marker = batch::EndTxnMarker {
            commit,
            coordinator_epoch,
        };
        let bytes =
            batch::end_txn_marker_batch(producer_id, producer_epoch, marker, self.storage.now_ms());
        let header = batch::validate(&bytes, true)?;
        let judge = Judge::Marker {
            producer_id,
            epoch: producer_epoch,
            coordinator_epoch,
        };
        self.guarded(self.append_inner(bytes.into(), header, leader_epoch, true, judge))
            .await
    }

    /// Appends a batch that already carries its offsets (a follower copying its leader,
    /// or a compacted batch): validated, but offsets are kept, only required to follow
    /// the log end. Its producer state (markers included) is recorded unchecked.
    pub async fn append_with_offsets(&self, batch: Bytes) -> Result<AppendInfo, Error> {
        let (info, staged) = self.append_with_offsets_staged(batch).await?;
        if let Some(staged) = staged {
            self.written(staged).await?;
        }
        Ok(info)
    }

    /// [`Self::append_with_offsets`] up to the moment the batch's bytes are accepted:
    /// the caller awaits its write with [`Self::written`]. A follower copying the
    /// batches of one fetch stages them all, then awaits them: written together, not
    /// one device round trip per batch.
    pub async fn append_with_offsets_staged(
        &self,
        batch: Bytes,
    ) -> Result<(AppendInfo, Option<Staged>), Error> {
        let header = batch::validate(&batch, false)?;
        let staged = self.append_staged(batch, header, header.leader_epoch, false, Judge::Trusted);
        match self.guarded(staged).await? {
            (Judged::Appended(info), staged) => Ok((info, staged)),
            (other, _) => unreachable!("an unjudged append was judged: {other:?}"),
        }
    }

    async fn append_validated(
        &self,
        batch: Bytes,
        header: batch::BatchHeader,
        leader_epoch: i32,
        judge: Judge,
    ) -> Result<AppendInfo, Error> {
        match self
            .append_inner(batch, header, leader_epoch, true, judge)
            .await?
        {
            Judged::Appended(info) => Ok(info),
            other => unreachable!("an unjudged append was judged: {other:?}"),
        }
    }

    /// Judges a batch against the producer state before it is appended: `Some` is the
    /// answer instead of appending.
    fn judge(&self, header: &batch::BatchHeader, judge: Judge) -> Result<Option<Judged>, Error> {
        let table = self.producers.borrow();
        match judge {
            Judge::Trusted => {}
            Judge::Coordinator => {
                if header.is_transactional() {
                    table.check_marker_epoch(header.producer_id, header.producer_epoch)?;
                }
            }
            Judge::Client { txn } => {
                if let Verdict::Duplicate(meta) = table.check(header)? {
                    return Ok(Some(Judged::Duplicate(meta)));
                }
                if txn {
                    if let Err(e) = table.check_txn(header) {
                        return Ok(Some(Judged::Refused(e)));
                    }
                }
            }
            Judge::Marker {
                producer_id,
                epoch,
                coordinator_epoch,
            } => {
                table.check_marker_epoch(producer_id, epoch)?;
                if let Err(e) = table.check_marker_coordinator(producer_id, coordinator_epoch) {
                    return Ok(Some(Judged::Refused(e)));
                }
            }
        }
        Ok(None)
    }

    /// Appends one validated batch; judges it against the producer state first (in the
    /// same synchronous step that assigns its offsets). Returns once it is written.
    async fn append_inner(
        &self,
        batch: Bytes,
        header: batch::BatchHeader,
        leader_epoch: i32,
        assign_offsets: bool,
        judge: Judge,
    ) -> Result<Judged, Error> {
        Staged::settle(
            self.append_staged(batch, header, leader_epoch, assign_offsets, judge)
                .await?,
        )
        .await
    }

    /// [`Self::append_inner`] without waiting for the write: an appended batch comes
    /// with its [`Staged`] write.
    async fn append_staged(
        &self,
        batch: Bytes,
        header: batch::BatchHeader,
        leader_epoch: i32,
        assign_offsets: bool,
        judge: Judge,
    ) -> Result<(Judged, Option<Staged>), Error> {
        self.check_open()?;
        let span = if assign_offsets {
            i64::from(header.last_offset_delta)
        } else {
            header.last_offset() - self.log_end_offset()
        };
        self.maybe_roll(batch.len() as u64, span).await?;
        // No await from here to the push: the files stay open for it.
        self.ensure_active().await?;
        self.check_open()?;
        // A leader's append is fenced here, in the step that gives it its offsets: the
        // caller checked its leadership before awaiting (a sequence gap, the log lock
        // a truncation holds, a roll), and a deposed leader's late append stamped with
        // its old epoch, after records of a newer one, would hide from the truncation
        // by epochs that must remove it.
        if assign_offsets {
            if let Some(leads_in) = &*self.leader_fence.borrow() {
                if !leads_in(leader_epoch) {
                    return Err(Error::NotLeader {
                        epoch: leader_epoch,
                    });
                }
            }
        }
        let config = self.config.borrow().clone();
        let now = self.storage.now_ms();
        let (info, log_file, target) = {
            if let Some(answer) = self.judge(&header, judge)? {
                return Ok((answer, None));
            }
            let mut st = self.state.borrow_mut();
            let base = if assign_offsets {
                st.log_end()
            } else {
                let too_far = header.last_offset() - st.active().base_offset > i64::from(i32::MAX);
                if header.base_offset < st.log_end() || too_far {
                    return Err(Error::OffsetOutOfRange {
                        offset: header.base_offset,
                        log_start: st.log_start,
                        log_end: st.log_end(),
                    });
                }
                header.base_offset
            };
            let append_time =
                (config.timestamp_type == TimestampType::LogAppendTime).then_some(now);
            let (head, body) = stored_form(
                batch,
                &header,
                assign_offsets,
                base,
                leader_epoch,
                append_time,
            );
            let h = batch::BatchHeader::parse(if head.is_empty() { &body } else { &head })?;
            let seg = st.active_mut();
            let files = seg.active.as_ref().expect("active segment has files");
            let log_file = files.log.clone();
            // A failed file refuses the push: refuse before the segment counts the batch.
            log_file.check_failed()?;
            let position = seg.size;
            let len = (head.len() + body.len()) as u64;
            seg.track_batch(&h, position, len, config.index_interval_bytes);
            // Two pushes with no await between them: nothing else lands in between.
            log_file.push_bytes(head.clone())?;
            let target = log_file.push_bytes(body.clone())?;
            assert_eq!(target, seg.size, "appended position is the segment size");
            // A control batch is never split (see `stored_form`): the marker reads whole.
            if let Some(done) = self.producers.borrow_mut().apply(&h, &body) {
                index_completed(seg, &done);
            }
            self.storage.cache.borrow_mut().insert(
                self.id,
                CachedBatch {
                    base_offset: h.base_offset,
                    last_offset: h.last_offset(),
                    head,
                    body,
                },
            );
            let info = AppendInfo {
                base_offset: h.base_offset,
                last_offset: h.last_offset(),
                log_append_time_ms: append_time.unwrap_or(-1),
                record_count: h.record_count,
            };
            (info, log_file, target)
        };
        self.append_event.notify(usize::MAX);
        let staged = Staged {
            file: log_file,
            target,
        };
        Ok((Judged::Appended(info), Some(staged)))
    }

    /// Rolls to a new segment first if the next `incoming` bytes would overflow
    /// `segment.bytes` or the active segment is older than `segment.ms`.
    /// `span`: how far past the log end the incoming batch's last offset reaches.
    async fn maybe_roll(&self, incoming: u64, span: i64) -> Result<(), Error> {
        self.wait_idle().await;
        if !self.needs_roll(incoming, span) {
            return Ok(());
        }
        let _guard = self.lock().await;
        if self.needs_roll(incoming, span) {
            self.roll_locked().await?;
        }
        Ok(())
    }

    fn needs_roll(&self, incoming: u64, span: i64) -> bool {
        let cfg = self.config.borrow();
        let st = self.state.borrow();
        let seg = st.active();
        // Index entries hold offsets relative to the segment base in 32 bits; like
        // Kafka, keep every segment's offset span within i32.
        let offsets_overflow = st.log_end() + span - seg.base_offset > i64::from(i32::MAX);
        !seg.is_empty()
            && (seg.size + incoming > cfg.segment_bytes
                || self.storage.now_ms() - seg.created_ms
                    >= cfg.roll_age_ms(seg.base_offset, seg.created_ms)
                || offsets_overflow)
    }

    /// Forces a roll now (if the active segment is not empty).
    pub async fn roll(&self) -> Result<(), Error> {
        self.guarded(self.roll_unguarded()).await
    }

    async fn roll_unguarded(&self) -> Result<(), Error> {
        let _guard = self.lock().await;
        if !self.state.borrow().active().is_empty() {
            self.roll_locked().await?;
        }
        Ok(())
    }

    async fn roll_locked(&self) -> Result<(), Error> {
        self.roll_locked_at(None).await
    }

    /// Rolls to a new active segment based at `base` (default: the log end; a larger
    /// base leaves a gap of offsets no record will ever have). The old segment is
    /// sealed (its `.txnindex` too), then the producer state is snapshotted at the new
    /// base, then the new segment is created.
    async fn roll_locked_at(&self, base: Option<i64>) -> Result<(), Error> {
        // An idle log's closed files are reopened, so the roll seals them as usual
        // (with the closing time-index entry).
        self.reactivate_locked().await?;
        let (log_file, indexes, new_base, txn_file, old_base) = {
            let mut st = self.state.borrow_mut();
            let seg = st.active_mut();
            let end = seg.next_offset;
            let txn_file = seg.txn_dirty.then(|| seg.txn_index_file());
            let old_base = seg.base_offset;
            let log_file = seg.begin_close();
            (
                log_file,
                seg.index_files(),
                base.unwrap_or(end).max(end),
                txn_file,
                old_base,
            )
        };
        // Appends wait for the lock's holder: the state is the one at the log end,
        // which (no records lie between) is the one at the new base.
        let snapshot = self.producers.borrow().encode_snapshot(new_base);
        if let Some(f) = log_file {
            f.seal().await?;
        }
        // The indexes after the `.log` is synced: no entry points at bytes a crash
        // could still tear.
        indexes.write().await?;
        self.state.borrow_mut().active_mut().indexes_dirty = false;
        if let Some(t) = txn_file {
            t.write().await?;
            self.state.borrow_mut().active_mut().txn_dirty = false;
        }
        self.write_snapshot(new_base, &snapshot).await?;
        // Snapshots inside the segment just closed (a close's, at the then log end) are
        // older than this one: only the newest at or below the log start must stay.
        let start = self.log_start_offset();
        let stray: Vec<i64> = self
            .snapshots
            .borrow()
            .range(old_base + 1..new_base)
            .copied()
            .filter(|o| *o > start)
            .collect();
        self.remove_snapshots(&stray).await;
        let now = self.storage.now_ms();
        let seg = Segment::create(
            &self.dir,
            new_base,
            now,
            self.storage.limits.write_bytes_max,
            self.write_through(),
        )
        .await?;
        file::sync_dir(&self.dir).await?;
        {
            let mut st = self.state.borrow_mut();
            st.active_mut().finish_close();
            st.segments.push(seg);
            st.check_invariants();
        }
        self.touch_active();
        tracing::debug!(log = %self.name, base = new_base, "rolled segment");
        Ok(())
    }

    /// Moves the log forward to `offset`, past its end: a new empty active segment
    /// based there, then the log start too, so every record below is dropped and the
    /// next append lands at `offset`. For a follower whose leader has deleted what it
    /// lacks (Kafka's truncate-fully-and-start-at); crash-safe like a roll followed by
    /// `delete_records_before` (recovery keeps an empty last segment, R10).
    pub async fn reset_to(&self, offset: i64) -> Result<(), Error> {
        self.guarded(self.reset_to_unguarded(offset)).await
    }

    async fn reset_to_unguarded(&self, offset: i64) -> Result<(), Error> {
        self.check_open()?;
        if offset <= self.log_end_offset() {
            return Err(Error::Config(format!(
                "reset_to({offset}) must move past the log end {}",
                self.log_end_offset()
            )));
        }
        {
            let _guard = self.lock().await;
            self.flush().await?;
            self.roll_locked_at(Some(offset)).await?;
            // Nothing below the new start stays: forget the producers and their
            // snapshots (Kafka's truncateFullyAndStartAt). A crash before this leaves
            // the snapshot the roll wrote, which holds what the old log held.
            *self.producers.borrow_mut() = ProducerStateTable::default();
            let all: Vec<i64> = self.snapshots.borrow().iter().copied().collect();
            self.remove_snapshots(&all).await;
        }
        self.delete_records_before(offset).await?;
        Ok(())
    }

    /// Writes the producer snapshot `bytes` (encoded at `offset`) atomically.
    async fn write_snapshot(&self, offset: i64, bytes: &[u8]) -> Result<(), Error> {
        file::write_atomic(&self.dir.join(snapshot_file_name(offset)), bytes).await?;
        self.snapshots.borrow_mut().insert(offset);
        Ok(())
    }

    /// Deletes the snapshots at `offsets` (best effort: a snapshot left behind above
    /// the log end is deleted by the next recovery, R18; one below is only older).
    async fn remove_snapshots(&self, offsets: &[i64]) {
        for o in offsets {
            self.snapshots.borrow_mut().remove(o);
            let _ = file::remove(self.dir.join(snapshot_file_name(*o))).await;
        }
    }

    /// Rebuilds the producer state for the log as it stands (recovery rows R16–R19 in
    /// [`crate::segment`]): loads the newest readable snapshot at or below both the log
    /// end and `limit` (deleting those above the end and those that do not read back),
    /// then replays the batches from there (from the log start if that is later),
    /// recomputing the `.txnindex` entries of every marker replayed. Repaired indexes
    /// of closed segments are written, and if the replay began below the active
    /// segment, a snapshot at its base is written after them.
    ///
    /// Runs when the log is opened (before anyone else can use it) and under the log's
    /// lock (truncation), so no append interleaves.
    async fn rebuild_producer_state(
        &self,
        limit: i64,
        report: &mut RecoveryReport,
    ) -> Result<(), Error> {
        let (start, end, active_base) = {
            let st = self.state.borrow();
            (st.log_start, st.log_end(), st.active().base_offset)
        };
        let above: Vec<i64> = self.snapshots.borrow().range(end + 1..).copied().collect();
        report.deleted_snapshots += above.len() as u32;
        self.remove_snapshots(&above).await; // R18
        let (loaded, mut table) = self.load_newest_snapshot(limit.min(end), report).await?;
        let expiration_ms = self.config.borrow().producer_id_expiration_ms;
        table.expire(self.storage.now_ms(), expiration_ms);
        report.producer_snapshot = loaded;
        let from = loaded.unwrap_or(start).max(start);
        {
            let mut st = self.state.borrow_mut();
            for seg in st.segments.iter_mut().filter(|s| s.next_offset > from) {
                if seg.txn_index.truncate_to_offset(from) {
                    seg.txn_dirty = true;
                }
            }
        }
        let mut at_active = None;
        let mut offset = from;
        while offset < end {
            let (records, next) = self.replay_chunk(offset, end).await?;
            if next <= offset {
                break;
            }
            for (h, bytes) in batch::stored_batches(&records) {
                if from < active_base && at_active.is_none() && h.base_offset >= active_base {
                    at_active = Some(table.encode_snapshot(active_base));
                }
                report.replayed_batches += 1;
                if let Some(done) = table.apply(&h, bytes) {
                    let mut st = self.state.borrow_mut();
                    let i = st.segment_index_for(done.last_offset);
                    index_completed(&mut st.segments[i], &done);
                }
            }
            offset = next;
        }
        if from < active_base && at_active.is_none() {
            at_active = Some(table.encode_snapshot(active_base));
        }
        *self.producers.borrow_mut() = table;
        self.write_closed_txn_indexes().await?;
        if let Some(bytes) = at_active {
            if !self.snapshots.borrow().contains(&active_base) {
                self.write_snapshot(active_base, &bytes).await?;
            }
        }
        Ok(())
    }

    /// The batches from `offset` for a replay, and the offset after them. Recovery
    /// validated every byte a crash could have torn, so a batch failing its CRC here is
    /// bit rot: reads refuse to serve it, and the replay steps over it (with an error
    /// logged) rather than leaving the log unopenable, as Kafka's replay, which does not
    /// check CRCs, would.
    async fn replay_chunk(&self, offset: i64, end: i64) -> Result<(Bytes, i64), Error> {
        match self.read(offset, 1 << 20, Some(end)).await {
            Err(Error::Corrupt { .. }) => {}
            res => {
                let r = res?;
                return Ok((r.records, r.next_offset));
            }
        }
        // Up to the damaged batch one batch at a time, then over it.
        match self.read(offset, 1, Some(end)).await {
            Err(Error::Corrupt {
                path,
                position,
                reason,
            }) => {
                let next = self.offset_after_damage(&path, position, offset).await?;
                tracing::error!(log = %self.name, path, position, reason, offset, next, "producer-state replay skips a damaged batch");
                Ok((Bytes::new(), next))
            }
            res => {
                let r = res?;
                Ok((r.records, r.next_offset))
            }
        }
    }

    /// The offset after the damaged batch at byte `position` of the segment file
    /// `path`, read from its header if that is plausible, else the end of that segment.
    async fn offset_after_damage(
        &self,
        path: &str,
        position: u64,
        offset: i64,
    ) -> Result<i64, Error> {
        let (base, next_offset, generation, active) = {
            let st = self.state.borrow();
            let seg = st
                .segments
                .iter()
                .find(|s| s.path("log").display().to_string() == path)
                .ok_or_else(|| Error::Corrupt {
                    path: path.to_string(),
                    position,
                    reason: "damaged batch in no segment of the log".into(),
                })?;
            let active = seg.active.as_ref().map(|a| a.log.dma_file().clone());
            (seg.base_offset, seg.next_offset, seg.generation, active)
        };
        let seg_path = self.dir.join(segment::file_name(base, "log"));
        let file = match active {
            Some(f) => Some(f),
            None => self.segment_file(base, &seg_path, generation).await?,
        };
        let head = match file {
            Some(f) if fault::check(&seg_path, FaultOp::Read).is_ok() => {
                f.read_at(position, batch::HEADER_BYTES).await.ok()
            }
            _ => None,
        };
        let plausible = head
            .and_then(|h| batch::BatchHeader::parse(&h).ok())
            .map(|h| h.last_offset())
            .filter(|last| *last >= offset && *last < next_offset);
        Ok(plausible
            .map_or(next_offset, |last| last + 1)
            .max(offset + 1))
    }

    /// The newest snapshot at or below `limit` that reads back (R16), deleting those that
    /// do not (R17); `None` and an empty table if there is none (R19).
    async fn load_newest_snapshot(
        &self,
        limit: i64,
        report: &mut RecoveryReport,
    ) -> Result<(Option<i64>, ProducerStateTable), Error> {
        loop {
            let newest = self.snapshots.borrow().range(..=limit).next_back().copied();
            let Some(offset) = newest else {
                return Ok((None, ProducerStateTable::default()));
            };
            let path = self.dir.join(snapshot_file_name(offset));
            let decoded = segment::read_whole(&path)
                .await?
                .ok_or_else(|| crate::producer::SnapshotError("missing".into()))
                .and_then(|b| ProducerStateTable::decode_snapshot(&b));
            match decoded {
                Ok((o, table)) if o == offset => return Ok((Some(offset), table)),
                res => {
                    let why = res
                        .err()
                        .map_or("offset differs from its name".into(), |e| e.0);
                    tracing::warn!(log = %self.name, offset, why, "deleting unreadable producer snapshot");
                    report.deleted_snapshots += 1;
                    self.remove_snapshots(&[offset]).await;
                }
            }
        }
    }

    /// Writes the `.txnindex` of every closed segment whose entries changed.
    async fn write_closed_txn_indexes(&self) -> Result<(), Error> {
        let files: Vec<(i64, segment::TxnIndexFile)> = {
            let st = self.state.borrow();
            let closed = &st.segments[..st.segments.len() - 1];
            closed
                .iter()
                .filter(|s| s.txn_dirty)
                .map(|s| (s.base_offset, s.txn_index_file()))
                .collect()
        };
        for (base, f) in files {
            f.write().await?;
            let mut st = self.state.borrow_mut();
            if let Some(s) = st.segments.iter_mut().find(|s| s.base_offset == base) {
                s.txn_dirty = false;
            }
        }
        Ok(())
    }

    /// Snapshots below the newest one at or below the log start carry nothing the
    /// newest does not: delete them (retention, DeleteRecords).
    async fn delete_snapshots_below_start(&self) {
        let start = self.log_start_offset();
        let old: Vec<i64> = {
            let snaps = self.snapshots.borrow();
            match snaps.range(..=start).next_back() {
                Some(&keep) => snaps.range(..keep).copied().collect(),
                None => Vec::new(),
            }
        };
        self.remove_snapshots(&old).await;
    }

    /// Makes everything appended so far durable (group-committed fdatasync). The
    /// active segment's indexes stay in memory (written when it is sealed, see
    /// [`crate::segment`]).
    pub async fn flush(&self) -> Result<(), Error> {
        self.guarded(self.flush_unguarded()).await
    }

    async fn flush_unguarded(&self) -> Result<(), Error> {
        let file = {
            let st = self.state.borrow();
            st.active().active.as_ref().map(|a| a.log.clone())
        };
        let Some(f) = file else { return Ok(()) };
        f.sync_all().await?;
        self.last_flush_ms.set(self.storage.now_ms());
        Ok(())
    }

    /// Waits until appends so far are as durable as the topic's flush policy asks
    /// before acknowledging: synced for `always`, nothing more for an interval.
    pub async fn flush_for_ack(&self) -> Result<(), Error> {
        self.guarded(self.flush_for_ack_unguarded()).await
    }

    async fn flush_for_ack_unguarded(&self) -> Result<(), Error> {
        match self.config.borrow().flush {
            FlushPolicy::Always => {}
            FlushPolicy::IntervalMs(_) => return Ok(()),
        }
        self.flush().await
    }

    /// Whole batches from the batch containing `offset`, up to `max_bytes` but at least
    /// one batch when one exists, and none at or beyond `max_offset` (exclusive; pass
    /// the high watermark, or `None` for the log end).
    pub async fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: Option<i64>,
    ) -> Result<ReadResult, Error> {
        self.guarded(self.read_unguarded(offset, max_bytes, max_offset))
            .await
    }

    async fn read_unguarded(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: Option<i64>,
    ) -> Result<ReadResult, Error> {
        self.check_open()?;
        let (log_start, log_end) = {
            let st = self.state.borrow();
            (st.log_start, st.log_end())
        };
        if offset < log_start || offset > log_end {
            return Err(Error::OffsetOutOfRange {
                offset,
                log_start,
                log_end,
            });
        }
        let upper = max_offset.unwrap_or(log_end).min(log_end);
        let mut result = ReadResult {
            records: Bytes::new(),
            next_offset: offset,
            log_start_offset: log_start,
            log_end_offset: log_end,
        };
        if offset >= upper {
            return Ok(result);
        }
        let cached = self
            .storage
            .cache
            .borrow_mut()
            .read(self.id, offset, max_bytes, upper);
        let chunks = match cached {
            Some(c) if !c.is_empty() => c,
            _ => self.read_from_disk(offset, max_bytes, upper).await?,
        };
        if let Some(last) = chunks.last() {
            let h = batch::BatchHeader::parse(last)?;
            result.next_offset = h.last_offset() + 1;
        }
        result.records = concat(chunks);
        Ok(result)
    }

    async fn read_from_disk(
        &self,
        offset: i64,
        max_bytes: usize,
        upper: i64,
    ) -> Result<Vec<Bytes>, Error> {
        let _permit = self
            .storage
            .disk_reads
            .acquire_permit(1)
            .await
            .map_err(|e| Error::Config(format!("storage closed: {e}")))?;
        let mut offset = offset;
        loop {
            let unread = {
                let st = self.state.borrow();
                let seg = &st.segments[st.segment_index_for(offset)];
                (!seg.loaded).then_some(seg.base_offset)
            };
            if let Some(base) = unread {
                self.load_segment(base).await?;
                continue;
            }
            let (file_src, path, pos, end, next_base, base, generation) = {
                let st = self.state.borrow();
                let i = st.segment_index_for(offset);
                let seg = &st.segments[i];
                seg.used.set(self.storage.index_tick.get());
                let pos = u64::from(seg.index.lookup((offset - seg.base_offset).max(0) as u32));
                let next_base = st.segments.get(i + 1).map(|s| s.base_offset);
                let src = seg.active.as_ref().map(|a| a.log.clone());
                (
                    src,
                    seg.path("log"),
                    pos,
                    seg.size,
                    next_base,
                    seg.base_offset,
                    seg.generation,
                )
            };
            let file = match &file_src {
                Some(active) => {
                    // Bytes still pending in memory are not on disk yet.
                    active.wait_written(end).await?;
                    active.dma_file().clone()
                }
                None => match self.segment_file(base, &path, generation).await? {
                    Some(f) => f,
                    // Compaction or retention replaced the segment meanwhile: look again.
                    None => continue,
                },
            };
            let span = segment::ReadSpan {
                pos,
                end,
                offset,
                max_bytes,
                upper,
                io_bytes_max: self.storage.limits.read_bytes_max,
            };
            let out = segment::read_batches(&file, &path, span).await?;
            if !out.is_empty() {
                return Ok(out);
            }
            // Nothing at or after `offset` in this segment: go on to the next one.
            match next_base {
                Some(b) if b < upper => offset = b,
                _ => return Ok(out),
            }
        }
    }

    /// A read handle for closed segment `base` at `generation`, or `None` if the
    /// segment changed (swap, removal) before the handle could be trusted.
    async fn segment_file(
        &self,
        base: i64,
        path: &Path,
        generation: u64,
    ) -> Result<Option<Rc<DmaFile>>, Error> {
        if self.swapping.get() == Some(base) {
            self.wait_idle().await;
            return Ok(None);
        }
        if let Some(f) = self.storage.handles.borrow_mut().lookup(path, generation) {
            return Ok(Some(f));
        }
        let f = match open_read(path).await {
            Ok(f) => f,
            // Retention or compaction removed or replaced it meanwhile: look again.
            Err(_) if !self.segment_unchanged(base, generation) => return Ok(None),
            Err(e) => return Err(e),
        };
        // The open may have raced a swap of this path: only trust it if nothing moved.
        if self.swapping.get() == Some(base) || !self.segment_unchanged(base, generation) {
            return Ok(None);
        }
        self.storage
            .handles
            .borrow_mut()
            .insert(path, generation, f.clone());
        Ok(Some(f))
    }

    fn segment_unchanged(&self, base: i64, generation: u64) -> bool {
        let st = self.state.borrow();
        st.segments
            .iter()
            .any(|s| s.base_offset == base && s.generation == generation)
    }

    /// The first offset whose record timestamp is at or after `timestamp`, with that
    /// timestamp; `None` if every record is older. (For compressed batches the batch's
    /// first offset and max timestamp stand in for the record's.)
    pub async fn offset_for_timestamp(&self, timestamp: i64) -> Result<Option<(i64, i64)>, Error> {
        self.guarded(self.offset_for_timestamp_unguarded(timestamp))
            .await
    }

    /// The largest record timestamp in the log (-1: no record), for ListOffsets'
    /// max-timestamp (KIP-734): its first record is
    /// `offset_for_timestamp(max_timestamp())`.
    pub fn max_timestamp(&self) -> i64 {
        let st = self.state.borrow();
        st.segments
            .iter()
            .map(|s| s.max_timestamp)
            .max()
            .unwrap_or(-1)
    }

    async fn offset_for_timestamp_unguarded(
        &self,
        timestamp: i64,
    ) -> Result<Option<(i64, i64)>, Error> {
        let unread = {
            let st = self.state.borrow();
            st.segments
                .iter()
                .find(|s| s.max_timestamp >= timestamp)
                .filter(|s| !s.loaded)
                .map(|s| s.base_offset)
        };
        if let Some(base) = unread {
            self.load_segment(base).await?;
        }
        let start = {
            let st = self.state.borrow();
            let seg = st.segments.iter().find(|s| s.max_timestamp >= timestamp);
            match seg {
                None => return Ok(None),
                Some(s) => {
                    s.used.set(self.storage.index_tick.get());
                    (s.base_offset + i64::from(s.time_index.lookup(timestamp))).max(st.log_start)
                }
            }
        };
        let mut offset = start;
        loop {
            let r = self.read(offset, 1 << 20, None).await?;
            if r.records.is_empty() {
                return Ok(None);
            }
            let mut buf = &r.records[..];
            while let Some(total) = batch::peek_total_bytes(buf) {
                let b = &buf[..total];
                let h = batch::BatchHeader::parse(b)?;
                if h.max_timestamp >= timestamp {
                    let hit = batch::record_timestamps(b)
                        .and_then(|recs| {
                            recs.into_iter()
                                .find(|(o, ts)| *ts >= timestamp && *o >= offset)
                        })
                        .unwrap_or((h.base_offset.max(offset), h.max_timestamp));
                    return Ok(Some(hit));
                }
                buf = &buf[total..];
            }
            offset = r.next_offset;
        }
    }

    /// Removes every offset at or after `offset` (rounded down to the start of the batch
    /// containing it). For followers whose log diverged from their leader's.
    pub async fn truncate_to(&self, offset: i64) -> Result<(), Error> {
        self.guarded(self.truncate_to_unguarded(offset)).await
    }

    async fn truncate_to_unguarded(&self, offset: i64) -> Result<(), Error> {
        self.check_open()?;
        let _guard = self.lock().await;
        let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
        if offset >= log_end {
            return Ok(());
        }
        if offset < log_start {
            return Err(Error::OffsetOutOfRange {
                offset,
                log_start,
                log_end,
            });
        }
        self.drop_clean_marker().await?;
        self.storage.cache.borrow_mut().invalidate(self.id);
        // Snapshots of states that include batches about to go go first (R18 would
        // delete them after a crash too; this keeps them from outliving the cut).
        let above: Vec<i64> = self
            .snapshots
            .borrow()
            .range(offset + 1..)
            .copied()
            .collect();
        self.remove_snapshots(&above).await;
        // Drop whole segments above the one holding `offset`, the highest first: a
        // crash part way leaves a prefix of the log, never a hole in it.
        let removed: Vec<Segment> = {
            let mut st = self.state.borrow_mut();
            let i = st.segment_index_for(offset);
            st.segments.split_off(i + 1)
        };
        for s in removed.iter().rev() {
            if let Some(a) = &s.active {
                a.log.wait_written(a.log.len()).await?;
            }
            self.storage.handles.borrow_mut().forget(&s.path("log"));
            Segment::remove_files(&self.dir, s.base_offset).await;
        }
        // Re-open the now-last segment for appends if it was closed. The segment stays
        // in the log meanwhile, so readers always find a last segment.
        self.reactivate_locked().await?;
        // Find the batch boundary at or below `offset` in the active segment.
        let (pos, next) = self.locate_batch_start(offset).await?;
        let log_file = {
            let mut st = self.state.borrow_mut();
            st.clean_offset = st.clean_offset.min(next);
            st.active_mut().truncate_prepare(pos, next)
        };
        // The cut syncs everything below it; then the index files, which may hold
        // entries past the cut, are rewritten from memory before the log grows back (a
        // stale entry could otherwise match a new batch and be trusted by recovery).
        log_file.truncate(pos).await?;
        let indexes = self.state.borrow().active().index_files();
        indexes.write().await?;
        self.state.borrow_mut().active_mut().indexes_dirty = false;
        // Aborted transactions whose markers went, and the snapshots between the new
        // end and `offset`, go with them (before the log can grow back).
        let new_end = self.log_end_offset();
        {
            let mut st = self.state.borrow_mut();
            let seg = st.active_mut();
            if seg.txn_index.truncate_to_offset(new_end) {
                seg.txn_dirty = true;
            }
        }
        let above: Vec<i64> = self
            .snapshots
            .borrow()
            .range(new_end + 1..)
            .copied()
            .collect();
        self.remove_snapshots(&above).await;
        file::sync_dir(&self.dir).await?;
        self.rebuild_producer_state(i64::MAX, &mut RecoveryReport::default())
            .await?;
        let txn_file = {
            let st = self.state.borrow();
            st.active().txn_dirty.then(|| st.active().txn_index_file())
        };
        if let Some(t) = txn_file {
            t.write().await?;
            self.state.borrow_mut().active_mut().txn_dirty = false;
        }
        if self.log_end_offset() < log_start {
            // The batch holding `offset` began below the log start (DeleteRecords
            // inside a batch), so nothing at or above the start is left: start over,
            // empty, at the log start (Kafka's truncate-fully-and-start-at). A crash
            // before this completes recovers a start clamped to the end (R13), which
            // holds no record below the old start either.
            self.roll_locked_at(Some(log_start)).await?;
            self.delete_segments_below_start().await?;
        }
        let st = self.state.borrow();
        st.check_invariants();
        tracing::info!(log = %self.name, offset, new_end = st.log_end(), "truncated log");
        Ok(())
    }

    /// Position of the first batch of the active segment whose last offset is at or
    /// beyond `offset` (the segment end if none), and the log end a cut there leaves:
    /// that batch's base, or `offset` when the batch starts above it.
    async fn locate_batch_start(&self, offset: i64) -> Result<(u64, i64), Error> {
        let (file, mut pos, end, base) = {
            let st = self.state.borrow();
            let seg = st.active();
            let a = seg.active.as_ref().expect("active");
            let pos = u64::from(seg.index.lookup((offset - seg.base_offset).max(0) as u32));
            (a.log.clone(), pos, seg.size, seg.base_offset)
        };
        file.wait_written(end).await?;
        let mut next = base;
        while pos < end {
            fault::check_io(file.path(), FaultOp::Read)?;
            let head = file
                .dma_file()
                .read_at(pos, batch::HEADER_BYTES)
                .await
                .map_err(|e| Error::io(file.path(), e))?;
            let h = batch::BatchHeader::parse(&head)?;
            if h.last_offset() >= offset {
                // A batch past a compaction gap may start above `offset`: the cut
                // leaves the log ending at `offset` itself, not at that batch, but
                // never below the segment's base (a gap at the front of the segment
                // stays a gap).
                return Ok((pos, h.base_offset.min(offset).max(base)));
            }
            next = h.last_offset() + 1;
            pos += h.total_bytes() as u64;
        }
        Ok((
            end,
            next.max(self.state.borrow().active().next_offset.min(offset)),
        ))
    }

    /// Advances the log start offset to `offset` (Kafka DeleteRecords) and deletes the
    /// segments wholly below it. `offset` must not pass the log end.
    pub async fn delete_records_before(&self, offset: i64) -> Result<i64, Error> {
        self.guarded(self.delete_records_before_unguarded(offset))
            .await
    }

    async fn delete_records_before_unguarded(&self, offset: i64) -> Result<i64, Error> {
        self.check_open()?;
        let log_end = self.log_end_offset();
        if offset > log_end || offset < 0 {
            return Err(Error::OffsetOutOfRange {
                offset,
                log_start: self.log_start_offset(),
                log_end,
            });
        }
        if offset <= self.log_start_offset() {
            return Ok(self.log_start_offset());
        }
        // Excludes truncation, which must not cut below a start being set.
        let _guard = self.lock().await;
        if offset > self.log_end_offset() {
            return Err(Error::OffsetOutOfRange {
                offset,
                log_start: self.log_start_offset(),
                log_end: self.log_end_offset(),
            });
        }
        if offset <= self.log_start_offset() {
            return Ok(self.log_start_offset());
        }
        self.state.borrow_mut().log_start = offset;
        self.write_meta().await?;
        self.delete_segments_below_start().await?;
        Ok(offset)
    }

    /// Writes `partition.meta` with the current log start and clean offset. Writers are
    /// serialized (they share the temp file) and a caller only returns once a write
    /// that started after its own state change has finished, so a checkpoint never goes
    /// backwards.
    async fn write_meta(&self) -> Result<(), Error> {
        self.meta_dirty.set(true);
        loop {
            if self.meta_writing.get() {
                let l = self.idle_event.listen();
                if self.meta_writing.get() {
                    l.await;
                }
                continue;
            }
            if !self.meta_dirty.get() {
                return Ok(());
            }
            self.meta_writing.set(true);
            self.meta_dirty.set(false);
            let res = {
                let _writing = FlagGuard(&self.meta_writing);
                let (start, clean) = {
                    let st = self.state.borrow();
                    (st.log_start, st.clean_offset)
                };
                let text = format!("log_start_offset={start}\nclean_offset={clean}\n");
                file::write_atomic(&self.dir.join(META_FILE), text.as_bytes()).await
            };
            self.idle_event.notify(usize::MAX);
            if let Err(e) = res {
                self.meta_dirty.set(true);
                return Err(e);
            }
        }
    }

    /// Deletes closed segments that end at or below the log start.
    async fn delete_segments_below_start(&self) -> Result<u32, Error> {
        let mut deleted = 0;
        let removing = {
            let st = self.state.borrow();
            st.segments.len() >= 2 && st.segments[1].base_offset <= st.log_start
        };
        if removing {
            self.drop_clean_marker().await?;
        }
        loop {
            let base = {
                let mut st = self.state.borrow_mut();
                if st.segments.len() < 2 || st.segments[1].base_offset > st.log_start {
                    break;
                }
                st.segments.remove(0).base_offset
            };
            self.remove_segment_files(base).await;
            deleted += 1;
        }
        self.delete_snapshots_below_start().await;
        Ok(deleted)
    }

    async fn remove_segment_files(&self, base: i64) {
        self.storage
            .handles
            .borrow_mut()
            .forget(&self.dir.join(segment::file_name(base, "log")));
        Segment::remove_files(&self.dir, base).await;
    }

    /// Deletes closed segments past `retention.ms` (by their newest timestamp) or
    /// beyond `retention.bytes`, oldest first; never the active segment.
    pub async fn enforce_retention(&self) -> Result<u32, Error> {
        self.guarded(self.enforce_retention_unguarded()).await
    }

    async fn enforce_retention_unguarded(&self) -> Result<u32, Error> {
        let cfg = self.config();
        if !cfg.cleanup_delete {
            return Ok(0);
        }
        let _guard = self.lock().await;
        let now = self.storage.now_ms();
        let mut deleted = 0;
        loop {
            let victim = {
                let st = self.state.borrow();
                if st.segments.len() < 2 {
                    None
                } else {
                    let first = &st.segments[0];
                    let newest = if first.max_timestamp >= 0 {
                        first.max_timestamp
                    } else {
                        first.created_ms
                    };
                    let by_time = cfg.retention_ms >= 0 && now - newest > cfg.retention_ms;
                    let total: u64 = st.segments.iter().map(|s| s.size).sum();
                    let by_size = cfg.retention_bytes >= 0
                        && total - first.size >= cfg.retention_bytes as u64;
                    (by_time || by_size).then_some(first.base_offset)
                }
            };
            let Some(base) = victim else { break };
            self.drop_clean_marker().await?;
            {
                let mut st = self.state.borrow_mut();
                st.segments.remove(0);
                st.log_start = st.log_start.max(st.segments[0].base_offset);
            }
            self.remove_segment_files(base).await;
            deleted += 1;
        }
        if deleted > 0 {
            self.write_meta().await?;
            self.delete_snapshots_below_start().await;
            tracing::info!(log = %self.name, deleted, log_start = self.log_start_offset(), "retention deleted segments");
        }
        Ok(deleted)
    }

    /// One compaction pass (`cleanup.policy` with `compact`): if enough of the closed
    /// segments old enough to clean (`min.compaction.lag.ms`) is dirty
    /// (`min.cleanable.dirty.ratio`), builds the latest offset of every key over the
    /// dirty segments (whole segments, within `cleaner_map_bytes_max`) and rewrites the
    /// cleanable segments up to there keeping the latest record per key, dropping
    /// tombstones older than `delete.retention.ms`; compressed batches are decompressed,
    /// filtered and compressed again with their own codec. Transactions follow Kafka's rules
    /// (see [`crate::compact`]): only segments wholly below the first unstable offset
    /// are cleanable, aborted transactions' records go, markers stay until their data
    /// is gone and they are older than `delete.retention.ms`, and batches the producer
    /// state remembers stay (emptied if need be). Offsets never change. Each segment is
    /// swapped in atomically (see `swap_cleaned`); appends are never blocked.
    /// Returns `None` when there was nothing to do.
    pub async fn compact(&self) -> Result<Option<CompactStats>, Error> {
        self.guarded(self.compact_unguarded()).await
    }

    async fn compact_unguarded(&self) -> Result<Option<CompactStats>, Error> {
        let cfg = self.config();
        if !cfg.cleanup_compact || self.closed.get() || self.compacting.get() {
            return Ok(None);
        }
        self.compacting.set(true);
        let _compacting = FlagGuard(&self.compacting);
        let now = self.storage.now_ms();
        // Records of open transactions are never cleaned: stop below the first of them.
        let unstable = self.first_unstable_offset().unwrap_or(i64::MAX);
        let (cands, clean_offset, first_dirty_created) = {
            let st = self.state.borrow();
            let closed = &st.segments[..st.segments.len() - 1];
            let cands: Vec<CleanCandidate> = closed
                .iter()
                .take_while(|s| {
                    s.max_timestamp <= now - cfg.min_compaction_lag_ms && s.next_offset <= unstable
                })
                .map(|s| CleanCandidate {
                    base: s.base_offset,
                    size: s.size,
                    next_offset: s.next_offset,
                    generation: s.generation,
                })
                .collect();
            // max.compaction.lag.ms: the first dirty segment's age, from when it was
            // created (or, after a restart, opened: a restart can delay it).
            let first_dirty_created = closed
                .iter()
                .find(|s| s.next_offset > st.clean_offset)
                .map(|s| s.created_ms);
            (cands, st.clean_offset, first_dirty_created)
        };
        let overdue =
            first_dirty_created.is_some_and(|c| now.saturating_sub(c) >= cfg.max_compaction_lag_ms);
        let total: u64 = cands.iter().map(|c| c.size).sum();
        let dirty: u64 = cands
            .iter()
            .filter(|c| c.next_offset > clean_offset)
            .map(|c| c.size)
            .sum();
        if dirty == 0
            || (!overdue && dirty * 10_000 < total * u64::from(cfg.min_cleanable_dirty_ratio_bp))
        {
            return Ok(None);
        }
        let budget = self.storage.limits.cleaner_map_bytes_max;
        let aborted = AbortedSet::new(self.aborted_index());
        let mut map = KeyMap::default();
        let mut last = None;
        for (i, c) in cands.iter().enumerate() {
            if c.next_offset <= clean_offset {
                continue;
            }
            let mut seg_map = KeyMap::default();
            let mut pos = 0;
            while let Some((batches, next)) = self.segment_batches(c, pos).await? {
                for b in &batches {
                    // Aborted records must not hide committed ones of the same key.
                    let h = batch::BatchHeader::parse(b)?;
                    if aborted.covering(&h).is_none() {
                        seg_map.add_batch(b);
                    }
                    // A compressed batch is decompressed to read its keys: CPU work
                    // other tasks should not wait behind.
                    glommio::yield_if_needed().await;
                }
                pos = next;
                if map.bytes() + seg_map.bytes() > budget {
                    break;
                }
            }
            if map.bytes() + seg_map.bytes() > budget {
                if last.is_none() {
                    tracing::warn!(log = %self.name, segment = c.base, budget, "segment has more keys than the cleaner map holds; not compacting");
                    return Ok(None);
                }
                break;
            }
            map.merge(seg_map);
            last = Some(i);
        }
        let Some(last) = last else { return Ok(None) };
        let mut pass = CleanPass {
            map,
            horizon: now - cfg.delete_retention_ms,
            aborted,
            keeps: self.producers.borrow().cleaner_keeps(),
            markers: MarkerTracker::default(),
        };
        let mut stats = CompactStats::default();
        for c in &cands[..=last] {
            self.clean_segment(c, &mut pass, &mut stats).await?;
        }
        stats.clean_offset = cands[last].next_offset;
        self.state.borrow_mut().clean_offset = stats.clean_offset;
        self.write_meta().await?;
        tracing::info!(log = %self.name, ?stats, "compacted");
        Ok(Some(stats))
    }

    /// The batches of a closed segment from byte `pos`, a window at a time, with the
    /// position after them; `None` at the end.
    async fn segment_batches(
        &self,
        c: &CleanCandidate,
        pos: u64,
    ) -> Result<Option<(Vec<Bytes>, u64)>, Error> {
        if pos >= c.size {
            return Ok(None);
        }
        let path = self.dir.join(segment::file_name(c.base, "log"));
        // A segment that changed under the cleaner reads as ended: its key map is then
        // partial (which only keeps more records) and its swap is refused.
        let Some(file) = self.segment_file(c.base, &path, c.generation).await? else {
            return Ok(None);
        };
        let span = segment::ReadSpan {
            pos,
            end: c.size,
            offset: i64::MIN,
            max_bytes: 4 << 20,
            upper: i64::MAX,
            io_bytes_max: self.storage.limits.read_bytes_max,
        };
        let batches = segment::read_batches(&file, &path, span).await?;
        if batches.is_empty() {
            return Ok(None);
        }
        let next = pos + batches.iter().map(|b| b.len() as u64).sum::<u64>();
        Ok(Some((batches, next)))
    }

    /// Rewrites one segment for `pass` into `<base>.*.cleaned` files and swaps them in.
    async fn clean_segment(
        &self,
        c: &CleanCandidate,
        pass: &mut CleanPass,
        stats: &mut CompactStats,
    ) -> Result<(), Error> {
        let cleaned = |ext: &str| {
            self.dir
                .join(format!("{}.cleaned", segment::file_name(c.base, ext)))
        };
        let out =
            file::AppendFile::open(&cleaned("log"), 0, self.storage.limits.write_bytes_max, 0)
                .await?;
        let mut seg = Segment::empty(&self.dir, c.base, self.storage.now_ms());
        let interval = self.config.borrow().index_interval_bytes;
        let mut changed = false;
        // ABORT markers kept in this segment: their `.txnindex` entries stay.
        let mut kept_aborts = std::collections::HashSet::new();
        let mut pos = 0;
        while let Some((batches, next)) = self.segment_batches(c, pos).await? {
            for b in batches {
                let h = batch::BatchHeader::parse(&b)?;
                let before = h.record_count;
                let (kept, batch_changed) = pass.clean_batch(&h, b, &mut kept_aborts);
                changed |= batch_changed;
                let after = match &kept {
                    Some(k) => batch::BatchHeader::parse(k)?.record_count,
                    None => 0,
                };
                stats.records_removed += (before - after).max(0) as u64;
                if let Some(k) = kept {
                    let h = batch::BatchHeader::parse(&k)?;
                    seg.track_batch(&h, seg.size, k.len() as u64, interval);
                    out.push_bytes(k)?;
                }
                // Filtering a compressed batch decompresses and recompresses it.
                glommio::yield_if_needed().await;
            }
            // Bound memory: write out what this window kept before reading on.
            out.wait_written(out.len()).await?;
            pos = next;
        }
        if !changed {
            drop(out);
            let _ = file::remove(cleaned("log")).await;
            return Ok(());
        }
        out.seal().await?;
        drop(out);
        // The cleaned `.log` keeps the original's modification time, as Kafka's cleaner
        // does: ListOffsets v0 looks segments up by it ([`PartitionLog::segment_times`]).
        // Best effort: a failure leaves the time of the cleaning.
        if let Ok(t) = std::fs::metadata(self.dir.join(segment::file_name(c.base, "log")))
            .and_then(|m| m.modified())
        {
            let _ = std::fs::File::options()
                .write(true)
                .open(cleaned("log"))
                .and_then(|f| f.set_modified(t));
        }
        seg.next_offset = c.next_offset;
        seg.close_time_index();
        let idx = seg.index_files_at(&cleaned("index"), &cleaned("timeindex"));
        idx.write().await?;
        let mut txn_index = self
            .state
            .borrow()
            .segments
            .iter()
            .find(|s| s.base_offset == c.base)
            .map(|s| s.txn_index.clone())
            .unwrap_or_default();
        txn_index.retain(|e| kept_aborts.contains(&e.last_offset));
        seg.txn_index = txn_index;
        if !seg.txn_index.is_empty() {
            seg.txn_index_file_at(&cleaned("txnindex")).write().await?;
        }
        stats.bytes_before += c.size;
        stats.bytes_after += seg.size;
        self.swap_cleaned(c, seg, stats).await
    }

    /// Puts a cleaned segment in place of the original. Crash-safe order: the cleaned
    /// files are complete and synced; the old index files go first (a crash after this
    /// leaves the old or the new `.log` with no index, which recovery rebuilds); then
    /// the `.log` is replaced by rename (atomic), then the new indexes move in, then
    /// the directory is synced. Leftover `*.cleaned` files are removed by recovery.
    async fn swap_cleaned(
        &self,
        c: &CleanCandidate,
        seg: Segment,
        stats: &mut CompactStats,
    ) -> Result<(), Error> {
        let _guard = self.lock().await;
        let name = |ext: &str| self.dir.join(segment::file_name(c.base, ext));
        let cleaned = |ext: &str| {
            self.dir
                .join(format!("{}.cleaned", segment::file_name(c.base, ext)))
        };
        if !self.segment_unchanged(c.base, c.generation) {
            // Retention or truncation removed it meanwhile.
            for ext in ["log", "index", "timeindex", "txnindex"] {
                let _ = file::remove(cleaned(ext)).await;
            }
            return Ok(());
        }
        let io = |p: PathBuf| move |e| Error::io(&p, e);
        self.drop_clean_marker().await?;
        self.swapping.set(Some(c.base));
        let _swapping = SwapGuard(self);
        for ext in ["index", "timeindex"] {
            let _ = file::remove(name(ext)).await;
        }
        if seg.size == 0 {
            // Nothing left in it: the segment goes away entirely (its markers went, so
            // its `.txnindex` lists nothing left to filter).
            let _ = file::remove(cleaned("log")).await;
            let _ = file::remove(name("log")).await;
            for ext in ["index", "timeindex", "txnindex"] {
                let _ = file::remove(cleaned(ext)).await;
            }
            let _ = file::remove(name("txnindex")).await;
            file::sync_dir(&self.dir).await?;
            self.storage.handles.borrow_mut().forget(&name("log"));
            self.storage.cache.borrow_mut().invalidate(self.id);
            self.state
                .borrow_mut()
                .segments
                .retain(|s| s.base_offset != c.base);
            // Its snapshot is one of many below the log end (an older one serves).
            if c.base > self.log_start_offset() {
                self.remove_snapshots(&[c.base]).await;
            }
            stats.segments_removed += 1;
            return Ok(());
        }
        for ext in ["log", "index", "timeindex"] {
            file::rename(cleaned(ext), name(ext))
                .await
                .map_err(io(name(ext)))?;
        }
        // The `.txnindex` is replaced by rename, never removed first: with the old
        // `.log` it must list every aborted transaction there. An entry only goes when
        // its marker went, which needs its data gone already, so the old index with
        // the new log, or the new index with the old log, both filter correctly.
        if seg.txn_index.is_empty() {
            let _ = file::remove(name("txnindex")).await;
        } else {
            file::rename(cleaned("txnindex"), name("txnindex"))
                .await
                .map_err(io(name("txnindex")))?;
        }
        file::sync_dir(&self.dir).await?;
        self.storage.handles.borrow_mut().forget(&name("log"));
        // The tail cache may hold batches of the segment as they were before.
        self.storage.cache.borrow_mut().invalidate(self.id);
        let mut st = self.state.borrow_mut();
        if let Some(old) = st.segments.iter_mut().find(|s| s.base_offset == c.base) {
            old.size = seg.size;
            old.index = seg.index;
            old.time_index = seg.time_index;
            old.txn_index = seg.txn_index;
            old.loaded = true;
            old.txn_dirty = false;
            old.generation = segment::next_generation();
        }
        stats.segments_rewritten += 1;
        Ok(())
    }

    /// Flushes, writes the indexes in full and stops accepting work.
    ///
    /// A failed log is only marked closed (nothing is written: its files' state is
    /// unknown) and answers [`Error::Failed`]; recovery sorts its files out when it is
    /// opened again.
    pub async fn close(&self) -> Result<(), Error> {
        if self.closed.get() {
            return Ok(());
        }
        if let Some(cause) = self.failure() {
            self.closed.set(true);
            self.storage.cache.borrow_mut().invalidate(self.id);
            return Err(Error::Failed(cause));
        }
        self.guarded(self.close_unguarded()).await
    }

    async fn close_unguarded(&self) -> Result<(), Error> {
        let _guard = self.lock().await;
        self.closed.set(true);
        self.storage.forget_active(self.id);
        if self.clean_marker.get() {
            // Nothing changed since a clean open: the files are as recorded.
            self.storage.cache.borrow_mut().invalidate(self.id);
            return Ok(());
        }
        let files = {
            let st = self.state.borrow();
            st.active().active.as_ref().map(|a| a.log.clone())
        };
        // Closed files (an idle log's, or never opened since recovery) left their
        // indexes complete on disk unless entries were added since.
        self.seal_active(files).await?;
        let end = self.state.borrow().log_end();
        // The next open then loads this and replays nothing.
        if !self.snapshots.borrow().contains(&end) {
            let snapshot = self.producers.borrow().encode_snapshot(end);
            self.write_snapshot(end, &snapshot).await?;
        }
        // Last: the next open reads no segment.
        self.write_clean_marker().await?;
        self.storage.cache.borrow_mut().invalidate(self.id);
        Ok(())
    }

    /// A clean stop's first step for this log ([`Storage::close_logs`]): under the lock,
    /// marks it closed (nothing changes its files after this), makes its `.log` durable
    /// and trims it ([`release_file`]), and returns the files the close still writes,
    /// as [`Self::close`] would but without syncing them: the indexes and `.txnindex`
    /// changed since last written, the producer snapshot at the log end, and last
    /// `partition.clean`. `None`: nothing to write (closed already, or unchanged since a
    /// clean open). A failed log is only marked closed, as by [`Self::close`].
    async fn close_begin(&self) -> Result<Option<RoundClose>, Error> {
        if self.closed.get() {
            return Ok(None);
        }
        if let Some(cause) = self.failure() {
            self.closed.set(true);
            self.storage.cache.borrow_mut().invalidate(self.id);
            return Err(Error::Failed(cause));
        }
        self.guarded(self.close_begin_unguarded()).await
    }

    async fn close_begin_unguarded(&self) -> Result<Option<RoundClose>, Error> {
        let _guard = self.lock().await;
        if self.closed.replace(true) {
            return Ok(None);
        }
        self.storage.forget_active(self.id);
        if self.clean_marker.get() {
            // Nothing changed since a clean open: the files are as recorded.
            self.storage.cache.borrow_mut().invalidate(self.id);
            return Ok(None);
        }
        let file = {
            let st = self.state.borrow();
            st.active().active.as_ref().map(|a| a.log.clone())
        };
        if let Some(f) = &file {
            release_file(f).await?;
        }
        let mut writes = Vec::new();
        let end = {
            let st = self.state.borrow();
            let seg = st.active();
            if seg.indexes_dirty {
                writes.extend(seg.index_files().into_writes());
            }
            if seg.txn_dirty {
                writes.push(seg.txn_index_file().into_write());
            }
            st.log_end()
        };
        let snapshot = (!self.snapshots.borrow().contains(&end)).then_some(end);
        if let Some(end) = snapshot {
            let bytes = self.producers.borrow().encode_snapshot(end);
            writes.push(FileWrite::write(
                self.dir.join(snapshot_file_name(end)),
                bytes,
            ));
        }
        Ok(Some(RoundClose {
            writes,
            snapshot,
            marker: FileWrite::write(
                self.dir.join(CLEAN_FILE),
                self.clean_marker_text().into_bytes(),
            ),
        }))
    }

    /// Kafka's first unstable offset: the lowest first offset of the transactions still
    /// open (no marker yet), raised to the log start (DeleteRecords or retention may
    /// have removed the start of an open transaction, and nothing below the log start
    /// can be read: Kafka's `updateFirstUnstableOffset`); `None` when none is open. The
    /// broker's last stable offset is `min(this, high watermark)`; `read_committed`
    /// fetches stop there.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        let open = self.producers.borrow().first_unstable_offset()?;
        Some(open.max(self.log_start_offset()))
    }

    /// The aborted transactions a `read_committed` fetch of `[fetch_offset,
    /// upper_bound)` must report, as (producer id, first offset): Kafka's
    /// `collectAbortedTransactions` — every aborted transaction whose marker is at or
    /// after `fetch_offset` and whose first offset is below `upper_bound`, searching the
    /// `.txnindex` of the segment holding `fetch_offset` and the later ones until an
    /// entry's last stable offset reaches `upper_bound`. Pass the offset after the last
    /// batch returned as the bound.
    pub fn aborted_transactions(&self, fetch_offset: i64, upper_bound: i64) -> Vec<(i64, i64)> {
        let st = self.state.borrow();
        let mut found = Vec::new();
        for seg in &st.segments[st.segment_index_for(fetch_offset)..] {
            if seg.txn_index.collect(fetch_offset, upper_bound, &mut found) {
                break;
            }
        }
        found
            .into_iter()
            .map(|t| (t.producer_id, t.first_offset))
            .collect()
    }

    /// Every `.txnindex` entry of the log, oldest marker first (diagnostics, tests).
    pub fn aborted_index(&self) -> Vec<AbortedTxn> {
        let st = self.state.borrow();
        st.segments
            .iter()
            .flat_map(|s| s.txn_index.entries().iter().copied())
            .collect()
    }

    /// Whether `producer_id` has a transaction open on this partition (data written, no
    /// marker yet): its next transactional batch needs no verification (KIP-890).
    pub fn txn_open(&self, producer_id: i64) -> bool {
        self.producers
            .borrow()
            .get(producer_id)
            .is_some_and(|e| e.txn_first_offset.is_some())
    }

    /// Every producer this partition remembers, in increasing producer id
    /// (DescribeProducers).
    pub fn active_producers(&self) -> Vec<crate::producer::ActiveProducer> {
        self.producers.borrow().active()
    }

    /// A copy of the producer state (diagnostics, tests).
    pub fn producer_state(&self) -> ProducerStateTable {
        self.producers.borrow().clone()
    }

    /// Offsets of the producer snapshots on disk, oldest first.
    pub fn snapshot_offsets(&self) -> Vec<i64> {
        self.snapshots.borrow().iter().copied().collect()
    }

    /// Forgets the producers idle for `producer.id.expiration.ms` or longer as of
    /// `now_ms` (Kafka's rule: those with an open transaction stay); returns how many.
    pub fn expire_producers(&self, now_ms: i64) -> usize {
        let expiration_ms = self.config.borrow().producer_id_expiration_ms;
        self.producers.borrow_mut().expire(now_ms, expiration_ms)
    }
}

/// Adds a transaction a marker just closed to the `.txnindex` of `seg` (the segment
/// holding the marker) if it was aborted.
fn index_completed(seg: &mut Segment, done: &CompletedTxn) {
    if done.aborted {
        seg.txn_index.push(AbortedTxn {
            producer_id: done.producer_id,
            first_offset: done.first_offset,
            last_offset: done.last_offset,
            last_stable_offset: done.last_stable_offset,
        });
        seg.txn_dirty = true;
    }
}

/// Makes an active segment's `.log` ready to close without the syncs a seal makes: its
/// bytes durable (a sync only if some are not yet; under `flush=always` every
/// acknowledged one already is), then the page padding and preallocated space after its
/// logical end trimmed without a sync of its own. The trim needs none: a crash before
/// the file's next sync (or the file system's next commit) leaves zeros after the last
/// batch, which recovery cuts (R2), and a clean stop's round syncs the file system
/// before it writes `partition.clean`. (A roll still seals durably: the next segment
/// must not exist on disk before the old one is whole.)
async fn release_file(f: &Rc<file::AppendFile>) -> Result<(), Error> {
    f.sync_all().await?;
    let len = f.len();
    fault::check_io(f.path(), FaultOp::Write)?;
    f.dma_file()
        .truncate(len)
        .await
        .map_err(|e| Error::io(f.path(), e))
}

/// Client batches at least this large are stored without a copy ([`stored_form`]);
/// smaller ones are copied whole. A kept slice keeps its whole Produce frame allocated
/// until the tail cache frees or joins the batch, and small batches kept so made a 100 B
/// soak's RSS creep (+8.9 MiB over its last 75 s against +2.7 with copies;
/// docs/architecture.md), while their copy costs little: the copy's cost is per byte,
/// and large batches are where it showed.
pub const UNCOPIED_BATCH_BYTES_MIN: usize = 16 << 10;

/// The bytes a batch is stored as, in two pieces written one after the other: a
/// rewritten header and the rest of the batch as given, or (empty, the whole batch).
///
/// A client's batch (offsets to assign) of [`UNCOPIED_BATCH_BYTES_MIN`] or more keeps
/// the client's bytes, a slice of its Produce frame: only the header is copied and
/// rewritten. A whole copy per batch cost 16-28% of the broker's CPU per record at
/// 1 KiB acks=all in 64 KiB and 1 MiB batches (docs/architecture.md). The tail cache
/// holds the two pieces until the batch is first read, when it joins them (see
/// [`crate::cache::TailCache::read`]); its budget counts the batch, not the frame.
/// Everything else is copied whole, as one piece: smaller batches; control batches
/// (markers, which the producer state reads in one piece); and a follower's batches,
/// whose slices would keep the leader's whole Fetch response (up to 32 MiB) allocated
/// for as long as the follower's cache holds any of them, which, unread, is until
/// eviction. A `batch` the caller does not share is taken over without a copy.
fn stored_form(
    batch: Bytes,
    header: &batch::BatchHeader,
    assign_offsets: bool,
    base: i64,
    leader_epoch: i32,
    append_time: Option<i64>,
) -> (Bytes, Bytes) {
    if assign_offsets && batch.len() >= UNCOPIED_BATCH_BYTES_MIN && !header.is_control() {
        return batch::assign_header(&batch, base, leader_epoch, append_time);
    }
    let mut whole = BytesMut::from(batch);
    if assign_offsets {
        batch::assign(&mut whole, base, leader_epoch, append_time);
    }
    (Bytes::new(), whole.freeze())
}

fn concat(chunks: Vec<Bytes>) -> Bytes {
    match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.into_iter().next().expect("one chunk"),
        _ => {
            let mut out = BytesMut::with_capacity(chunks.iter().map(|c| c.len()).sum());
            for c in chunks {
                out.extend_from_slice(&c);
            }
            out.freeze()
        }
    }
}

/// What [`recover_dir`] found.
struct Found {
    segments: Vec<Segment>,
    log_start: i64,
    /// Offsets of the producer snapshots in the directory.
    snapshots: std::collections::BTreeSet<i64>,
    /// The base of the first segment whose `.txnindex` was damaged (R15).
    txn_damaged_from: Option<i64>,
    /// Taken from `partition.clean` without reading the segments.
    clean: bool,
}

/// The segments `partition.clean` in `dir` lists, unread, if it exists, parses and
/// still describes the directory: exactly the `.log` files `bases` (sorted), each as
/// long as it says, and every `.txnindex` there readable. `None` sends the open
/// through recovery.
async fn clean_segments(dir: &Path, bases: &[i64], now: i64) -> Option<Vec<Segment>> {
    let text = std::fs::read_to_string(dir.join(CLEAN_FILE)).ok()?;
    let mut lines = text.lines();
    if lines.next()? != CLEAN_HEADER {
        return None;
    }
    let mut segments = Vec::with_capacity(bases.len());
    for line in lines {
        let f: Vec<i64> = line
            .split(' ')
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        let [base, next, size, max_ts] = f[..] else {
            return None;
        };
        let len = std::fs::metadata(dir.join(segment::file_name(base, "log")))
            .ok()?
            .len();
        if size < 0 || len != size as u64 || next < base {
            return None;
        }
        segments.push(Segment::unread(dir, base, now, next, size as u64, max_ts));
    }
    let listed: Vec<i64> = segments.iter().map(|s| s.base_offset).collect();
    if segments.is_empty() || listed != bases {
        return None;
    }
    for seg in &mut segments {
        // Aborted transactions are answered from memory: read the (rare) `.txnindex`.
        let bytes = segment::read_whole(&seg.path("txnindex")).await.ok()?;
        if let Some(b) = bytes {
            let (idx, clean) = crate::index::TxnIndex::decode(&b, seg.base_offset);
            let beyond = idx
                .entries()
                .last()
                .is_some_and(|e| e.last_offset >= seg.next_offset);
            if !clean || beyond {
                return None;
            }
            seg.txn_index = idx;
        }
    }
    Some(segments)
}

/// Opens every segment in `dir` (recovering each) and returns them with the log start
/// and the snapshots found.
async fn recover_dir(
    dir: &Path,
    storage: &Storage,
    config: &LogConfig,
    report: &mut RecoveryReport,
) -> Result<Found, Error> {
    let mut bases = Vec::new();
    let mut snapshots = std::collections::BTreeSet::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut others = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(base) = segment::parse_log_name(&name) {
            bases.push(base);
        } else if let Some(offset) = parse_snapshot_name(&name) {
            snapshots.insert(offset);
        } else {
            others.push(name);
        }
    }
    bases.sort_unstable();
    let now = storage.now_ms();
    let clean_path = dir.join(CLEAN_FILE);
    let marked = others.iter().any(|n| n == CLEAN_FILE);
    // R12: temp files and indexes whose log is gone.
    for name in others {
        let stem = name.split('.').next().unwrap_or("");
        let orphan_index = [".index", ".timeindex", ".txnindex"]
            .iter()
            .any(|ext| name.ends_with(ext))
            && !stem.parse::<i64>().is_ok_and(|b| bases.contains(&b));
        if name.ends_with(".tmp") || name.ends_with(".cleaned") || orphan_index {
            let _ = std::fs::remove_file(dir.join(&name));
            report.removed_files += 1;
        }
    }
    if marked {
        if let Some(segments) = clean_segments(dir, &bases, now).await {
            let first = segments[0].base_offset;
            let end = segments.last().expect("non-empty").next_offset;
            let log_start = read_meta(dir)?.unwrap_or(first).clamp(first, end);
            let st = LogState {
                segments,
                log_start,
                clean_offset: 0,
            };
            st.check_invariants();
            return Ok(Found {
                segments: st.segments,
                log_start: st.log_start,
                snapshots,
                txn_damaged_from: None,
                clean: true,
            });
        }
        // It no longer describes the files: gone before recovery changes any of them.
        file::remove(&clean_path)
            .await
            .map_err(|e| Error::io(&clean_path, e))?;
        file::sync_dir(dir).await?;
    }
    let mut segments: Vec<Segment> = Vec::new();
    let mut txn_damaged_from = None;
    let mut iter = bases.into_iter();
    while let Some(base) = iter.next() {
        if let Some(prev) = segments.last() {
            let path = dir.join(segment::file_name(base, "log"));
            let empty = std::fs::metadata(&path)
                .map(|m| m.len() == 0)
                .unwrap_or(false);
            if base < prev.next_offset && empty {
                // R10: an empty segment left by a roll that failed half-way (the old
                // segment then kept growing past its base): drop it.
                Segment::remove_files(dir, base).await;
                report.deleted_segments += 1;
                continue;
            }
            if base < prev.next_offset {
                return Err(Error::Corrupt {
                    path: dir.display().to_string(),
                    position: 0,
                    reason: format!(
                        "segment {base} overlaps the previous one ending at {}",
                        prev.next_offset
                    ),
                });
            }
        }
        let (seg, found) =
            Segment::recover(dir, base, now, config.index_interval_bytes, report).await?;
        if found.txn_index_damaged && txn_damaged_from.is_none() {
            txn_damaged_from = Some(base);
        }
        segments.push(seg);
        if found.truncated {
            // R11: nothing after a torn segment can be trusted to be contiguous.
            for later in iter.by_ref() {
                Segment::remove_files(dir, later).await;
                report.deleted_segments += 1;
            }
        }
    }
    // An empty closed segment in the middle carries nothing: drop it (keep the last).
    let last = segments.len().saturating_sub(1);
    let mut kept = Vec::with_capacity(segments.len());
    for (i, s) in segments.into_iter().enumerate() {
        if i != last && s.is_empty() {
            Segment::remove_files(dir, s.base_offset).await;
            report.deleted_segments += 1;
        } else {
            kept.push(s);
        }
    }
    let mut segments = kept;
    let checkpoint = read_meta(dir)?;
    if segments.is_empty() {
        // R14: a new log starts at its checkpointed start (0 for a new partition).
        let base = checkpoint.unwrap_or(0).max(0);
        segments.push(Segment::create_closed(dir, base, now).await?);
        file::sync_dir(dir).await?;
    }
    // The last segment's files open with the first append (`ensure_active`).
    // R13: the start is the checkpoint, clamped into [first base, log end].
    let first = segments[0].base_offset;
    let end = segments.last().expect("non-empty").next_offset;
    let log_start = checkpoint.unwrap_or(first).clamp(first, end);
    let st = LogState {
        segments,
        log_start,
        clean_offset: 0,
    };
    st.check_invariants();
    Ok(Found {
        segments: st.segments,
        log_start: st.log_start,
        snapshots,
        txn_damaged_from,
        clean: false,
    })
}

/// The value of `key` in `partition.meta`; `None` if the file or the key is missing
/// (or unparsable). A file that exists but cannot be read fails the open: guessing
/// the log start would serve records DeleteRecords or retention removed.
fn read_meta_key(dir: &Path, key: &str) -> Result<Option<i64>, Error> {
    let path = dir.join(META_FILE);
    fault::check_io(&path, FaultOp::Read)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, e)),
    };
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.trim().parse().ok()))
}

fn read_meta(dir: &Path) -> Result<Option<i64>, Error> {
    read_meta_key(dir, "log_start_offset")
}
