//! The log's producer state (idempotence and transactions, [`crate::producer`]) and its
//! snapshot files: rebuilt from the newest snapshot and a replay of the batches after
//! it when the log opens and after a truncation, snapshots written and pruned, and the
//! questions fetches and coordinators ask of it (first unstable offset, aborted
//! transactions, open transactions, producers). When snapshots are written: the
//! section "Producer state and snapshots" of the parent module.

use bytes::Bytes;

use crate::batch;
use crate::fault::{self, FaultOp};
use crate::file;
use crate::index::AbortedTxn;
use crate::producer::{CompletedTxn, ProducerStateTable};
use crate::segment::{self, RecoveryReport, Segment};
use crate::Error;

use super::PartitionLog;

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

impl PartitionLog {
    /// Writes the producer snapshot `bytes` (encoded at `offset`) atomically.
    pub(super) async fn write_snapshot(&self, offset: i64, bytes: &[u8]) -> Result<(), Error> {
        file::write_atomic(&self.dir.join(snapshot_file_name(offset)), bytes).await?;
        self.snapshots.borrow_mut().insert(offset);
        Ok(())
    }

    /// Deletes the snapshots at `offsets` (best effort: a snapshot left behind above
    /// the log end is deleted by the next recovery, R18; one below is only older).
    pub(super) async fn remove_snapshots(&self, offsets: &[i64]) {
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
    pub(super) async fn rebuild_producer_state(
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
    pub(super) async fn delete_snapshots_below_start(&self) {
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
pub(super) fn index_completed(seg: &mut Segment, done: &CompletedTxn) {
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
