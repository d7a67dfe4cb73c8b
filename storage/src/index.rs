//! Sparse offset index and time index of one segment, held in memory and persisted as
//! flat files of fixed-size big-endian entries.
//!
//! ## `.index` (8 bytes an entry)
//! `relative offset: u32 | file position: u32` — the relative offset is the batch's
//! base offset minus the segment's base offset; the position is where that batch starts
//! in the `.log`. An entry is added before a batch when at least `index.interval.bytes`
//! were appended since the previous entry, so the first batch (position 0) is never
//! indexed and every entry has relative offset > 0 and position > 0.
//!
//! ## `.timeindex` (12 bytes an entry)
//! `max timestamp so far: i64 | relative offset: u32` — added with an offset-index entry
//! when the segment's max timestamp grew, and once more when the segment is closed.
//!
//! Both files are written whole and atomically from the in-memory index (see
//! [`crate::segment`] for when: the active segment's are not held open). Decoding stops
//! at the first entry that does not strictly increase, which is where zero padding, a
//! torn write or garbage begins; the entries before it are kept.
//!
//! ## `.txnindex` (34 bytes an entry, Kafka's `AbortedTxn` layout)
//! `version: i16 (0) | producer id: i64 | first offset: i64 | last offset: i64 |
//! last stable offset: i64` — one entry per aborted transaction, in the segment that
//! holds its ABORT marker: the transaction's first offset, the marker's offset (last
//! offset), and the partition's last stable offset when the marker was written (the
//! first offset of the oldest transaction of another producer then still open, or the
//! marker's offset + 1). Entries are in increasing last offset. A transaction with no
//! data before its marker is not recorded (nothing to filter). The file is absent when
//! the segment has no aborted transaction, and is always written whole and atomically
//! (see [`crate::segment`] for when); decoding stops at the first entry that is not a
//! valid successor (wrong version, first offset not below the last, last offsets not
//! increasing), so a damaged tail is told apart from a clean file.

use bytes::{Buf, BufMut};

pub const OFFSET_ENTRY_BYTES: usize = 8;
pub const TIME_ENTRY_BYTES: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub timestamp: i64,
    pub relative_offset: u32,
}

#[derive(Debug, Default, Clone)]
pub struct OffsetIndex {
    entries: Vec<OffsetEntry>,
}

impl OffsetIndex {
    /// Decodes entries until the first that does not strictly increase.
    pub fn decode(mut buf: &[u8]) -> OffsetIndex {
        let mut entries: Vec<OffsetEntry> = Vec::with_capacity(buf.len() / OFFSET_ENTRY_BYTES);
        while buf.len() >= OFFSET_ENTRY_BYTES {
            let e = OffsetEntry {
                relative_offset: buf.get_u32(),
                position: buf.get_u32(),
            };
            let increases = match entries.last() {
                Some(p) => e.relative_offset > p.relative_offset && e.position > p.position,
                None => e.relative_offset > 0 && e.position > 0,
            };
            if !increases {
                break;
            }
            entries.push(e);
        }
        OffsetIndex { entries }
    }

    pub fn encode_entry(e: &OffsetEntry, out: &mut Vec<u8>) {
        out.put_u32(e.relative_offset);
        out.put_u32(e.position);
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * OFFSET_ENTRY_BYTES);
        for e in &self.entries {
            Self::encode_entry(e, &mut out);
        }
        out
    }

    pub fn push(&mut self, e: OffsetEntry) {
        if let Some(p) = self.entries.last() {
            assert!(
                e.relative_offset > p.relative_offset && e.position > p.position,
                "offset index must strictly increase: {p:?} then {e:?}"
            );
        }
        self.entries.push(e);
    }

    pub fn entries(&self) -> &[OffsetEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The position to start scanning from for `relative_offset`: the last entry at or
    /// below it, or the segment start.
    pub fn lookup(&self, relative_offset: u32) -> u32 {
        let i = self
            .entries
            .partition_point(|e| e.relative_offset <= relative_offset);
        if i == 0 {
            0
        } else {
            self.entries[i - 1].position
        }
    }

    /// Keeps only entries whose position is below `position`.
    pub fn truncate_to_position(&mut self, position: u32) {
        let keep = self.entries.partition_point(|e| e.position < position);
        self.entries.truncate(keep);
    }

    pub fn last(&self) -> Option<OffsetEntry> {
        self.entries.last().copied()
    }

    pub fn pop(&mut self) -> Option<OffsetEntry> {
        self.entries.pop()
    }
}

#[derive(Debug, Default, Clone)]
pub struct TimeIndex {
    entries: Vec<TimeEntry>,
}

impl TimeIndex {
    pub fn decode(mut buf: &[u8]) -> TimeIndex {
        let mut entries: Vec<TimeEntry> = Vec::with_capacity(buf.len() / TIME_ENTRY_BYTES);
        while buf.len() >= TIME_ENTRY_BYTES {
            let e = TimeEntry {
                timestamp: buf.get_i64(),
                relative_offset: buf.get_u32(),
            };
            let increases = match entries.last() {
                Some(p) => e.timestamp > p.timestamp && e.relative_offset >= p.relative_offset,
                None => e.timestamp != 0 || e.relative_offset != 0,
            };
            if !increases {
                break;
            }
            entries.push(e);
        }
        TimeIndex { entries }
    }

