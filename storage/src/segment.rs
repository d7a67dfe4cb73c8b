//! One segment of a partition log: the `.log` file of batches, its sparse `.index`, its
//! `.timeindex` and its `.txnindex` (aborted transactions), plus in-memory bookkeeping. The last segment of a log is *active*
//! (open for appends, through [`AppendFile`]s); the others are closed, trimmed to their
//! logical length, and read through the shard's read-handle cache.
//!
//! ## Recovery (run for every segment when a log is opened, unless a clean close
//! recorded the segments in `partition.clean`: then each runs when the segment is
//! first read; see [`crate::log`])
//!
//! Batches are validated from the last trustworthy index entry to the end of the file;
//! everything before that entry was validated when it was indexed (closed segments are
//! sealed — synced and trimmed — before the next segment is created). The cases:
//!
//! | case | what is found | how it is detected | what recovery does |
//! |------|---------------|--------------------|--------------------|
//! | R1 | clean: log ends at the last batch, index complete | scan reaches end of file | nothing |
//! | R2 | zeros after the last batch: page padding and preallocated space (unclean stop of the active segment) | header with length 0 | truncate at the first zero byte |
//! | R3 | torn batch: its length runs past end of file | length > bytes left | truncate at the batch start |
//! | R4 | corrupt batch: bad CRC, magic or record count | [`batch::validate`] | truncate at the batch start; nothing after it is served |
//! | R5 | batch offsets going backwards, below the segment base or beyond u32 range | offset check | truncate at that batch |
//! | R6 | `.index` missing | no file | rebuild by scanning the whole segment (and write it, unless it has no entry: an absent index is an empty one, which is how a clean stop leaves a segment smaller than `index.interval.bytes`) |
//! | R7 | index entries past the validated end, or not at a batch of the right offset | check of the last entry, repeated | drop them; scan from the last good entry |
//! | R8 | index garbage (non-increasing entries) | decode stops early | keep the increasing prefix, then R7 |
//! | R9 | `.timeindex` missing, or entries beyond the scan start | entry check | drop them; re-add from the scan |
//! | R10 | empty segment file | size 0 | kept as the active segment if last; removed if not last (an empty segment overlapping its predecessor is what a roll that failed half-way leaves) |
//! | R11 | a closed segment found torn (R2–R5 in a non-last segment) | valid end < file size | truncate it and delete every later segment (offsets must stay contiguous) |
//! | R12 | leftover `*.tmp` and `*.cleaned` files (a crash while writing a file or compacting), index files without a `.log` | names | removed |
//! | R15 | `.txnindex` damaged: a torn or garbage tail, or entries whose marker lies past the validated end | [`TxnIndex::decode`] stops early; entry check | keep the valid prefix and rebuild the segment's entries from the log (see R16) |
//!
//! R13 (log start checkpoint missing or beyond the log end) and R14 (no segments at all)
//! are handled by [`crate::log`], and so is the producer state (the producer table and
//! the `.txnindex` entries it derives), rebuilt after the segments are recovered:
//!
//! | case | what is found | what recovery does |
//! |------|---------------|--------------------|
//! | R16 | producer snapshots at or below the log end | load the newest (at or below the first R15 segment's base, if any); replay the log from it (from the log start if it is older); recompute every `.txnindex` entry whose marker lies in the replayed range |
//! | R17 | a corrupt snapshot (version, CRC, length, offsets) | delete it and try the next older one |
//! | R18 | snapshots above the recovered log end (a torn tail, a crash during truncation) | delete them |
//! | R19 | no usable snapshot | replay from the log start with an empty table |
//!
//! After a replay that started below the active segment, a snapshot at the active
//! segment's base is written (after the repaired indexes), so the next recovery only
//! replays the active segment.
//!
//! The `.index` and `.timeindex` of the active segment are not held open: the active
//! segment holds one descriptor, its `.log`, and its indexes live in memory. They are
//! written whole (atomically, after the `.log` is synced) when the segment is sealed
//! by a roll, when an idle log's files are closed to save descriptors
//! ([`crate::log`]'s budget) if they hold entries (an empty index bounds no recovery),
//! when the log is closed, and after a truncation (before
//! the log can grow back); in between the files lag the in-memory indexes, or are
//! missing for a segment never sealed. So every entry on disk points into bytes that
//! were synced when it was written and not cut since, and R7 can trust the last one.
//! The recovery cost this buys (Kafka's recovery point): after a crash, recovery of
//! the active segment validates every batch written since its indexes were last
//! written — at most the whole active segment (`segment.bytes`, `segment.ms`) — while
//! closed segments are validated only after their last index entry.
//!
//! The `.txnindex` of the active segment is written whole (atomically) when the segment
//! is sealed by a roll, when the log is closed, and after a truncation; in between it
//! may lag the in-memory list. That is safe because every snapshot is written after the
//! `.txnindex` files below its offset (roll, close, R16), so the entries at or above
//! the snapshot a recovery starts from are exactly the ones it recomputes.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use glommio::io::DmaFile;

