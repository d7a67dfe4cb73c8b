//! Producer state of one partition, pure: which producer ids wrote here, with which
//! epoch, the sequence ranges and offsets of their last [`BATCHES_KEPT`] batches, and
//! their transactions. It decides, before a batch is appended, whether it is new
//! (append it), a retry of a batch already in the log (answer with that batch's
//! offsets, append nothing) or out of order / from a stale epoch (refuse), following
//! Apache Kafka's `ProducerStateManager` and `ProducerAppendInfo` rules:
//!
//! | case | verdict |
//! |---|---|
//! | no producer id (-1) | append, nothing recorded |
//! | epoch below the producer's current epoch | [`SequenceError::StaleEpoch`] (INVALID_PRODUCER_EPOCH) |
//! | same epoch, same first and last sequence as one of the last 5 batches | [`Verdict::Duplicate`] with its offsets |
//! | same epoch, first sequence = last sequence + 1 (wrapping at `i32::MAX` to 0) | append |
//! | same epoch, anything else (an entry without batches expects 0) | [`SequenceError::OutOfOrder`] (OUT_OF_ORDER_SEQUENCE_NUMBER) |
//! | higher epoch, first sequence 0 | append (the producer bumped its epoch) |
//! | higher epoch, first sequence ≠ 0 | [`SequenceError::OutOfOrder`] |
//! | unknown producer id (never seen, or its state expired or truncated away) | append, any sequence (Kafka accepts it: the state may have gone with the log) |
//! | a non-transactional batch while the producer's transaction is open | [`TxnError::NotTransactional`] (INVALID_TXN_STATE) |
//!
//! ## Transactions
//!
//! A transactional data batch of a producer with no open transaction opens one at the
//! batch's first offset; an end-transaction marker (a control batch,
//! [`crate::batch::EndTxnMarker`]) closes it. Markers carry no sequence. A marker
//! whose producer epoch is below the producer's is refused with
//! [`SequenceError::StaleEpoch`], one whose coordinator epoch is below the last marker's
//! with [`TxnError::CoordinatorFenced`] (TRANSACTION_COORDINATOR_FENCED); a marker with
//! a newer epoch moves the producer to it (forgetting its batches, as a new epoch
//! does). Closing a transaction that wrote data yields a [`CompletedTxn`]; an aborted
//! one goes into the segment's `.txnindex`. The *first unstable offset* is the lowest
//! first offset of the open transactions: `read_committed` consumers stop before it.
//!
//! Replicas copying a leader's log (and recovery replaying it) call
//! [`ProducerStateTable::apply`] without checking (the leader checked), so every replica
//! holds the same state and dedupe survives a leader change.
//!
//! ## Expiry
//!
//! A producer with no open transaction whose last write (a batch's max timestamp, a
//! marker's timestamp) is `producer.id.expiration.ms` or more in the past is forgotten
//! ([`ProducerStateTable::expire`]); the log does that periodically and when it loads
//! a snapshot.
//!
//! ## Snapshot format (`<offset, 20 digits>.snapshot`, see [`crate::log`])
//!
//! The table as it was after every batch below `offset`, big-endian:
//!
//! | field | bytes |
//! |---|---:|
//! | version i16 (= [`SNAPSHOT_VERSION`]) | 2 |
//! | CRC-32C u32 of every byte after this field | 4 |
//! | offset i64 (= the file name's) | 8 |
//! | producer count u32 | 4 |
//! | per producer, in increasing producer id: producer id i64, epoch i16, coordinator epoch i32, last timestamp i64, open transaction's first offset i64 (-1: none), batch count u8 (≤ 5) | 31 |
//! | per batch, oldest first: first sequence i32, last sequence i32, first offset i64, last offset i64 | 24 |
//!
//! Unlike Kafka's snapshot (which keeps only each producer's last batch), all kept
//! batches are stored, so retries of any of the last five batches are still recognised
//! after a restart.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use bytes::{Buf, BufMut};

use crate::batch::{self, BatchHeader, EndTxnMarker};

/// Sequence ranges kept per producer (Kafka's, and the client's max in-flight
/// requests with idempotence).
pub const BATCHES_KEPT: usize = 5;

/// Kafka's `producer.id.expiration.ms` default: one day.
pub const PRODUCER_ID_EXPIRATION_MS_DEFAULT: i64 = 86_400_000;

/// Kafka's `producer.id.expiration.check.interval.ms` default: ten minutes.
pub const PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT: u64 = 600_000;

/// A batch's place in its producer's sequence and in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
}

/// One producer's state on this partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerEntry {
    /// -1 until the producer's first write.
    pub epoch: i16,
    /// The last batches of the current epoch, oldest first, at most [`BATCHES_KEPT`].
    pub batches: VecDeque<BatchMeta>,
    /// The timestamp of the producer's last write (for expiry): its last batch's max
    /// timestamp or its last marker's timestamp.
    pub last_timestamp: i64,
    /// The coordinator epoch of the last marker (-1: none yet).
    pub coordinator_epoch: i32,
    /// The first offset of the producer's open transaction.
    pub txn_first_offset: Option<i64>,
}

