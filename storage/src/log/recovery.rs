//! Recovery: what opening a log reads from its directory. [`recover_dir`] takes the
//! segments from a clean close's record (`partition.clean`, no segment read) while it
//! still describes the files, and otherwise recovers every segment (the table of cases
//! in [`crate::segment`]), with the log start from `partition.meta`. A segment left
//! unread by a clean open, or whose indexes the index-memory budget dropped, is loaded
//! on first use. The producer state, recovered after the segments, is in
//! `producers.rs`.

use std::path::Path;

use crate::fault::{self, FaultOp};
use crate::file;
use crate::segment::{self, RecoveryReport, Segment};
use crate::{Error, LogConfig};

use super::{
    parse_snapshot_name, LogState, PartitionLog, Storage, CLEAN_FILE, CLEAN_HEADER, META_FILE,
};

impl PartitionLog {
    /// Recovers segment `base` if a clean open left it unread (see [`Segment::loaded`]):
    /// reads its indexes and validates the batches after the last entry. A segment that
    /// no longer matches what the clean close recorded fails the log; the reopen then
    /// recovers every segment.
    pub(super) async fn load_segment(&self, base: i64) -> Result<(), Error> {
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
        // The same bytes ending at a lower offset than the close recorded is no change:
        // a truncation into a compaction gap left the log end past the segment's last
        // batch (the offsets between were compacted away), and the close recorded it.
        if found.truncated || seg.size != expect.1 || seg.next_offset > expect.0 {
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
    pub(super) fn unload_segment(&self, base: i64, generation: u64) -> bool {
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
}

/// What [`recover_dir`] found.
pub(super) struct Found {
    pub(super) segments: Vec<Segment>,
    pub(super) log_start: i64,
    /// Offsets of the producer snapshots in the directory.
    pub(super) snapshots: std::collections::BTreeSet<i64>,
    /// The base of the first segment whose `.txnindex` was damaged (R15).
    pub(super) txn_damaged_from: Option<i64>,
    /// Taken from `partition.clean` without reading the segments.
    pub(super) clean: bool,
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
pub(super) async fn recover_dir(
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
pub(super) fn read_meta_key(dir: &Path, key: &str) -> Result<Option<i64>, Error> {
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