use crate::batch::{self, BatchHeader, HEADER_BYTES};
use crate::fault::{self, FaultOp};
use crate::file::{self, AppendFile};
use crate::index::{
    OffsetEntry, OffsetIndex, TimeEntry, TimeIndex, TxnIndex, ABORTED_TXN_BYTES,
    OFFSET_ENTRY_BYTES, TIME_ENTRY_BYTES,
};
use crate::simdisk;
use crate::small_files::FileWrite;
use crate::Error;

pub fn file_name(base_offset: i64, ext: &str) -> String {
    format!("{base_offset:020}.{ext}")
}

/// Parses `<20 digits>.log` into its base offset.
pub fn parse_log_name(name: &str) -> Option<i64> {
    let stem = name.strip_suffix(".log")?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

thread_local! {
    static GENERATION: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
}

/// A fresh segment generation, unique on this shard: any change of a segment's files
/// (creation, activation, truncation, compaction swap) takes a new one.
pub fn next_generation() -> u64 {
    GENERATION.with(|g| {
        let v = g.get();
        g.set(v + 1);
        v
    })
}

/// Inputs for opening a segment's `.log` for appending (see [`Segment::activation`]).
pub struct Activation {
    log: PathBuf,
    size: u64,
}

impl Activation {
    /// `write_through`: open the `.log` write-through if the shard has room for one
    /// more (see [`AppendFile::open_log`]).
    pub async fn open(
        self,
        write_bytes_max: usize,
        write_through: bool,
    ) -> Result<ActiveFiles, Error> {
        let log = AppendFile::open_log(
            &self.log,
            self.size,
            write_bytes_max,
            file::PREALLOCATE_BYTES,
            write_through,
        )
        .await?;
        Ok(ActiveFiles { log })
    }
}

/// The files of the active segment held open: its `.log` only (one descriptor). The
/// offset and time indexes live in [`Segment::index`] and [`Segment::time_index`] and
/// are written whole when the segment is sealed (see the module docs).
pub struct ActiveFiles {
    pub log: Rc<AppendFile>,
}

impl ActiveFiles {
    /// The `.log` failed, with its cause.
    pub fn failure(&self) -> Option<String> {
        self.log.failure()
    }

    /// Fails the `.log` (see [`AppendFile::fail`]).
    pub fn fail(&self, cause: &str) {
        self.log.fail(cause);
    }

    /// The `.log` is being truncated (and refuses work meanwhile).
    pub fn truncating(&self) -> bool {
        self.log.truncating()
    }
}

pub struct Segment {
    pub base_offset: i64,
    /// Offset after the last batch (= base offset when empty).
    pub next_offset: i64,
    /// Logical bytes in the `.log`.
    pub size: u64,
    /// Largest batch max-timestamp, -1 when there is none.
    pub max_timestamp: i64,
    /// Wall time when the segment was created or opened (for `segment.ms`).
    pub created_ms: i64,
    pub index: OffsetIndex,
    pub time_index: TimeIndex,
    /// Aborted transactions whose markers lie in this segment.
    pub txn_index: TxnIndex,
    /// `txn_index` differs from the `.txnindex` file.
    pub txn_dirty: bool,
    bytes_since_index: u64,
    /// `index` and `time_index` hold the segment's entries. False for a segment a clean
    /// open took from `partition.clean` without reading its files: it is recovered
    /// (its indexes read, the batches after the last entry validated) on first use.
    pub loaded: bool,
    /// `index` or `time_index` may differ from the `.index`/`.timeindex` files (entries
    /// added or cut since they were last written, or the files not written yet). False
    /// only when the files are known to hold exactly the in-memory entries.
    pub indexes_dirty: bool,
    pub active: Option<ActiveFiles>,
    /// Bumped when compaction replaces the segment's files, so that a reader that
    /// looked up a position before the swap knows to look again.
    pub generation: u64,
    /// The storage's index tick when a read last looked this segment up (or it was
    /// loaded): the least recently used closed segments lose their in-memory indexes
    /// first when the shard's index memory is over its budget.
    pub used: std::cell::Cell<u64>,
    dir: PathBuf,
}

/// What recovery found and did, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    pub truncated_bytes: u64,
    pub rebuilt_indexes: u32,
    pub dropped_index_entries: u32,
    pub deleted_segments: u32,
    pub removed_files: u32,
    /// `.txnindex` entries dropped as damaged or beyond the validated end (R15).
    pub dropped_txn_entries: u32,
    /// The producer snapshot the producer state was loaded from (R16); `None`: the log
    /// was replayed from its start (R19).
    pub producer_snapshot: Option<i64>,
    /// Snapshots deleted as corrupt (R17) or above the log end (R18).
    pub deleted_snapshots: u32,
    /// Batches replayed to rebuild the producer state.
    pub replayed_batches: u64,
}

