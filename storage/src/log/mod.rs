//! A partition log ([`PartitionLog`]) and the per-shard [`Storage`] that opens logs and
//! owns what they share: the tail cache, the read-handle cache of closed segments, the
//! clock, and the background retention, compaction, producer-expiry and interval-flush
//! tasks.
//!
//! This file holds what every role of a log shares: [`PartitionLog`]'s fields and
//! segments (`LogState`), its small accessors, its failure (every public operation runs
//! through `guarded`) and its lock. Each role is a file of its own, an `impl
//! PartitionLog` block over that state (a child module sees the private fields here, so
//! the split changes no behaviour and no public path: everything public is re-exported
//! below as `log::…`):
//!
//! - `manager.rs` — [`Storage`], the shard's log manager: opening and deleting logs,
//!   the shard's budgets (descriptors of active logs, read handles, index memory) and
//!   the background passes over every log.
//! - `recovery.rs` — what opening a log reads: its segments from a clean close's record
//!   or recovered one by one, and segments loaded on first use.
//! - `producers.rs` — the producer state and its snapshots (section below).
//! - `active.rs` — the active segment's files: opened on demand, closed when idle,
//!   sealed, rolled.
//! - `append.rs` — the append path: judged, given offsets, staged (group commit),
//!   flushed.
//! - `read.rs` — reads (tail cache, then disk), timestamp lookups, waiting for appends.
//! - `retention.rs` — moving the log's ends: retention, DeleteRecords, truncation, reset.
//! - `cleaner.rs` — compaction of closed segments.
//! - `close.rs` — closing a log, and a clean stop of the whole shard in rounds.
//!
//! Where the cut lies, and why: rolls sit with the active segment's files, not with
//! appending, since truncation, `reset_to` and [`PartitionLog::roll`] roll too; the
//! producer state is a role of its own (its rebuild serves both an open and a
//! truncation); `partition.clean` is written by `close.rs` and read by `recovery.rs`,
//! the two ends of a clean restart; the passes over every log of a shard (retention,
//! compaction, expiry, flush) are [`Storage`]'s, the work on one log its own.
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
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};

use event_listener::Event;

use crate::cache::LogId;
use crate::producer::ProducerStateTable;
use crate::segment::Segment;
use crate::{Error, LogConfig};

mod active;
mod append;
mod cleaner;
mod close;
mod journaled;
mod manager;
mod producers;
mod read;
mod recovery;
mod retention;

pub use append::{
    AppendInfo, ChangeHook, Checked, Judged, LeaderFence, Staged, UNCOPIED_BATCH_BYTES_MIN,
};
pub use cleaner::CompactStats;
pub use close::CloseReport;
pub use journaled::Replayed;
pub use manager::{IndexSweep, Storage, INDEX_SWEEP_MS};
pub use producers::{parse_snapshot_name, snapshot_file_name};
pub use read::ReadResult;

const META_FILE: &str = "partition.meta";

/// Written by a clean close, last: every segment's base, next offset, size and largest
/// timestamp. While it exists and the `.log` files are the ones it lists with those
/// sizes, opening the log reads no segment (see [`Storage::open_log`]). The first change
/// to any of the log's files after an open removes it (durably) first.
const CLEAN_FILE: &str = "partition.clean";
const CLEAN_HEADER: &str = "sluice-clean-v1";

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
/// A closed segment as [`PartitionLog::closed_segments`] lists it.
#[derive(Debug, Clone)]
pub struct ClosedSegment {
    pub base_offset: i64,
    /// The offset after its last batch.
    pub next_offset: i64,
    pub max_timestamp: i64,
    pub size: u64,
    pub log: PathBuf,
    /// The indexes may be absent (no entries); so may the transaction index (no
    /// aborted transaction) and the producer snapshot (written at the next segment's
    /// base by the roll, removed by compaction).
    pub index: PathBuf,
    pub time_index: PathBuf,
    pub txn_index: PathBuf,
    pub snapshot: PathBuf,
}

