//! The read path: whole batches from the shard's tail cache, else from the segment
//! files (a bounded number of disk reads at once, through the shard's read handles of
//! closed segments); offsets by timestamp; and waiting for appends (a fetch's
//! long-poll).

use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use event_listener::{Event, EventListener};
use glommio::io::DmaFile;

use crate::batch;
use crate::fault::{self, FaultOp};
use crate::segment;
use crate::Error;

use super::PartitionLog;

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

impl PartitionLog {
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

    /// [`Self::read`] when it needs no segment file: `Some` with its answer if the log
    /// is failed or closed, the offset out of range, nothing is to be read, or the tail
    /// cache holds the range; `None` if the read must go to the disk (call
    /// [`Self::read`]). Lets a caller that reads thousands of partitions at once (a
    /// follower's fetch) start a future only for the few that need the disk.
    pub fn read_cached(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: Option<i64>,
    ) -> Option<Result<ReadResult, Error>> {
        if let Some(cause) = self.failure() {
            return Some(Err(Error::Failed(cause)));
        }
        let answer = match self.read_from_memory(offset, max_bytes, max_offset) {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(_)) => return None,
            Err(e) => Err(e),
        };
        if let Err(e) = &answer {
            self.note_failure(e);
        }
        Some(answer)
    }

    /// The checks and the tail-cache read of [`Self::read`]: the answer, or (inner
    /// `Err`) the range `[offset, upper)` to read from the segment files with the
    /// result's other fields.
    #[allow(clippy::type_complexity)]
    fn read_from_memory(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: Option<i64>,
    ) -> Result<Result<ReadResult, (i64, ReadResult)>, Error> {
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
        let result = ReadResult {
            records: Bytes::new(),
            next_offset: offset,
            log_start_offset: log_start,
            log_end_offset: log_end,
        };
        if offset >= upper {
            return Ok(Ok(result));
        }
        let cached = self
            .storage
            .cache
            .borrow_mut()
            .read(self.id, offset, max_bytes, upper);
        match cached {
            Some(chunks) if !chunks.is_empty() => Ok(Ok(with_chunks(result, chunks)?)),
            _ => Ok(Err((upper, result))),
        }
    }

    async fn read_unguarded(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: Option<i64>,
    ) -> Result<ReadResult, Error> {
        match self.read_from_memory(offset, max_bytes, max_offset)? {
            Ok(result) => Ok(result),
            Err((upper, result)) => {
                let chunks = self.read_from_disk(offset, max_bytes, upper).await?;
                with_chunks(result, chunks)
            }
        }
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
    pub(super) async fn segment_file(
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

    pub(super) fn segment_unchanged(&self, base: i64, generation: u64) -> bool {
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
}

/// `result` with the batches read: its records and the offset after the last one.
fn with_chunks(mut result: ReadResult, chunks: Vec<Bytes>) -> Result<ReadResult, Error> {
    if let Some(last) = chunks.last() {
        let h = batch::BatchHeader::parse(last)?;
        result.next_offset = h.last_offset() + 1;
    }
    result.records = concat(chunks);
    Ok(result)
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