/// What recovering one segment found, beyond the segment itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The `.log` was cut (R2–R5).
    pub truncated: bool,
    /// The `.txnindex` was damaged (R15): its entries must be rebuilt from the log.
    pub txn_index_damaged: bool,
}

impl Segment {
    pub fn path(&self, ext: &str) -> PathBuf {
        self.dir.join(file_name(self.base_offset, ext))
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    pub fn empty(dir: &Path, base_offset: i64, now_ms: i64) -> Segment {
        Segment {
            base_offset,
            next_offset: base_offset,
            size: 0,
            max_timestamp: -1,
            created_ms: now_ms,
            index: OffsetIndex::default(),
            time_index: TimeIndex::default(),
            txn_index: TxnIndex::default(),
            txn_dirty: false,
            bytes_since_index: 0,
            loaded: true,
            indexes_dirty: true,
            active: None,
            generation: next_generation(),
            used: std::cell::Cell::new(0),
            dir: dir.to_path_buf(),
        }
    }

    /// A closed segment known from a clean close's record (`partition.clean`), its
    /// files unread: [`Segment::loaded`] is false until [`Segment::load_from`].
    pub fn unread(
        dir: &Path,
        base_offset: i64,
        now_ms: i64,
        next_offset: i64,
        size: u64,
        max_timestamp: i64,
    ) -> Segment {
        let mut s = Segment::empty(dir, base_offset, now_ms);
        s.next_offset = next_offset;
        s.size = size;
        s.max_timestamp = max_timestamp;
        s.loaded = false;
        // The clean close wrote the indexes it had: what loading reads.
        s.indexes_dirty = false;
        s
    }

    /// Bytes the in-memory offset and time indexes hold.
    pub fn index_memory(&self) -> u64 {
        (self.index.len() * crate::index::OFFSET_ENTRY_BYTES
            + self.time_index.entries().len() * crate::index::TIME_ENTRY_BYTES) as u64
    }

    /// Drops the in-memory indexes of a closed segment whose index files hold exactly
    /// them: it reads as unloaded ([`Segment::loaded`]) and is recovered from its files
    /// on next use. False (nothing done) for an active, unloaded or dirty one.
    pub fn unload_indexes(&mut self) -> bool {
        if !self.loaded || self.indexes_dirty || self.active.is_some() {
            return false;
        }
        self.index = OffsetIndex::default();
        self.time_index = TimeIndex::default();
        self.loaded = false;
        true
    }

    /// Takes the indexes of `recovered` (this segment recovered from its files).
    pub fn load_from(&mut self, recovered: Segment) {
        self.index = recovered.index;
        self.time_index = recovered.time_index;
        self.bytes_since_index = recovered.bytes_since_index;
        self.indexes_dirty = recovered.indexes_dirty;
        self.loaded = true;
    }

    /// Creates a new, empty segment on disk with its files closed (its first append
    /// opens them).
    pub async fn create_closed(
        dir: &Path,
        base_offset: i64,
        now_ms: i64,
    ) -> Result<Segment, Error> {
        let s = Segment::empty(dir, base_offset, now_ms);
        let path = s.path("log");
        simdisk::alive().map_err(|e| Error::io(&path, e))?;
        fault::check_io(&path, FaultOp::Open)?;
        let f = glommio::io::OpenOptions::new()
            .write(true)
            .create(true)
            .dma_open(&path)
            .await
            .map_err(|e| Error::io(&path, e))?;
        let _ = f.close().await;
        Ok(s)
    }

    /// Creates a new, empty active segment on disk.
    pub async fn create(
        dir: &Path,
        base_offset: i64,
        now_ms: i64,
        write_bytes_max: usize,
        write_through: bool,
    ) -> Result<Segment, Error> {
        let mut s = Segment::empty(dir, base_offset, now_ms);
        s.activate(write_bytes_max, write_through).await?;
        Ok(s)
    }

    /// Opens the `.log` for appending (the indexes stay in memory); `write_through` as
    /// for [`Activation::open`].
    pub async fn activate(
        &mut self,
        write_bytes_max: usize,
        write_through: bool,
    ) -> Result<(), Error> {
        let files = self
            .activation()
            .open(write_bytes_max, write_through)
            .await?;
        self.attach(files);
        Ok(())
    }

    /// What opening this segment's `.log` for appending needs, detached from the
    /// segment so the segment can stay in its log while the file opens.
    pub fn activation(&self) -> Activation {
        assert!(
            self.loaded,
            "a segment's indexes are read before its files open"
        );
        Activation {
            log: self.path("log"),
            size: self.size,
        }
    }

    /// Makes the segment active with `files` (from [`Activation::open`]).
    pub fn attach(&mut self, files: ActiveFiles) {
        self.active = Some(files);
        self.generation = next_generation();
    }

    /// Accounts for a batch written at `position`: index entries every
    /// `interval` bytes, time index when the max timestamp grew, offsets, size.
    pub fn track_batch(&mut self, h: &BatchHeader, position: u64, len: u64, interval: u32) {
        assert!(h.base_offset >= self.next_offset, "offsets must increase");
        assert_eq!(position, self.size, "batches are appended at the end");
        if self.bytes_since_index >= u64::from(interval) && position > 0 {
            let rel = (h.base_offset - self.base_offset) as u32;
            self.index.push(OffsetEntry {
                relative_offset: rel,
                position: position as u32,
            });
            if self.max_timestamp >= 0 {
                self.time_index.maybe_push(TimeEntry {
                    timestamp: self.max_timestamp,
                    relative_offset: rel,
                });
            }
            self.indexes_dirty = true;
            self.bytes_since_index = 0;
        }
        self.bytes_since_index += len;
        self.size += len;
        self.next_offset = h.last_offset() + 1;
        self.max_timestamp = self.max_timestamp.max(h.max_timestamp);
    }

    /// First half of closing the active segment (synchronous): records the final time
    /// index entry and returns the `.log` to seal. The caller seals it, then writes
    /// [`Segment::index_files`] (only entries into synced bytes may reach the index
    /// files), then calls [`Segment::finish_close`].
    pub fn begin_close(&mut self) -> Option<Rc<AppendFile>> {
        self.close_time_index();
        self.active.as_ref().map(|a| a.log.clone())
    }

    /// Adds the closing time-index entry: the segment's max timestamp at its end.
    pub fn close_time_index(&mut self) {
        if self.max_timestamp >= 0 && self.size > 0 {
            self.time_index.maybe_push(TimeEntry {
                timestamp: self.max_timestamp,
                relative_offset: (self.next_offset - self.base_offset) as u32,
            });
            self.indexes_dirty = true;
        }
    }

    pub fn finish_close(&mut self) {
        self.active = None;
    }

    /// The files were sealed while the segment stays the last one (an idle log's
    /// files closed to save descriptors): reads open read handles of a new generation.
    pub fn detach(&mut self) {
        self.active = None;
        self.generation = next_generation();
    }

    pub async fn remove_files(dir: &Path, base_offset: i64) {
        for ext in ["log", "index", "timeindex", "txnindex"] {
            let _ = file::remove(dir.join(file_name(base_offset, ext))).await;
        }
    }

    /// Recovers the segment `base_offset` in `dir` (see the table in the module docs).
    /// Returns the segment (closed) and what recovery had to repair.
    pub async fn recover(
        dir: &Path,
        base_offset: i64,
        now_ms: i64,
        interval: u32,
        report: &mut RecoveryReport,
    ) -> Result<(Segment, Recovered), Error> {
        let mut seg = Segment::empty(dir, base_offset, now_ms);
        let log_path = seg.path("log");
        fault::check_io(&log_path, FaultOp::Open)?;
        let file = glommio::io::OpenOptions::new()
            .read(true)
            .dma_open(&log_path)
            .await
            .map_err(|e| Error::io(&log_path, e))?;
        let file_len = file
            .file_size()
            .await
            .map_err(|e| Error::io(&log_path, e))?;

        let index_bytes = read_whole(&seg.path("index")).await?;
        let time_bytes = read_whole(&seg.path("timeindex")).await?;
        let mut index = match &index_bytes {
            Some(b) => OffsetIndex::decode(b),
            None => {
                report.rebuilt_indexes += 1;
                OffsetIndex::default()
            }
        };
        if let Some(b) = &index_bytes {
            if b.len() % OFFSET_ENTRY_BYTES != 0 || index.len() * OFFSET_ENTRY_BYTES < b.len() {
                // Padding, a torn write or garbage: R8 — the prefix is kept.
                report.dropped_index_entries +=
                    ((b.len() / OFFSET_ENTRY_BYTES) - index.len()) as u32;
            }
        }

        let time_decoded = time_bytes
            .as_deref()
            .map(TimeIndex::decode)
            .unwrap_or_default();
        if time_decoded.entries().is_empty() && !index.is_empty() {
            // R9: the time index is gone but the offset index is not; only a full scan
            // brings the time entries back.
            report.dropped_index_entries += index.len() as u32;
            index = OffsetIndex::default();
        }

        // R7: trust the last entry only if it points at a valid batch of its offset.
        let mut start: Option<(OffsetEntry, BatchHeader)> = None;
        while let Some(e) = index.last() {
            if let Some(h) = batch_at(&file, &log_path, u64::from(e.position), file_len).await? {
                if h.base_offset == base_offset + i64::from(e.relative_offset) {
                    start = Some((e, h));
                    break;
                }
            }
            index.pop();
            report.dropped_index_entries += 1;
        }
        let (scan_pos, min_offset) = match start {
            Some((e, _)) => (
                u64::from(e.position),
                base_offset + i64::from(e.relative_offset),
            ),
            None => (0, base_offset),
        };
        let scan_rel = (min_offset - base_offset) as u32;
        let scan_rel_next = scan_rel.saturating_add(1);

        let mut time_index = time_decoded;
        if time_bytes.is_none() {
            report.rebuilt_indexes += 1;
        }
        // R9: entries at or below the scan start were made from validated batches.
        time_index.truncate_to_offset(scan_rel_next);

        seg.index = index;
        seg.time_index = time_index;
        seg.max_timestamp = seg.time_index.last().map(|e| e.timestamp).unwrap_or(-1);
        seg.size = scan_pos;
        seg.next_offset = min_offset;
        // The batch at the scan start is already indexed: start counting after it.
        seg.bytes_since_index = 0;

        let valid_end = seg
            .scan(&file, scan_pos, file_len, min_offset, interval)
            .await?;
        let _ = file.close().await;
        let truncated = valid_end < file_len;
        if truncated {
            report.truncated_bytes += file_len - valid_end;
            fault::check_io(&log_path, FaultOp::Sync)?;
            let f = glommio::io::OpenOptions::new()
                .write(true)
                .dma_open(&log_path)
                .await
                .map_err(|e| Error::io(&log_path, e))?;
            f.truncate(valid_end)
                .await
                .map_err(|e| Error::io(&log_path, e))?;
            f.fdatasync().await.map_err(|e| Error::io(&log_path, e))?;
            crate::simdisk::cut(&log_path, valid_end);
            let _ = f.close().await;
        }
        let txn_index_damaged = seg.recover_txn_index(report).await?;
        // An absent index file is an empty one: a clean stop removes, rather than
        // writes, the index files of a segment with no entries.
        let index_len_ok =
            index_bytes.as_ref().map_or(0, |b| b.len()) == seg.index.len() * OFFSET_ENTRY_BYTES;
        let time_len_ok = time_bytes.as_ref().map_or(0, |b| b.len())
            == seg.time_index.entries().len() * TIME_ENTRY_BYTES;
        if !index_len_ok || !time_len_ok {
            seg.write_indexes().await?;
        }
        seg.indexes_dirty = false;
        Ok((
            seg,
            Recovered {
                truncated,
                txn_index_damaged,
            },
        ))
    }

    /// R15: reads the `.txnindex`, keeping its valid entries whose markers lie below the
    /// validated end; returns whether anything was dropped (the entries must then be
    /// rebuilt from the log, which the log does with the producer state).
    async fn recover_txn_index(&mut self, report: &mut RecoveryReport) -> Result<bool, Error> {
        let Some(bytes) = read_whole(&self.path("txnindex")).await? else {
            return Ok(false);
        };
        let (mut idx, clean) = TxnIndex::decode(&bytes, self.base_offset);
        let decoded = idx.len();
        idx.truncate_to_offset(self.next_offset);
        let dropped = bytes.len() / ABORTED_TXN_BYTES - idx.len();
        report.dropped_txn_entries += dropped as u32;
        self.txn_dirty = !clean || idx.len() < decoded;
        self.txn_index = idx;
        Ok(self.txn_dirty)
    }

    /// The `.txnindex` as it should be on disk, to write without holding the segment.
    pub fn txn_index_file(&self) -> TxnIndexFile {
        self.txn_index_file_at(&self.path("txnindex"))
    }

    pub fn txn_index_file_at(&self, path: &Path) -> TxnIndexFile {
        TxnIndexFile {
            path: path.to_path_buf(),
            bytes: (!self.txn_index.is_empty()).then(|| self.txn_index.encode()),
        }
    }

    /// Validates batches from `pos`, tracking each; returns the end of the last valid
    /// batch.
    async fn scan(
        &mut self,
        file: &DmaFile,
        mut pos: u64,
        file_len: u64,
        mut min_offset: i64,
        interval: u32,
    ) -> Result<u64, Error> {
        const WINDOW: u64 = 1 << 20;
        while pos < file_len {
            let want = (file_len - pos).min(WINDOW);
            fault::check_io(&self.path("log"), FaultOp::Read)?;
            let buf = file
                .read_at(pos, want as usize)
                .await
                .map_err(|e| Error::io(&self.path("log"), e))?;
            let mut at = 0usize;
            let mut progressed = false;
            while at < buf.len() {
                let rest = &buf[at..];
                let Some(total) = batch::peek_total_bytes(rest) else {
                    if rest.len() >= batch::LOG_OVERHEAD
                        || pos + (at as u64) + (rest.len() as u64) >= file_len
                    {
                        return Ok(pos + at as u64); // R2/R3: padding, garbage or torn header
                    }
                    break; // header crosses the window: read on
                };
                let batch_pos = pos + at as u64;
                if batch_pos + total as u64 > file_len {
                    return Ok(batch_pos); // R3: torn batch
                }
                let owned;
                let bytes: &[u8] = if total <= rest.len() {
                    &rest[..total]
                } else if !progressed && at == 0 {
                    fault::check_io(&self.path("log"), FaultOp::Read)?;
                    owned = file
                        .read_at(batch_pos, total)
                        .await
                        .map_err(|e| Error::io(&self.path("log"), e))?;
                    &owned[..]
                } else {
                    break; // the batch crosses the window: next window starts at it
                };
                let Ok(h) = batch::validate(bytes, false) else {
                    return Ok(batch_pos); // R4
                };
                let rel = h.base_offset - self.base_offset;
                if h.base_offset < min_offset
                    || rel > i64::from(u32::MAX)
                    || h.last_offset() < h.base_offset
                {
                    return Ok(batch_pos); // R5
                }
                self.track_batch(&h, batch_pos, total as u64, interval);
                min_offset = h.last_offset() + 1;
                at += total;
                progressed = true;
            }
            if at == 0 && !progressed {
                return Ok(pos);
            }
            pos += at as u64;
        }
        Ok(pos)
    }

    /// Rewrites both index files in full, durably (the caller then clears
    /// [`Segment::indexes_dirty`] if the segment did not change meanwhile).
    pub async fn write_indexes(&self) -> Result<(), Error> {
        self.index_files().write().await
    }

    /// The full contents of both index files, to write without holding the segment.
    pub fn index_files(&self) -> IndexFiles {
        self.index_files_at(&self.path("index"), &self.path("timeindex"))
    }

    /// The same, to be written at other paths.
    pub fn index_files_at(&self, index: &Path, time: &Path) -> IndexFiles {
        assert!(self.loaded, "only read indexes are written");
        IndexFiles {
            index: (index.to_path_buf(), self.index.encode()),
            time: (time.to_path_buf(), self.time_index.encode()),
        }
    }

    /// Cuts the segment back to `position` (a batch boundary) whose first offset is
    /// `next_offset`. The segment must be active. The index files on disk may still
    /// hold entries past the cut: the caller cuts the `.log` (durably), then writes
    /// [`Segment::index_files`] before the log can grow back.
    pub fn truncate_prepare(&mut self, position: u64, next_offset: i64) -> Rc<AppendFile> {
        let log = self
            .active
            .as_ref()
            .expect("truncate needs an active segment")
            .log
            .clone();
        self.index.truncate_to_position(position as u32);
        let rel = (next_offset - self.base_offset) as u32;
        self.time_index.truncate_to_offset(rel);
        self.size = position;
        self.next_offset = next_offset;
        self.max_timestamp = self.time_index.last().map(|e| e.timestamp).unwrap_or(-1);
        self.bytes_since_index = 0;
        self.generation = next_generation();
        self.indexes_dirty = true;
        log
    }
}

/// A segment's `.txnindex` contents, detached from it: written whole and atomically,
/// or removed when the segment has no aborted transaction.
pub struct TxnIndexFile {
    path: PathBuf,
    bytes: Option<Vec<u8>>,
}

impl TxnIndexFile {
    pub fn is_empty(&self) -> bool {
        self.bytes.is_none()
    }