impl Default for ProducerEntry {
    fn default() -> Self {
        ProducerEntry {
            epoch: -1,
            batches: VecDeque::new(),
            last_timestamp: -1,
            coordinator_epoch: -1,
            txn_first_offset: None,
        }
    }
}

/// One producer as DescribeProducers (Kafka's `activeProducers`) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub epoch: i16,
    /// The last sequence of its last batch in this epoch; -1 if it wrote none (a
    /// producer known only from a marker, or one whose epoch a marker bumped).
    pub last_seq: i32,
    pub last_timestamp: i64,
    pub coordinator_epoch: i32,
    /// The first offset of its open transaction; -1 if none.
    pub txn_start_offset: i64,
}

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Append,
    /// A retry of a batch already in the log: answer with these offsets.
    Duplicate(BatchMeta),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    #[error("producer {producer_id}: epoch {epoch} is older than the current epoch {current}")]
    StaleEpoch {
        producer_id: i64,
        epoch: i16,
        current: i16,
    },
    #[error(
        "producer {producer_id}: sequence {first_seq} does not follow {last_seq} (epoch {epoch})"
    )]
    OutOfOrder {
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        /// -1: a new epoch must start at 0.
        last_seq: i32,
    },
}

/// A write refused by the transaction rules (see the module's table).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    /// Kafka's INVALID_TXN_STATE.
    #[error(
        "producer {producer_id}: a non-transactional batch while its transaction from offset {txn_first_offset} is open"
    )]
    NotTransactional {
        producer_id: i64,
        txn_first_offset: i64,
    },
    /// Kafka's TRANSACTION_COORDINATOR_FENCED.
    #[error(
        "producer {producer_id}: marker from coordinator epoch {coordinator_epoch}, older than {current}"
    )]
    CoordinatorFenced {
        producer_id: i64,
        coordinator_epoch: i32,
        current: i32,
    },
}

/// A transaction closed by a marker, with the data it covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The marker's offset.
    pub last_offset: i64,
    pub aborted: bool,
    /// The last stable offset as the marker is written: the first offset of the oldest
    /// transaction of another producer still open, else the marker's offset + 1.
    pub last_stable_offset: i64,
}

/// The sequence number after `seq` (sequences wrap from `i32::MAX` to 0).
fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

/// The last sequence of a batch of `record_count` records starting at `first_seq`.
pub fn last_seq(first_seq: i32, last_offset_delta: i32) -> i32 {
    let last = i64::from(first_seq) + i64::from(last_offset_delta);
    if last > i64::from(i32::MAX) {
        (last - i64::from(i32::MAX) - 1) as i32
    } else {
        last as i32
    }
}

/// What compaction must leave in place so the producer state survives it (Kafka's
/// "retain empty" rule, for every batch the state remembers rather than only the
/// last): see [`ProducerStateTable::cleaner_keeps`].
#[derive(Debug, Clone, Default)]
pub struct CleanerKeeps {
    /// (producer id, last offset) of every data batch the state remembers.
    batches: HashSet<(i64, i64)>,
    /// Producers that remember no batch, with their epoch: their markers of that epoch
    /// carry the epoch that fences older producers.
    epoch_only: HashMap<i64, i16>,
}

impl CleanerKeeps {
    /// Whether the batch with header `h` must stay (possibly emptied of its records).
    pub fn keeps(&self, h: &BatchHeader) -> bool {
        if h.producer_id < 0 {
            return false;
        }
        if h.is_control() {
            self.epoch_only.get(&h.producer_id) == Some(&h.producer_epoch)
        } else {
            self.batches.contains(&(h.producer_id, h.last_offset()))
        }
    }
}

/// Producer state of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerStateTable {
    producers: HashMap<i64, ProducerEntry>,
    /// Open transactions as (first offset, producer id), oldest first.
    ongoing: BTreeSet<(i64, i64)>,
}

