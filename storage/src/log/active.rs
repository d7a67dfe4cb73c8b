//! The active segment's files: opened on demand (the first append after an open, or
//! after the shard's descriptor budget closed them) within that budget, closed again
//! when the log is idle, sealed, and rolled to a new segment. Rolls are here rather
//! than with appending because truncation, `reset_to` and the public `roll` roll too.

use std::rc::Rc;

use crate::fault::{self, FaultOp};
use crate::file;
use crate::segment::Segment;
use crate::{Error, FlushPolicy};

use super::PartitionLog;

impl PartitionLog {
    /// Counts this log's active files as the most recently used.
    pub(super) fn touch_active(&self) {
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
    ///
    /// [`StorageLimits::active_logs_max`]: crate::StorageLimits::active_logs_max
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
    pub(super) async fn seal_active(&self, log: Option<Rc<file::AppendFile>>) -> Result<(), Error> {
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
    pub(super) async fn ensure_active(&self) -> Result<(), Error> {
        loop {
            self.wait_idle().await;
            if self.state.borrow().active().active.is_some() {
                self.touch_active();
                return Ok(());
            }
            // The reopening is boxed: it is rare, and its futures inline would make
            // every append's future (moved a few times per append) kilobytes larger.
            let _place = Box::pin(self.storage.make_room(Some(self.id))).await;
            let _guard = self.lock().await;
            self.check_open()?;
            Box::pin(self.reactivate_locked()).await?;
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
    pub(super) async fn reactivate_locked(&self) -> Result<(), Error> {
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

    /// Rolls to a new segment first if the next `incoming` bytes would overflow
    /// `segment.bytes` or the active segment is older than `segment.ms`.
    /// `span`: how far past the log end the incoming batch's last offset reaches.
    pub(super) async fn maybe_roll(&self, incoming: u64, span: i64) -> Result<(), Error> {
        self.wait_idle().await;
        if !self.needs_roll(incoming, span) {
            return Ok(());
        }
        let _guard = self.lock().await;
        if self.needs_roll(incoming, span) {
            // Boxed, as the reopening in `ensure_active`.
            Box::pin(self.roll_locked()).await?;
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
    pub(super) async fn roll_locked_at(&self, base: Option<i64>) -> Result<(), Error> {
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
}

/// Makes an active segment's `.log` ready to close without the syncs a seal makes: its
/// bytes durable (a sync only if some are not yet; under `flush=always` every
/// acknowledged one already is), then the page padding and preallocated space after its
/// logical end trimmed without a sync of its own. The trim needs none: a crash before
/// the file's next sync (or the file system's next commit) leaves zeros after the last
/// batch, which recovery cuts (R2), and a clean stop's round syncs the file system
/// before it writes `partition.clean`. (A roll still seals durably: the next segment
/// must not exist on disk before the old one is whole.)
pub(super) async fn release_file(f: &Rc<file::AppendFile>) -> Result<(), Error> {
    f.sync_all().await?;
    let len = f.len();
    fault::check_io(f.path(), FaultOp::Write)?;
    f.dma_file()
        .truncate(len)
        .await
        .map_err(|e| Error::io(f.path(), e))
}