    /// The same as one write of a clean stop's round (see [`crate::small_files`]).
    pub(crate) fn into_write(self) -> FileWrite {
        match self.bytes {
            Some(b) => FileWrite::write(self.path, b),
            None => FileWrite::remove(self.path),
        }
    }

    pub async fn write(&self) -> Result<(), Error> {
        match &self.bytes {
            Some(b) => file::write_atomic(&self.path, b).await,
            None => match file::remove(&self.path).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::io(&self.path, e)),
            },
        }
    }
}

/// Encoded index files of one segment, detached from it.
pub struct IndexFiles {
    index: (PathBuf, Vec<u8>),
    time: (PathBuf, Vec<u8>),
}

impl IndexFiles {
    pub async fn write(&self) -> Result<(), Error> {
        file::write_atomic(&self.index.0, &self.index.1).await?;
        file::write_atomic(&self.time.0, &self.time.1).await
    }

    /// Both indexes hold no entry (a segment smaller than `index.interval.bytes`, not
    /// yet sealed): their files need not exist, recovery reads an absent index as an
    /// empty one.
    pub fn is_empty(&self) -> bool {
        self.index.1.is_empty() && self.time.1.is_empty()
    }

    /// The same as writes of a clean stop's round (see [`crate::small_files`]): an
    /// empty index is removed rather than written.
    pub(crate) fn into_writes(self) -> [FileWrite; 2] {
        [self.index, self.time].map(|(path, bytes)| {
            if bytes.is_empty() {
                FileWrite::remove(path)
            } else {
                FileWrite::write(path, bytes)
            }
        })
    }
}

