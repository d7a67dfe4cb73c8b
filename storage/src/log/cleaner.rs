//! Compaction of a log's closed segments (`cleanup.policy` compact): which segments are
//! cleanable, the key map over the dirty ones, and each segment rewritten and swapped
//! in atomically. The record-level rules (the key map, filtering a batch, transactions)
//! are [`crate::compact`]'s.

use std::path::PathBuf;

use bytes::Bytes;

use crate::batch;
use crate::compact::{self, AbortedSet, Filtered, KeyMap, MarkerTracker};
use crate::file;
use crate::segment::{self, Segment};
use crate::Error;

use super::{FlagGuard, PartitionLog};

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

/// Clears the swap marker when dropped.
struct SwapGuard<'a>(&'a PartitionLog);

impl Drop for SwapGuard<'_> {
    fn drop(&mut self) {
        self.0.swapping.set(None);
    }
}

impl PartitionLog {
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
}