pub struct PartitionLog {
    id: LogId,
    /// This log, for the shard's set of logs with open files ([`ActiveLogs`]).
    ///
    /// [`ActiveLogs`]: manager::ActiveLogs
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
    failure: RefCell<crate::failure::Slot>,
    /// See [`PartitionLog::set_leader_fence`].
    leader_fence: RefCell<Option<LeaderFence>>,
    /// See [`PartitionLog::set_remote_end`].
    remote_end: Cell<i64>,
    /// See [`PartitionLog::set_on_change`].
    on_change: RefCell<Option<append::ChangeHook>>,
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
    /// The shard journal's record of the last append that went there: durable before
    /// [`PartitionLog::flush`] returns.
    last_journaled: RefCell<Option<crate::wal::Pushed>>,
    /// Appends that did not go to the journal (a batch larger than
    /// [`crate::wal::JOURNAL_BATCH_MAX`], a policy other than `flush=always`, or no
    /// journal on the shard), counted; and how many of them a completed segment sync
    /// covered. A flush syncs the segment file while the first is ahead: a journaled
    /// append after an unjournaled one is acknowledged only once the segment holds the
    /// unjournaled one durably (else a crash could leave the journal's batch after a
    /// gap, which replay must skip).
    unjournaled: Cell<u64>,
    unjournaled_synced: Cell<u64>,
    /// When the last journaled append was pushed (the storage clock, ms): see
    /// [`PartitionLog::write_behind_if_idle`].
    last_journaled_ms: Cell<i64>,
    /// In the journal's list of logs to write behind once idle
    /// ([`crate::wal::Wal::write_behind_idle`]).
    pub(crate) idle_watched: Cell<bool>,
}

/// Clears a flag when dropped, even if the holder's future is cancelled.
struct FlagGuard<'a>(&'a Cell<bool>);

impl Drop for FlagGuard<'_> {
    fn drop(&mut self) {
        self.0.set(false);
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

    /// Tiered storage: every offset below `end` is in the object store. Retention of a
    /// log with `remote.storage.enable` deletes only segments wholly below it.
    pub fn set_remote_end(&self, end: i64) {
        self.remote_end.set(end);
    }

    /// The closed segments (every one but the active), oldest first, with what an
    /// upload to the object store needs. Their files are complete and synced (a roll
    /// seals a segment before the next one starts) and are plain files a thread may
    /// read (compacted topics cannot tier, so compaction never swaps them).
    pub fn closed_segments(&self) -> Vec<ClosedSegment> {
        let st = self.state.borrow();
        let n = st.segments.len();
        st.segments[..n.saturating_sub(1)]
            .iter()
            .zip(&st.segments[1..])
            .map(|(s, next)| ClosedSegment {
                base_offset: s.base_offset,
                next_offset: s.next_offset,
                max_timestamp: s.max_timestamp,
                size: s.size,
                log: s.path("log"),
                index: s.path("index"),
                time_index: s.path("timeindex"),
                txn_index: s.path("txnindex"),
                snapshot: self
                    .dir
                    .join(producers::snapshot_file_name(next.base_offset)),
            })
            .collect()
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
        if !crate::failure::any() {
            return None;
        }
        if let Some(cause) = self.failure.borrow().get() {
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
        self.failure.borrow_mut().set(cause);
        if self.last_journaled.borrow().is_some() {
            if let Some(journal) = self.storage.journal() {
                journal.note_failed(&self.name);
            }
        }
        // Nothing is served from a failed log: free its cached batches.
        self.storage.cache.borrow_mut().invalidate(self.id);
        self.append_event.notify(usize::MAX);
        self.changed();
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

    async fn lock(&self) -> BusyGuard<'_> {
        self.wait_idle().await;
        self.busy.set(true);
        BusyGuard(self)
    }
}