impl ProducerStateTable {
    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Every producer and its state, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &ProducerEntry)> {
        self.producers.iter().map(|(p, e)| (*p, e))
    }

    /// Every producer this partition remembers, in increasing producer id.
    pub fn active(&self) -> Vec<ActiveProducer> {
        let mut out: Vec<ActiveProducer> = self
            .producers
            .iter()
            .map(|(&producer_id, e)| ActiveProducer {
                producer_id,
                epoch: e.epoch,
                last_seq: e.batches.back().map_or(-1, |b| b.last_seq),
                last_timestamp: e.last_timestamp,
                coordinator_epoch: e.coordinator_epoch,
                txn_start_offset: e.txn_first_offset.unwrap_or(-1),
            })
            .collect();
        out.sort_unstable_by_key(|a| a.producer_id);
        out
    }

    /// The lowest first offset of the open transactions (Kafka's first unstable offset
    /// as far as undecided transactions go).
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing.first().map(|(o, _)| *o)
    }

    /// Judges a data batch a leader is about to append (see the module's table).
    pub fn check(&self, h: &BatchHeader) -> Result<Verdict, SequenceError> {
        if h.producer_id < 0 {
            return Ok(Verdict::Append);
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            return Ok(Verdict::Append);
        };
        let first_seq = h.base_sequence;
        if h.producer_epoch < entry.epoch {
            return Err(SequenceError::StaleEpoch {
                producer_id: h.producer_id,
                epoch: h.producer_epoch,
                current: entry.epoch,
            });
        }
        if h.producer_epoch > entry.epoch {
            return if first_seq == 0 || entry.epoch < 0 {
                Ok(Verdict::Append)
            } else {
                Err(SequenceError::OutOfOrder {
                    producer_id: h.producer_id,
                    epoch: h.producer_epoch,
                    first_seq,
                    last_seq: -1,
                })
            };
        }
        let last_of_batch = last_seq(first_seq, h.last_offset_delta);
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == first_seq && b.last_seq == last_of_batch)
        {
            return Ok(Verdict::Duplicate(*dup));
        }
        // An entry with an epoch but no batch yet (a marker made it) starts its
        // sequence at 0, as Kafka's NO_SEQUENCE + 1.
        let last = entry.batches.back().map_or(-1, |b| b.last_seq);
        if first_seq == next_seq(last) {
            Ok(Verdict::Append)
        } else {
            Err(SequenceError::OutOfOrder {
                producer_id: h.producer_id,
                epoch: h.producer_epoch,
                first_seq,
                last_seq: last,
            })
        }
    }

    /// The transaction rule for a data batch a leader is about to append (after
    /// [`Self::check`] found it new): a producer with an open transaction may only
    /// write transactional batches.
    pub fn check_txn(&self, h: &BatchHeader) -> Result<(), TxnError> {
        if h.producer_id < 0 || h.is_transactional() {
            return Ok(());
        }
        match self
            .producers
            .get(&h.producer_id)
            .and_then(|e| e.txn_first_offset)
        {
            Some(first) => Err(TxnError::NotTransactional {
                producer_id: h.producer_id,
                txn_first_offset: first,
            }),
            None => Ok(()),
        }
    }

    /// The producer-epoch rule for a marker or a coordinator's transactional batch
    /// (Kafka's `checkProducerEpoch`).
    pub fn check_marker_epoch(&self, producer_id: i64, epoch: i16) -> Result<(), SequenceError> {
        match self.producers.get(&producer_id) {
            Some(e) if epoch < e.epoch => Err(SequenceError::StaleEpoch {
                producer_id,
                epoch,
                current: e.epoch,
            }),
            _ => Ok(()),
        }
    }

    /// The coordinator-epoch rule for a marker (Kafka's `checkCoordinatorEpoch`).
    pub fn check_marker_coordinator(
        &self,
        producer_id: i64,
        coordinator_epoch: i32,
    ) -> Result<(), TxnError> {
        match self.producers.get(&producer_id) {
            Some(e) if coordinator_epoch < e.coordinator_epoch => {
                Err(TxnError::CoordinatorFenced {
                    producer_id,
                    coordinator_epoch,
                    current: e.coordinator_epoch,
                })
            }
            _ => Ok(()),
        }
    }

    /// Records the data batch with header `h` appended at `first_offset` (by this leader
    /// after the checks, or copied from the leader's log by a follower, or replayed by
    /// recovery). A control header records nothing: markers go through
    /// [`Self::record_marker`] (or [`Self::apply`]).
    pub fn record(&mut self, h: &BatchHeader, first_offset: i64) {
        if h.producer_id < 0 || h.is_control() {
            return;
        }
        let entry = self.producers.entry(h.producer_id).or_default();
        if h.producer_epoch != entry.epoch {
            // A new epoch starts a new sequence: the old ranges mean nothing in it.
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        let last_offset = first_offset + i64::from(h.last_offset_delta);
        entry.batches.push_back(BatchMeta {
            first_seq: h.base_sequence,
            last_seq: last_seq(h.base_sequence, h.last_offset_delta),
            first_offset,
            last_offset,
        });
        while entry.batches.len() > BATCHES_KEPT {
            entry.batches.pop_front();
        }
        entry.last_timestamp = h.max_timestamp;
        if h.is_transactional() && entry.txn_first_offset.is_none() {
            entry.txn_first_offset = Some(first_offset);
            self.ongoing.insert((first_offset, h.producer_id));
        }
    }

    /// Records an end-transaction marker of `producer_id` at `epoch`, written at
    /// `offset` with `timestamp` (no checks: see [`Self::check_marker_epoch`] and
    /// [`Self::check_marker_coordinator`]). Returns the transaction it closed, if that
    /// transaction wrote data.
    pub fn record_marker(
        &mut self,
        producer_id: i64,
        epoch: i16,
        marker: EndTxnMarker,
        offset: i64,
        timestamp: i64,
    ) -> Option<CompletedTxn> {
        if producer_id < 0 {
            return None;
        }
        let open = self
            .producers
            .get(&producer_id)
            .and_then(|e| e.txn_first_offset);
        let completed = open.map(|first| {
            // Kafka's lastStableOffset(completedTxn): taken while this transaction is
            // still open, so it is skipped by producer id.
            let lso = self
                .ongoing
                .iter()
                .find(|(_, p)| *p != producer_id)
                .map_or(offset + 1, |(o, _)| *o);
            CompletedTxn {
                producer_id,
                first_offset: first,
                last_offset: offset,
                aborted: !marker.commit,
                last_stable_offset: lso,
            }
        });
        if let Some(first) = open {
            self.ongoing.remove(&(first, producer_id));
        }
        let entry = self.producers.entry(producer_id).or_default();
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        entry.coordinator_epoch = marker.coordinator_epoch;
        entry.txn_first_offset = None;
        entry.last_timestamp = timestamp;
        completed
    }

    /// Replays one stored batch (a follower's copy, recovery, a rebuild): records it,
    /// and returns the transaction a marker closed. An empty or unreadable control
    /// batch changes nothing (Kafka: an emptied marker's transaction is gone anyway).
    pub fn apply(&mut self, h: &BatchHeader, batch_bytes: &[u8]) -> Option<CompletedTxn> {
        if h.producer_id < 0 {
            return None;
        }
        if !h.is_control() {
            self.record(h, h.base_offset);
            return None;
        }
        let marker = batch::parse_end_txn_marker(batch_bytes)?;
        self.record_marker(
            h.producer_id,
            h.producer_epoch,
            marker,
            h.base_offset,
            h.max_timestamp,
        )
    }

    /// Forgets producers with no open transaction whose last write is
    /// `expiration_ms` or more before `now_ms` (`producer.id.expiration.ms`, Kafka's
    /// rule); returns how many.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| {
            e.txn_first_offset.is_some() || now_ms.saturating_sub(e.last_timestamp) < expiration_ms
        });
        before - self.producers.len()
    }

    /// Drops everything recorded at or after `offset` (a truncated log), approximately:
    /// producers whose batches all lie beyond it are forgotten, and transactions opened
    /// at or beyond it are closed. (The log rebuilds its table from a snapshot instead,
    /// which is exact.)
    pub fn truncate_from(&mut self, offset: i64) {
        let gone: Vec<(i64, i64)> = self.ongoing.range((offset, i64::MIN)..).copied().collect();
        for (first, pid) in gone {
            self.ongoing.remove(&(first, pid));
            if let Some(e) = self.producers.get_mut(&pid) {
                e.txn_first_offset = None;
            }
        }
        for e in self.producers.values_mut() {
            e.batches.retain(|b| b.last_offset < offset);
        }
        self.producers
            .retain(|_, e| !e.batches.is_empty() || e.txn_first_offset.is_some());
    }

    /// What compaction must keep for this state to survive it: every batch the state
    /// remembers (as an empty batch if its records go), and for a producer that
    /// remembers no batch, its markers of its current epoch.
    pub fn cleaner_keeps(&self) -> CleanerKeeps {
        let mut keeps = CleanerKeeps::default();
        for (pid, e) in &self.producers {
            if e.batches.is_empty() {
                keeps.epoch_only.insert(*pid, e.epoch);
            }
            for b in &e.batches {
                keeps.batches.insert((*pid, b.last_offset));
            }
        }
        keeps
    }

    /// The snapshot of this table valid up to `offset` (see the module docs).
    pub fn encode_snapshot(&self, offset: i64) -> Vec<u8> {
        let mut pids: Vec<i64> = self.producers.keys().copied().collect();
        pids.sort_unstable();
        let mut out = Vec::with_capacity(
            SNAPSHOT_HEADER_BYTES + pids.len() * (SNAPSHOT_ENTRY_BYTES + 2 * SNAPSHOT_BATCH_BYTES),
        );
        out.put_i16(SNAPSHOT_VERSION);
        out.put_u32(0); // CRC, filled below
        out.put_i64(offset);
        out.put_u32(pids.len() as u32);
        for pid in pids {
            let e = &self.producers[&pid];
            out.put_i64(pid);
            out.put_i16(e.epoch);
            out.put_i32(e.coordinator_epoch);
            out.put_i64(e.last_timestamp);
            out.put_i64(e.txn_first_offset.unwrap_or(-1));
            out.put_u8(e.batches.len() as u8);
            for b in &e.batches {
                out.put_i32(b.first_seq);
                out.put_i32(b.last_seq);
                out.put_i64(b.first_offset);
                out.put_i64(b.last_offset);
            }
        }
        let crc = crc32c::crc32c(&out[SNAPSHOT_CRC_END..]);
        out[2..SNAPSHOT_CRC_END].copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// Reads a snapshot back: its offset and table. Refuses anything not exactly as
    /// [`Self::encode_snapshot`] writes it (version, CRC, length, counts, offsets that
    /// lie below the snapshot's).
    pub fn decode_snapshot(bytes: &[u8]) -> Result<(i64, ProducerStateTable), SnapshotError> {
        let bad = |why: &str| Err(SnapshotError(why.to_string()));
        if bytes.len() < SNAPSHOT_HEADER_BYTES {
            return bad("shorter than the header");
        }
        let mut b = bytes;
        let version = b.get_i16();
        if version != SNAPSHOT_VERSION {
            return bad(&format!("unknown version {version}"));
        }
        let crc = b.get_u32();
        if crc != crc32c::crc32c(&bytes[SNAPSHOT_CRC_END..]) {
            return bad("CRC mismatch");
        }
        let offset = b.get_i64();
        let count = b.get_u32();
        let mut table = ProducerStateTable::default();
        for _ in 0..count {
            if b.len() < SNAPSHOT_ENTRY_BYTES {
                return bad("truncated entry");
            }
            let pid = b.get_i64();
            let mut e = ProducerEntry {
                epoch: b.get_i16(),
                coordinator_epoch: b.get_i32(),
                last_timestamp: b.get_i64(),
                ..ProducerEntry::default()
            };
            let txn = b.get_i64();
            let batches = usize::from(b.get_u8());
            if pid < 0 || batches > BATCHES_KEPT || b.len() < batches * SNAPSHOT_BATCH_BYTES {
                return bad("bad entry");
            }
            for _ in 0..batches {
                let m = BatchMeta {
                    first_seq: b.get_i32(),
                    last_seq: b.get_i32(),
                    first_offset: b.get_i64(),
                    last_offset: b.get_i64(),
                };
                if m.first_offset > m.last_offset || m.last_offset >= offset {
                    return bad("batch offsets beyond the snapshot");
                }
                e.batches.push_back(m);
            }
            if txn >= offset || txn < -1 {
                return bad("transaction offset beyond the snapshot");
            }
            if txn >= 0 {
                e.txn_first_offset = Some(txn);
                table.ongoing.insert((txn, pid));
            }
            if table.producers.insert(pid, e).is_some() {
                return bad("producer listed twice");
            }
        }
        if !b.is_empty() {
            return bad("trailing bytes");
        }
        Ok((offset, table))
    }
}