/// Reads a whole small file (an index, a snapshot), or `None` if it does not exist.
pub(crate) async fn read_whole(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    fault::check_io(path, FaultOp::Open)?;
    let f = match glommio::io::OpenOptions::new()
        .read(true)
        .dma_open(path)
        .await
    {
        Ok(f) => f,
        Err(e) => {
            let io: std::io::Error = e.into();
            if io.kind() == std::io::ErrorKind::NotFound {
                return Ok(None);
            }
            return Err(Error::io(path, io));
        }
    };
    fault::check_io(path, FaultOp::Read)?;
    let len = f.file_size().await.map_err(|e| Error::io(path, e))?;
    let out = if len == 0 {
        Vec::new()
    } else {
        f.read_at(0, len as usize)
            .await
            .map_err(|e| Error::io(path, e))?
            .to_vec()
    };
    let _ = f.close().await;
    Ok(Some(out))
}

/// The header of the valid batch at `pos`, if there is one.
async fn batch_at(
    file: &DmaFile,
    path: &Path,
    pos: u64,
    file_len: u64,
) -> Result<Option<BatchHeader>, Error> {
    if pos + HEADER_BYTES as u64 > file_len {
        return Ok(None);
    }
    fault::check_io(path, FaultOp::Read)?;
    let head = file
        .read_at(pos, HEADER_BYTES)
        .await
        .map_err(|e| Error::io(path, e))?;
    let Some(total) = batch::peek_total_bytes(&head) else {
        return Ok(None);
    };
    if pos + total as u64 > file_len {
        return Ok(None);
    }
    let bytes = file
        .read_at(pos, total)
        .await
        .map_err(|e| Error::io(path, e))?;
    Ok(batch::validate(&bytes, false).ok())
}

