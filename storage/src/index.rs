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
//! Both files may end in zero padding (they are written with O_DIRECT in whole pages).
//! Decoding stops at the first entry that does not strictly increase, which is where
//! padding or a torn write begins; the entries before it are kept.

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

#[cfg(test)]
mod tests {
    use super::*;

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
