//! Moving the log's ends, and deleting what falls outside them: retention (by time and
//! size), DeleteRecords (the log start, kept in `partition.meta`), truncation of a
//! follower's diverged tail, and `reset_to` past the log end.

use crate::batch;
use crate::fault::{self, FaultOp};
use crate::file;
use crate::producer::ProducerStateTable;
use crate::segment::{self, RecoveryReport, Segment};
use crate::Error;

use super::{FlagGuard, PartitionLog, META_FILE};

impl PartitionLog {
    /// Moves the log forward to `offset`, past its end: a new empty active segment
    /// based there, then the log start too, so every record below is dropped and the
    /// next append lands at `offset`. For a follower whose leader has deleted what it
    /// lacks (Kafka's truncate-fully-and-start-at); crash-safe like a roll followed by
    /// `delete_records_before` (recovery keeps an empty last segment, R10).
    pub async fn reset_to(&self, offset: i64) -> Result<(), Error> {
        let r = self.guarded(self.reset_to_unguarded(offset)).await;
        self.changed();
        r
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
            // Recorded first: a replay must not stop at the gap the reset leaves.
            self.journal_op(crate::wal::Op::Reset(offset)).await?;
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

    /// Removes every offset at or after `offset` (rounded down to the start of the batch
    /// containing it). For followers whose log diverged from their leader's.
    pub async fn truncate_to(&self, offset: i64) -> Result<(), Error> {
        let r = self.guarded(self.truncate_to_unguarded(offset)).await;
        self.changed();
        r
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
        // Recorded before anything is cut: a replay must not bring the cut back.
        self.journal_op(crate::wal::Op::Truncate(offset)).await?;
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
        let r = self
            .guarded(self.delete_records_before_unguarded(offset))
            .await;
        self.changed();
        r
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
    pub(super) async fn write_meta(&self) -> Result<(), Error> {
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
    /// beyond `retention.bytes`, oldest first; never the active segment. With
    /// `remote.storage.enable`, `local.retention.*` instead, and only segments already
    /// in the object store.
    pub async fn enforce_retention(&self) -> Result<u32, Error> {
        let r = self.guarded(self.enforce_retention_unguarded()).await;
        if !matches!(r, Ok(0)) {
            self.changed();
        }
        r
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
                    // With tiered storage the local window decides, and only for a
                    // segment already in the object store (retention.* then applies
                    // to the remote log).
                    // (Copying turned off: the topic's retention, uploaded or not.)
                    let tiering = cfg.remote_storage && !cfg.remote_copy_disabled;
                    let (retention_ms, retention_bytes) = if tiering {
                        (cfg.local_retention_ms, cfg.local_retention_bytes)
                    } else {
                        (cfg.retention_ms, cfg.retention_bytes)
                    };
                    let uploaded = !tiering || first.next_offset <= self.remote_end.get();
                    let by_time = retention_ms >= 0 && now - newest > retention_ms;
                    let total: u64 = st.segments.iter().map(|s| s.size).sum();
                    let by_size =
                        retention_bytes >= 0 && total - first.size >= retention_bytes as u64;
                    ((by_time || by_size) && uploaded).then_some(first.base_offset)
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
}