/// What to read from one segment: whole batches between byte `pos` and `end`, skipping
/// batches before `offset`, up to `max_bytes` (but at least one batch), none at or
/// beyond offset `upper`, and no more than `io_bytes_max` of I/O.
#[derive(Debug, Clone, Copy)]
pub struct ReadSpan {
    pub pos: u64,
    pub end: u64,
    pub offset: i64,
    pub max_bytes: usize,
    pub upper: i64,
    pub io_bytes_max: usize,
}

/// Reads the batches `span` describes. Every batch is CRC-checked after the read.
/// An armed read fault ([`crate::fault`]) fails it before any I/O.
///
/// Under the crash simulation a read fails once the simulated process has crashed,
/// also one that was under way then: the crash rewrote the files to what the disk
/// kept, which a process that is gone never reads (its in-memory view, segment sizes
/// included, describes the bytes before the crash).
pub async fn read_batches(
    file: &DmaFile,
    path: &Path,
    span: ReadSpan,
) -> Result<Vec<Bytes>, Error> {
    crate::simdisk::alive().map_err(|e| Error::io(path, e))?;
    fault::check_io(path, FaultOp::Read)?;
    let out = read_batches_unchecked(file, path, span).await;
    crate::simdisk::alive().map_err(|e| Error::io(path, e))?;
    out
}