/// The snapshot format version.
pub const SNAPSHOT_VERSION: i16 = 1;
const SNAPSHOT_CRC_END: usize = 6;
const SNAPSHOT_HEADER_BYTES: usize = 18;
const SNAPSHOT_ENTRY_BYTES: usize = 31;
const SNAPSHOT_BATCH_BYTES: usize = 24;

// Pin the layout documented in the module docs.
const _: () = assert!(SNAPSHOT_HEADER_BYTES == 2 + 4 + 8 + 4);
const _: () = assert!(SNAPSHOT_ENTRY_BYTES == 8 + 2 + 4 + 8 + 8 + 1);
const _: () = assert!(SNAPSHOT_BATCH_BYTES == 4 + 4 + 8 + 8);

/// Why a snapshot could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt producer snapshot: {0}")]
pub struct SnapshotError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: i64, epoch: i16, seq: i32, records: i32) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            batch_length: 0,
            leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: records - 1,
            base_timestamp: 1,
            max_timestamp: 1,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            record_count: records,
        }
    }

    /// Checks and records like a leader; returns the verdict.
    fn append(
        t: &mut ProducerStateTable,
        h: &BatchHeader,
        offset: i64,
    ) -> Result<Verdict, SequenceError> {
        let v = t.check(h)?;
        if v == Verdict::Append {
            t.record(h, offset);
        }
        Ok(v)
    }

    #[test]
    fn in_order_batches_append_and_retries_answer_with_the_original_offsets() {
        let mut t = ProducerStateTable::default();
        assert_eq!(
            append(&mut t, &header(7, 0, 0, 3), 100),
            Ok(Verdict::Append)
        );
        assert_eq!(
            append(&mut t, &header(7, 0, 3, 2), 103),
            Ok(Verdict::Append)
        );
        let dup = append(&mut t, &header(7, 0, 0, 3), 999).unwrap();
        assert_eq!(
            dup,
            Verdict::Duplicate(BatchMeta {
                first_seq: 0,
                last_seq: 2,
                first_offset: 100,
                last_offset: 102
            })
        );
        assert!(matches!(
            append(&mut t, &header(7, 0, 3, 2), 999),
            Ok(Verdict::Duplicate(BatchMeta {
                first_offset: 103,
                ..
            }))
        ));
    }

    #[test]
    fn gaps_and_overlaps_are_out_of_order() {
        let mut t = ProducerStateTable::default();
        append(&mut t, &header(7, 0, 0, 3), 0).unwrap();
        // A gap (3 expected).
        assert!(matches!(
            t.check(&header(7, 0, 5, 1)),
            Err(SequenceError::OutOfOrder {
                last_seq: 2,
                first_seq: 5,
                ..
            })
        ));
        // Overlapping but not an exact retry.
        assert!(matches!(
            t.check(&header(7, 0, 1, 3)),
            Err(SequenceError::OutOfOrder { .. })
        ));
    }

    #[test]
    fn only_the_last_five_batches_are_recognised_as_retries() {
        let mut t = ProducerStateTable::default();
        for i in 0..6 {
            append(&mut t, &header(7, 0, i, 1), i64::from(i)).unwrap();
        }
        // Batch seq 0 fell out of the window: a retry of it is out of order now.
        assert!(matches!(
            t.check(&header(7, 0, 0, 1)),
            Err(SequenceError::OutOfOrder { .. })
        ));
        assert!(matches!(
            t.check(&header(7, 0, 1, 1)),
            Ok(Verdict::Duplicate(_))
        ));
        assert_eq!(t.get(7).unwrap().batches.len(), BATCHES_KEPT);
    }

    #[test]
    fn epochs_fence_older_producers_and_a_new_epoch_starts_at_zero() {
        let mut t = ProducerStateTable::default();
        append(&mut t, &header(7, 1, 0, 1), 0).unwrap();
        assert!(matches!(
            t.check(&header(7, 0, 1, 1)),
            Err(SequenceError::StaleEpoch {
                epoch: 0,
                current: 1,
                ..
            })
        ));
        assert!(matches!(
            t.check(&header(7, 2, 5, 1)),
            Err(SequenceError::OutOfOrder { last_seq: -1, .. })
        ));
        assert_eq!(append(&mut t, &header(7, 2, 0, 1), 1), Ok(Verdict::Append));
        assert_eq!(t.get(7).unwrap().epoch, 2);
        assert_eq!(t.get(7).unwrap().batches.len(), 1);
    }

    #[test]
    fn unknown_producers_and_plain_batches_append_with_any_sequence() {
        let t = ProducerStateTable::default();
        assert_eq!(t.check(&header(9, 0, 42, 1)), Ok(Verdict::Append));
        assert_eq!(t.check(&header(-1, -1, -1, 1)), Ok(Verdict::Append));
        let mut t = t;
        t.record(&header(-1, -1, -1, 1), 0);
        assert!(t.is_empty());
    }

    #[test]
    fn sequences_wrap_at_i32_max() {
        assert_eq!(last_seq(i32::MAX, 0), i32::MAX);
        assert_eq!(last_seq(i32::MAX, 1), 0);
        assert_eq!(last_seq(i32::MAX - 1, 3), 1);
        let mut t = ProducerStateTable::default();
        append(&mut t, &header(7, 0, i32::MAX - 1, 2), 0).unwrap();
        assert_eq!(append(&mut t, &header(7, 0, 0, 1), 2), Ok(Verdict::Append));
    }

    #[test]
    fn followers_replaying_the_leaders_log_reach_the_same_state() {
        let mut leader = ProducerStateTable::default();
        let mut follower = ProducerStateTable::default();
        let batches = [
            header(1, 0, 0, 2),
            header(2, 0, 0, 1),
            header(1, 0, 2, 3),
            header(1, 1, 0, 1),
        ];
        let mut offset = 0;
        for h in &batches {
            assert_eq!(append(&mut leader, h, offset), Ok(Verdict::Append));
            follower.record(h, offset);
            offset += i64::from(h.record_count);
        }
        assert_eq!(leader, follower);
    }

    #[test]
    fn truncation_and_expiry_forget_state() {
        let mut t = ProducerStateTable::default();
        append(&mut t, &header(1, 0, 0, 1), 0).unwrap();
        append(&mut t, &header(1, 0, 1, 1), 1).unwrap();
        append(&mut t, &header(2, 0, 0, 1), 2).unwrap();
        t.truncate_from(1);
        assert_eq!(t.get(1).unwrap().batches.len(), 1);
        assert!(t.get(2).is_none());
        // Producer 1's batch 1 is gone: its retry must append again.
        assert_eq!(t.check(&header(1, 0, 1, 1)), Ok(Verdict::Append));
        assert_eq!(t.expire(10_000, 1_000), 1);
        assert!(t.is_empty());
    }

    fn txn_header(pid: i64, epoch: i16, seq: i32, records: i32, ts: i64) -> BatchHeader {
        BatchHeader {
            attributes: batch::ATTR_TRANSACTIONAL,
            max_timestamp: ts,
            ..header(pid, epoch, seq, records)
        }
    }

    fn marker(commit: bool, coordinator_epoch: i32) -> EndTxnMarker {
        EndTxnMarker {
            commit,
            coordinator_epoch,
        }
    }

    #[test]
    fn transactions_open_on_data_close_on_markers_and_set_the_first_unstable_offset() {
        let mut t = ProducerStateTable::default();
        t.record(&txn_header(1, 0, 0, 2, 5), 10); // opens at 10
        t.record(&txn_header(2, 0, 0, 1, 5), 12); // opens at 12
        t.record(&txn_header(1, 0, 2, 1, 6), 13); // same transaction
        assert_eq!(t.first_unstable_offset(), Some(10));
        assert_eq!(t.get(1).unwrap().txn_first_offset, Some(10));
        // Aborting producer 1's: the LSO written with it is producer 2's first offset.
        let done = t.record_marker(1, 0, marker(false, 3), 14, 7).unwrap();
        assert_eq!(
            done,
            CompletedTxn {
                producer_id: 1,
                first_offset: 10,
                last_offset: 14,
                aborted: true,
                last_stable_offset: 12
            }
        );
        assert_eq!(t.first_unstable_offset(), Some(12));
        let e = t.get(1).unwrap();
        assert_eq!(
            (e.coordinator_epoch, e.txn_first_offset, e.last_timestamp),
            (3, None, 7)
        );
        // Committing the last open one: LSO is past its marker.
        let done = t.record_marker(2, 0, marker(true, 3), 15, 8).unwrap();
        assert_eq!((done.aborted, done.last_stable_offset), (false, 16));
        assert_eq!(t.first_unstable_offset(), None);
        // A marker with nothing open (a retried marker) completes nothing.
        assert_eq!(t.record_marker(2, 0, marker(true, 3), 16, 9), None);
    }

    #[test]
    fn active_producers_show_last_sequence_coordinator_epoch_and_open_transaction() {
        let mut t = ProducerStateTable::default();
        append(&mut t, &header(9, 2, 0, 3), 0).unwrap();
        t.record(&txn_header(4, 1, 0, 2, 50), 3); // opens at 3
        t.record(&txn_header(4, 1, 2, 1, 60), 5);
        let active = t.active();
        assert_eq!(
            active,
            vec![
                ActiveProducer {
                    producer_id: 4,
                    epoch: 1,
                    last_seq: 2,
                    last_timestamp: 60,
                    coordinator_epoch: -1,
                    txn_start_offset: 3
                },
                ActiveProducer {
                    producer_id: 9,
                    epoch: 2,
                    last_seq: 2,
                    last_timestamp: 1,
                    coordinator_epoch: -1,
                    txn_start_offset: -1
                },
            ]
        );
        // The commit marker closes the transaction and records its coordinator epoch.
        t.record_marker(4, 1, marker(true, 7), 6, 70);
        let p4 = t.active()[0];
        assert_eq!((p4.txn_start_offset, p4.coordinator_epoch), (-1, 7));
        assert_eq!((p4.last_seq, p4.last_timestamp), (2, 70));
    }

    #[test]
    fn marker_epochs_fence_and_a_bumped_epoch_forgets_the_batches() {
        let mut t = ProducerStateTable::default();
        t.record(&txn_header(1, 2, 0, 1, 5), 0);
        t.record_marker(1, 2, marker(true, 4), 1, 5);
        assert!(matches!(
            t.check_marker_epoch(1, 1),
            Err(SequenceError::StaleEpoch {
                epoch: 1,
                current: 2,
                ..
            })
        ));
        assert!(t.check_marker_epoch(1, 2).is_ok());
        assert!(
            t.check_marker_epoch(99, 0).is_ok(),
            "unknown producers pass"
        );
        assert!(matches!(
            t.check_marker_coordinator(1, 3),
            Err(TxnError::CoordinatorFenced {
                coordinator_epoch: 3,
                current: 4,
                ..
            })
        ));
        assert!(t.check_marker_coordinator(1, 4).is_ok());
        // The coordinator aborts with a bumped epoch (a timed-out transaction).
        t.record_marker(1, 3, marker(false, 4), 2, 6);
        let e = t.get(1).unwrap();
        assert_eq!(e.epoch, 3);
        assert!(e.batches.is_empty());
        // The new epoch's first batch starts at sequence 0; the old epoch is fenced.
        assert_eq!(t.check(&txn_header(1, 3, 0, 1, 7)), Ok(Verdict::Append));
        assert!(t.check(&txn_header(1, 2, 1, 1, 7)).is_err());
    }

    #[test]
    fn a_producer_with_an_open_transaction_may_only_write_transactional_batches() {
        let mut t = ProducerStateTable::default();
        t.record(&txn_header(1, 0, 0, 1, 5), 0);
        assert_eq!(
            t.check_txn(&header(1, 0, 1, 1)),
            Err(TxnError::NotTransactional {
                producer_id: 1,
                txn_first_offset: 0
            })
        );
        assert_eq!(t.check_txn(&txn_header(1, 0, 1, 1, 5)), Ok(()));
        assert_eq!(t.check_txn(&header(2, 0, 0, 1)), Ok(()));
        t.record_marker(1, 0, marker(true, 0), 1, 5);
        assert_eq!(t.check_txn(&header(1, 0, 1, 1)), Ok(()));
    }

    #[test]
    fn expiry_follows_kafka_and_spares_open_transactions() {
        let mut t = ProducerStateTable::default();
        t.record(&header(1, 0, 0, 1), 0); // last write at 1
        t.record(&txn_header(2, 0, 0, 1, 1), 1); // open transaction
        t.record(&txn_header(3, 0, 0, 1, 500), 2);
        t.record_marker(3, 0, marker(true, 0), 3, 500);
        // Expired once now - last >= expiration.
        assert_eq!(t.expire(1_000, 1_000), 0);
        assert_eq!(t.expire(1_001, 1_000), 1);
        assert!(t.get(1).is_none() && t.get(2).is_some());
        assert_eq!(t.expire(10_000, 1_000), 1);
        assert_eq!(t.iter().map(|(p, _)| p).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn snapshots_round_trip_and_refuse_any_damage() {
        let mut t = ProducerStateTable::default();
        for i in 0..7 {
            t.record(&header(1, 0, i, 1), i64::from(i));
        }
        t.record(&txn_header(9, 4, 0, 3, 77), 7);
        t.record_marker(5, 1, marker(false, 2), 10, 88);
        let bytes = t.encode_snapshot(11);
        let (offset, back) = ProducerStateTable::decode_snapshot(&bytes).unwrap();
        assert_eq!((offset, &back), (11, &t));
        assert_eq!(back.first_unstable_offset(), Some(7));
        assert_eq!(back.get(1).unwrap().batches.len(), BATCHES_KEPT);
        // Every single-byte change and every truncation is refused.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(ProducerStateTable::decode_snapshot(&b).is_err(), "byte {i}");
            assert!(ProducerStateTable::decode_snapshot(&bytes[..i]).is_err());
        }
        // A snapshot must not name offsets at or beyond its own.
        let mut early = t.encode_snapshot(8);
        assert!(ProducerStateTable::decode_snapshot(&early).is_err());
        early.truncate(SNAPSHOT_HEADER_BYTES);
        assert!(ProducerStateTable::decode_snapshot(&early).is_err());
        let empty = ProducerStateTable::default().encode_snapshot(0);
        assert_eq!(empty.len(), SNAPSHOT_HEADER_BYTES);
        assert_eq!(
            ProducerStateTable::decode_snapshot(&empty).unwrap(),
            (0, ProducerStateTable::default())
        );
    }

    #[test]
    fn replay_of_marker_batches_matches_direct_recording() {
        let mut direct = ProducerStateTable::default();
        let mut replayed = ProducerStateTable::default();
        let data = txn_header(4, 1, 0, 2, 50);
        direct.record(&data, 0);
        replayed.apply(
            &BatchHeader {
                base_offset: 0,
                ..data
            },
            &[],
        );
        let m = marker(false, 6);
        let mut b = batch::end_txn_marker_batch(4, 1, m, 60);
        batch::assign(&mut b, 2, 0, None);
        let h = BatchHeader::parse(&b).unwrap();
        let a = direct.record_marker(4, 1, m, 2, 60);
        let r = replayed.apply(&h, &b);
        assert_eq!(a, r);
        assert!(r.unwrap().aborted);
        assert_eq!(direct, replayed);
    }

    #[test]
    fn the_cleaner_keeps_every_remembered_batch_and_epoch_only_markers() {
        let mut t = ProducerStateTable::default();
        for i in 0..7 {
            t.record(&header(1, 0, i, 1), i64::from(i));
        }
        t.record_marker(2, 3, marker(true, 0), 7, 1);
        let keeps = t.cleaner_keeps();
        let at = |pid, epoch, offset, control| BatchHeader {
            base_offset: offset,
            attributes: if control { batch::ATTR_CONTROL } else { 0 },
            ..header(pid, epoch, 0, 1)
        };
        assert!(!keeps.keeps(&at(1, 0, 1, false)), "fell out of the window");
        assert!(keeps.keeps(&at(1, 0, 2, false)) && keeps.keeps(&at(1, 0, 6, false)));
        assert!(keeps.keeps(&at(2, 3, 7, true)));
        assert!(!keeps.keeps(&at(2, 2, 7, true)));
        assert!(!keeps.keeps(&at(-1, -1, 0, false)));
    }
}