    pub fn encode_entry(e: &TimeEntry, out: &mut Vec<u8>) {
        out.put_i64(e.timestamp);
        out.put_u32(e.relative_offset);
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * TIME_ENTRY_BYTES);
        for e in &self.entries {
            Self::encode_entry(e, &mut out);
        }
        out
    }

    /// Adds an entry if the timestamp grew; returns whether it did.
    pub fn maybe_push(&mut self, e: TimeEntry) -> bool {
        if let Some(p) = self.entries.last() {
            if e.timestamp <= p.timestamp || e.relative_offset < p.relative_offset {
                return false;
            }
        }
        self.entries.push(e);
        true
    }

    pub fn entries(&self) -> &[TimeEntry] {
        &self.entries
    }

    pub fn last(&self) -> Option<TimeEntry> {
        self.entries.last().copied()
    }

    /// The relative offset to start scanning from for the first record with timestamp
    /// at or above `timestamp`: the entry just before the first entry reaching it.
    pub fn lookup(&self, timestamp: i64) -> u32 {
        let i = self.entries.partition_point(|e| e.timestamp < timestamp);
        if i == 0 {
            0
        } else {
            self.entries[i - 1].relative_offset
        }
    }

    /// Keeps only entries for relative offsets below `relative_offset`.
    pub fn truncate_to_offset(&mut self, relative_offset: u32) {
        let keep = self
            .entries
            .partition_point(|e| e.relative_offset < relative_offset);
        self.entries.truncate(keep);
    }
}

pub const ABORTED_TXN_BYTES: usize = 34;
/// The only `.txnindex` entry version (Kafka's `AbortedTxn.CURRENT_VERSION`).
pub const ABORTED_TXN_VERSION: i16 = 0;

const _: () = assert!(ABORTED_TXN_BYTES == 2 + 8 + 8 + 8 + 8);

/// One aborted transaction (an entry of a `.txnindex`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The offset of the ABORT marker.
    pub last_offset: i64,
    pub last_stable_offset: i64,
}

/// The aborted transactions whose markers lie in one segment, in marker order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TxnIndex {
    entries: Vec<AbortedTxn>,
}