async fn read_batches_unchecked(
    file: &DmaFile,
    path: &Path,
    span: ReadSpan,
) -> Result<Vec<Bytes>, Error> {
    let ReadSpan {
        mut pos,
        end,
        offset,
        max_bytes,
        upper,
        io_bytes_max: read_bytes_max,
    } = span;
    let mut out: Vec<Bytes> = Vec::new();
    let mut bytes_out = 0usize;
    let mut io_bytes = 0usize;
    while pos < end && io_bytes < read_bytes_max {
        let want = ((max_bytes.saturating_sub(bytes_out)).max(64 << 10) as u64 + 8192)
            .min(end - pos)
            .min((read_bytes_max - io_bytes) as u64);
        let buf = file
            .read_at(pos, want as usize)
            .await
            .map_err(|e| Error::io(path, e))?;
        io_bytes += buf.len();
        let mut at = 0usize;
        while at < buf.len() {
            let rest = &buf[at..];
            let corrupt = |reason: String| Error::Corrupt {
                path: path.display().to_string(),
                position: pos + at as u64,
                reason,
            };
            let Some(total) = batch::peek_total_bytes(rest) else {
                if rest.len() >= batch::LOG_OVERHEAD {
                    return Err(corrupt("bad batch length".into()));
                }
                break;
            };
            if total > rest.len() {
                if at == 0 && out.is_empty() {
                    // One batch larger than the window: read exactly it.
                    let whole = file
                        .read_at(pos, total)
                        .await
                        .map_err(|e| Error::io(path, e))?;
                    if whole.len() < total {
                        return Err(corrupt("batch runs past the end of the segment".into()));
                    }
                    let h = batch::validate(&whole, false).map_err(|e| corrupt(e.to_string()))?;
                    if h.last_offset() >= offset && h.base_offset < upper {
                        out.push(Bytes::copy_from_slice(&whole));
                        return Ok(out);
                    }
                    at = total;
                }
                break;
            }
            let b = &rest[..total];
            let h = batch::validate(b, false).map_err(|e| corrupt(e.to_string()))?;
            if h.base_offset >= upper {
                return Ok(out);
            }
            if h.last_offset() >= offset {
                if !out.is_empty() && bytes_out + total > max_bytes {
                    return Ok(out);
                }
                bytes_out += total;
                out.push(Bytes::copy_from_slice(b));
                if bytes_out >= max_bytes {
                    return Ok(out);
                }
            }
            at += total;
        }
        if at == 0 {
            break;
        }
        pos += at as u64;
    }
    Ok(out)
}