impl TxnIndex {
    /// Decodes the entries of the segment based at `base_offset` up to the first that is
    /// not a valid successor. Returns them and whether every byte was a valid entry.
    pub fn decode(mut buf: &[u8], base_offset: i64) -> (TxnIndex, bool) {
        let mut idx = TxnIndex::default();
        while buf.len() >= ABORTED_TXN_BYTES {
            let mut b = &buf[..ABORTED_TXN_BYTES];
            let version = b.get_i16();
            let e = AbortedTxn {
                producer_id: b.get_i64(),
                first_offset: b.get_i64(),
                last_offset: b.get_i64(),
                last_stable_offset: b.get_i64(),
            };
            let valid = version == ABORTED_TXN_VERSION
                && e.producer_id >= 0
                && 0 <= e.first_offset
                && e.first_offset < e.last_offset
                && e.last_offset >= base_offset
                && (0..=e.last_offset.saturating_add(1)).contains(&e.last_stable_offset)
                && idx
                    .entries
                    .last()
                    .is_none_or(|p| e.last_offset > p.last_offset);
            if !valid {
                return (idx, false);
            }
            idx.entries.push(e);
            buf = &buf[ABORTED_TXN_BYTES..];
        }
        (idx, buf.is_empty())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * ABORTED_TXN_BYTES);
        for e in &self.entries {
            out.put_i16(ABORTED_TXN_VERSION);
            out.put_i64(e.producer_id);
            out.put_i64(e.first_offset);
            out.put_i64(e.last_offset);
            out.put_i64(e.last_stable_offset);
        }
        out
    }

    /// Adds the entry of a marker after every marker already indexed.
    pub fn push(&mut self, e: AbortedTxn) {
        assert!(
            e.first_offset < e.last_offset,
            "an aborted transaction ends after it begins: {e:?}"
        );
        if let Some(p) = self.entries.last() {
            assert!(
                e.last_offset > p.last_offset,
                "aborted transactions are indexed in marker order: {p:?} then {e:?}"
            );
        }
        self.entries.push(e);
    }

    pub fn entries(&self) -> &[AbortedTxn] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keeps only entries whose marker lies below `offset`; returns whether any went.
    pub fn truncate_to_offset(&mut self, offset: i64) -> bool {
        let keep = self.entries.partition_point(|e| e.last_offset < offset);
        let changed = keep < self.entries.len();
        self.entries.truncate(keep);
        changed
    }

    /// Keeps only the entries `keep` says yes to; returns whether any went.
    pub fn retain(&mut self, keep: impl FnMut(&AbortedTxn) -> bool) -> bool {
        let before = self.entries.len();
        self.entries.retain(keep);
        before != self.entries.len()
    }

    /// Kafka's search for a fetch: adds to `out` every transaction that overlaps
    /// `[fetch_offset, upper_bound)` (marker at or after the fetch offset, first offset
    /// below the bound). Returns true once an entry's last stable offset reaches the
    /// bound: no later segment can hold a transaction that overlaps the range.
    pub fn collect(&self, fetch_offset: i64, upper_bound: i64, out: &mut Vec<AbortedTxn>) -> bool {
        for e in &self.entries {
            if e.last_offset >= fetch_offset && e.first_offset < upper_bound {
                out.push(*e);
            }
            if e.last_stable_offset >= upper_bound {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(pid: i64, first: i64, last: i64, lso: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: last,
            last_stable_offset: lso,
        }
    }

    #[test]
    fn txn_index_round_trips_in_kafkas_layout_and_stops_at_damage() {
        let mut t = TxnIndex::default();
        t.push(txn(7, 100, 105, 106));
        t.push(txn(8, 101, 110, 111));
        let bytes = t.encode();
        assert_eq!(bytes.len(), 2 * ABORTED_TXN_BYTES);
        // version 0, producer id 7, first 100: big-endian as Kafka writes them.
        assert_eq!(&bytes[..10], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(TxnIndex::decode(&bytes, 100), (t.clone(), true));
        // Zero padding, a torn entry, or entries out of order end the decode.
        let mut padded = bytes.clone();
        padded.extend_from_slice(&[0u8; ABORTED_TXN_BYTES]);
        assert_eq!(TxnIndex::decode(&padded, 100), (t.clone(), false));
        assert_eq!(TxnIndex::decode(&bytes[..50], 100).0.len(), 1);
        assert!(!TxnIndex::decode(&bytes[..50], 100).1);
        let mut backwards = TxnIndex::default();
        backwards.push(txn(8, 101, 110, 111));
        let mut b = backwards.encode();
        b.extend_from_slice(&bytes[..ABORTED_TXN_BYTES]);
        assert_eq!(TxnIndex::decode(&b, 100).0.len(), 1);
        // An entry whose marker lies below the segment base is not this segment's.
        assert_eq!(TxnIndex::decode(&bytes, 106).0.len(), 0);
    }

    #[test]
    fn txn_index_collects_overlapping_transactions_until_the_lso_passes_the_bound() {
        let mut t = TxnIndex::default();
        t.push(txn(1, 0, 10, 5)); // another transaction still open from 5
        t.push(txn(2, 5, 20, 21));
        t.push(txn(3, 30, 40, 41));
        let mut out = Vec::new();
        assert!(t.collect(11, 15, &mut out), "lso 21 passes 15: complete");
        assert_eq!(out, vec![txn(2, 5, 20, 21)]);
        out.clear();
        assert!(!t.collect(0, 100, &mut out), "later segments may hold more");
        assert_eq!(out.len(), 3);
        t.truncate_to_offset(20);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn offset_index_round_trips_and_stops_at_padding() {
        let mut idx = OffsetIndex::default();
        idx.push(OffsetEntry {
            relative_offset: 10,
            position: 4100,
        });
        idx.push(OffsetEntry {
            relative_offset: 20,
            position: 8300,
        });
        let mut bytes = idx.encode();
        bytes.extend_from_slice(&[0u8; 4096 - 16]);
        let back = OffsetIndex::decode(&bytes);
        assert_eq!(back.entries(), idx.entries());
        assert_eq!(back.lookup(5), 0);
        assert_eq!(back.lookup(10), 4100);
        assert_eq!(back.lookup(19), 4100);
        assert_eq!(back.lookup(25), 8300);
    }

    #[test]
    fn offset_index_stops_at_non_increasing_entry() {
        let mut bytes = Vec::new();
        OffsetIndex::encode_entry(
            &OffsetEntry {
                relative_offset: 5,
                position: 100,
            },
            &mut bytes,
        );
        OffsetIndex::encode_entry(
            &OffsetEntry {
                relative_offset: 4,
                position: 200,
            },
            &mut bytes,
        );
        assert_eq!(OffsetIndex::decode(&bytes).len(), 1);
        assert_eq!(OffsetIndex::decode(&bytes[..7]).len(), 0);
    }

    #[test]
    fn time_index_lookup_and_truncate() {
        let mut t = TimeIndex::default();
        assert!(t.maybe_push(TimeEntry {
            timestamp: 100,
            relative_offset: 3
        }));
        assert!(!t.maybe_push(TimeEntry {
            timestamp: 100,
            relative_offset: 5
        }));
        assert!(t.maybe_push(TimeEntry {
            timestamp: 200,
            relative_offset: 9
        }));
        assert_eq!(t.lookup(50), 0);
        assert_eq!(t.lookup(150), 3);
        let back = TimeIndex::decode(&t.encode());
        assert_eq!(back.entries(), t.entries());
        t.truncate_to_offset(9);
        assert_eq!(t.entries().len(), 1);
    }
}
