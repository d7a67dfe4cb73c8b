//! Log compaction, the pure part: walking the records of a batch, the bounded key map,
//! and rewriting a batch without the records compaction drops.
//!
//! A rewritten batch keeps its base offset, its last offset delta (so the offset span,
//! and with it producer-sequence bookkeeping, is unchanged), its base timestamp and
//! each kept record's bytes verbatim (offset and timestamp deltas included); only the
//! record count, the length and the CRC change. Offsets therefore never move: a
//! compacted log simply has gaps.
//!
//! Compressed batches are compacted like uncompressed ones (as Kafka's cleaner does):
//! their records are decompressed ([`decode`], bounded by
//! [`codec::DECOMPRESSED_BYTES_MAX`]) to count their keys and to filter them, and the
//! records kept are compressed again with the batch's own codec (default levels, as
//! Kafka's cleaner) under the same header rules as above: the same base offset, last
//! offset delta, timestamps, producer id, epoch, base sequence and flags; new length,
//! record count and CRC. (Kafka's cleaner rebuilds the batch, recomputing the base and
//! max timestamps from the records kept; here they stay as the producer wrote them, as
//! for uncompressed batches.) A compressed batch that does not decompress is kept
//! verbatim and its keys are not counted.
//!
//! Not compacted (kept verbatim, and their keys not counted): control batches. Records
//! without a key are kept. Tombstones are dropped once their timestamp is older than
//! `delete.retention.ms` (Kafka counts from when the tombstone's segment was first
//! cleaned instead).
//!
//! ## Transactions (Kafka's cleaner rules)
//!
//! - The cleaner never reaches the first unstable offset: only segments wholly below
//!   it are cleaned, so records of open transactions stay as they are.
//! - Batches of aborted transactions ([`AbortedSet`], from the `.txnindex` files) lose
//!   all their records (compressed ones too) and add no keys to the map; committed
//!   transactional records are compacted like any others.
//! - A marker goes once the data it covers is gone and it is older than
//!   `delete.retention.ms` ([`MarkerTracker`]): an ABORT marker when no batch of its
//!   transaction was met in this pass, a COMMIT marker when no transactional batch of
//!   its producer was met since the producer's previous marker. Until then it stays,
//!   with its `.txnindex` entry.
//! - A batch the producer state still remembers ([`crate::producer::CleanerKeeps`])
//!   is never removed: if its records go, an empty batch (header only, uncompressed,
//!   as Kafka writes it) stays, so that sequence numbers and epochs survive a rebuild
//!   of the state from the log.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use bytes::BufMut;

use crate::batch::{self, get_varint, BatchHeader, EndTxnMarker, HEADER_BYTES};
use crate::codec::{self, Codec, Lz4Framing};
use crate::index::AbortedTxn;

/// One record of a batch (inside the decompressed records of a compressed one).
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    /// A null value: a delete marker for the key.
    pub is_tombstone: bool,
    /// The record's bytes including its length prefix, to copy verbatim (from the
    /// decompressed records, for a compressed batch).
    pub raw: &'a [u8],
}

/// The records of an uncompressed, non-control batch; `None` if the batch is
/// compressed, a control batch, or its records do not parse. (A transactional batch
/// is read like any other: whether its transaction was aborted is the caller's to
/// know, from [`AbortedSet`].) [`decode`] reads compressed batches too.
pub fn records(batch_bytes: &[u8]) -> Option<(BatchHeader, Vec<RecordRef<'_>>)> {
    let h = BatchHeader::parse(batch_bytes).ok()?;
    if h.compression() != 0 || h.is_control() {
        return None;
    }
    Some((h, parse_records(&h, &batch_bytes[HEADER_BYTES..])?))
}

/// The records of a non-control batch, decompressed if it is compressed: what
/// compaction reads of any batch.
#[derive(Debug)]
pub struct Decoded<'a> {
    pub header: BatchHeader,
    pub codec: Codec,
    /// The records' bytes, uncompressed (borrowed from the batch if it was).
    body: Cow<'a, [u8]>,
}

impl Decoded<'_> {
    /// The records; `None` if they do not parse or their number is not the header's.
    pub fn records(&self) -> Option<Vec<RecordRef<'_>>> {
        parse_records(&self.header, &self.body)
    }
}

/// `batch_bytes` (exactly one batch) decoded for compaction; `None` for a control
/// batch, an unknown codec, or compressed records that do not decompress within
/// [`codec::DECOMPRESSED_BYTES_MAX`].
pub fn decode(batch_bytes: &[u8]) -> Option<Decoded<'_>> {
    let header = BatchHeader::parse(batch_bytes).ok()?;
    if header.is_control() {
        return None;
    }
    let codec = Codec::from_id(u8::try_from(header.compression()).ok()?)?;
    let body = if codec == Codec::None {
        Cow::Borrowed(&batch_bytes[HEADER_BYTES..])
    } else {
        if batch_bytes.len() != header.total_bytes() {
            return None;
        }
        let raw = &batch_bytes[HEADER_BYTES..];
        Cow::Owned(codec::decompress(codec, raw, Lz4Framing::Standard).ok()?)
    };
    Some(Decoded {
        header,
        codec,
        body,
    })
}

/// Whether an uncompressed, non-control batch holds what its header says: exactly
/// `record_count` records, each well formed (key, value and headers within its
/// length), filling the batch to its end. Kafka's record iterator refuses a batch that
/// does not (INVALID_RECORD); consumers could not read it. Compressed and control
/// batches are `true` here (their records are not read).
pub fn records_fill(batch_bytes: &[u8]) -> bool {
    match BatchHeader::parse(batch_bytes) {
        Ok(h) if h.compression() == 0 && !h.is_control() => {
            walk_records(&h, &batch_bytes[HEADER_BYTES..], |_| {}).is_some()
        }
        Ok(_) => true,
        Err(_) => false,
    }
}

/// The records of `body` as [`walk_records`] reads them.
fn parse_records<'a>(h: &BatchHeader, body: &'a [u8]) -> Option<Vec<RecordRef<'a>>> {
    let mut out = Vec::with_capacity((h.record_count.max(0) as usize).min(body.len() / 7));
    walk_records(h, body, |r| out.push(r))?;
    Some(out)
}

/// Walks `h.record_count` records filling `body` exactly, each read whole (Kafka's
/// `DefaultRecord.readFrom`: a record's fields, headers included, fill its length);
/// `None` at the first that does not.
fn walk_records<'a>(
    h: &BatchHeader,
    body: &'a [u8],
    mut each: impl FnMut(RecordRef<'a>),
) -> Option<()> {
    let log_append = h.attributes & batch::ATTR_TIMESTAMP_LOG_APPEND != 0;
    let mut buf = body;
    for _ in 0..h.record_count {
        let start = buf;
        let len = usize::try_from(get_varint(&mut buf)?).ok()?;
        let prefix = start.len() - buf.len();
        if len > buf.len() {
            return None;
        }
        let mut r = &buf[..len];
        buf = &buf[len..];
        r = r.get(1..)?; // attributes
        let ts_delta = get_varint(&mut r)?;
        let off_delta = get_varint(&mut r)?;
        let key = take_bytes(&mut r)?;
        let value = take_bytes(&mut r)?;
        let headers = get_varint(&mut r)?;
        if headers < 0 {
            return None;
        }
        for _ in 0..headers {
            // A header's key is never null; its value may be.
            take_bytes(&mut r)??;
            take_bytes(&mut r)?;
        }
        if !r.is_empty() {
            return None;
        }
        each(RecordRef {
            offset: h.base_offset + off_delta,
            timestamp: if log_append {
                h.max_timestamp
            } else {
                h.base_timestamp + ts_delta
            },
            key,
            is_tombstone: value.is_none(),
            raw: &start[..prefix + len],
        });
    }
    buf.is_empty().then_some(())
}

/// A varint length and that many bytes (`Some(None)` for a negative length, null, as
/// Kafka reads it); `None` if they run past `r`.
fn take_bytes<'a>(r: &mut &'a [u8]) -> Option<Option<&'a [u8]>> {
    let len = get_varint(r)?;
    if len < 0 {
        return Some(None);
    }
    let len = usize::try_from(len).ok()?;
    let bytes = r.get(..len)?;
    *r = &r[len..];
    Some(Some(bytes))
}

/// The latest offset of every key seen, within a memory budget.
#[derive(Debug, Default)]
pub struct KeyMap {
    latest: HashMap<Vec<u8>, i64>,
    bytes: usize,
}

/// Bytes a map entry is charged: the key plus the map's own per-entry overhead.
fn entry_cost(key: &[u8]) -> usize {
    key.len() + 64
}

impl KeyMap {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.latest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }

    /// Records `key` at `offset` (offsets arrive in increasing order).
    pub fn insert(&mut self, key: &[u8], offset: i64) {
        match self.latest.get_mut(key) {
            Some(o) => *o = (*o).max(offset),
            None => {
                self.bytes += entry_cost(key);
                self.latest.insert(key.to_vec(), offset);
            }
        }
    }

    pub fn latest(&self, key: &[u8]) -> Option<i64> {
        self.latest.get(key).copied()
    }

    /// Adds every keyed record of `batch`, compressed or not (a no-op for batches
    /// compaction skips).
    pub fn add_batch(&mut self, batch_bytes: &[u8]) {
        if let Some(recs) = decode(batch_bytes).as_ref().and_then(Decoded::records) {
            for r in recs {
                if let Some(k) = r.key {
                    self.insert(k, r.offset);
                }
            }
        }
    }

    /// Folds `other` (built from later offsets) into this map.
    pub fn merge(&mut self, other: KeyMap) {
        for (k, o) in other.latest {
            self.insert(&k, o);
        }
    }
}

/// What compaction does to one batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Filtered {
    Unchanged,
    Rewritten(Vec<u8>),
    /// Every record went: the batch disappears.
    Dropped,
}

/// Rewrites `batch` keeping the records for which `keep` says yes; a compressed batch
/// has the records kept compressed again with its own codec.
pub fn filter_batch(batch_bytes: &[u8], mut keep: impl FnMut(&RecordRef<'_>) -> bool) -> Filtered {
    let Some(decoded) = decode(batch_bytes) else {
        return Filtered::Unchanged;
    };
    let Some(recs) = decoded.records() else {
        return Filtered::Unchanged;
    };
    let kept: Vec<&RecordRef<'_>> = recs.iter().filter(|r| keep(r)).collect();
    if kept.len() == recs.len() {
        return Filtered::Unchanged;
    }
    if kept.is_empty() {
        return Filtered::Dropped;
    }
    let body: usize = kept.iter().map(|r| r.raw.len()).sum();
    let mut out = Vec::with_capacity(HEADER_BYTES + body);
    out.extend_from_slice(&batch_bytes[..HEADER_BYTES]);
    if decoded.codec == Codec::None {
        for r in &kept {
            out.extend_from_slice(r.raw);
        }
    } else {
        let mut plain = Vec::with_capacity(body);
        for r in &kept {
            plain.extend_from_slice(r.raw);
        }
        out.extend_from_slice(&codec::compress(
            decoded.codec,
            &plain,
            codec::Levels::default(),
        ));
    }
    let length = (out.len() - batch::LOG_OVERHEAD) as i32;
    (&mut out[8..12]).put_i32(length);
    (&mut out[batch::OFF_RECORD_COUNT..HEADER_BYTES]).put_i32(kept.len() as i32);
    let crc = crc32c::crc32c(&out[batch::OFF_ATTRIBUTES..]);
    (&mut out[17..batch::OFF_ATTRIBUTES]).put_u32(crc);
    Filtered::Rewritten(out)
}

/// The keep rule of one compaction pass: a keyed record survives if it is the latest
/// for its key (or its key is newer than the map knows); a tombstone additionally only
/// until it is older than `tombstone_horizon_ms`.
pub fn keep_record(map: &KeyMap, r: &RecordRef<'_>, tombstone_horizon_ms: i64) -> bool {
    let Some(key) = r.key else { return true };
    let latest = map.latest(key).unwrap_or(r.offset);
    if r.offset < latest {
        return false;
    }
    !(r.is_tombstone && r.timestamp < tombstone_horizon_ms)
}

/// The aborted transactions of a log, by producer: which transactional batches were
/// aborted.
#[derive(Debug, Default)]
pub struct AbortedSet {
    /// Per producer, (first offset, marker offset), in marker order.
    by_producer: HashMap<i64, Vec<(i64, i64)>>,
}

impl AbortedSet {
    /// From `.txnindex` entries in marker order.
    pub fn new(entries: impl IntoIterator<Item = AbortedTxn>) -> AbortedSet {
        let mut by_producer: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
        for e in entries {
            by_producer
                .entry(e.producer_id)
                .or_default()
                .push((e.first_offset, e.last_offset));
        }
        AbortedSet { by_producer }
    }

    /// The marker offset of the aborted transaction a data batch belongs to, if any.
    pub fn covering(&self, h: &BatchHeader) -> Option<i64> {
        if !h.is_transactional() || h.is_control() {
            return None;
        }
        let txns = self.by_producer.get(&h.producer_id)?;
        // A producer's transactions do not overlap: the first ending at or after the
        // batch is the only candidate.
        let i = txns.partition_point(|(_, last)| *last < h.base_offset);
        txns.get(i)
            .filter(|(first, _)| *first <= h.base_offset)
            .map(|(_, last)| *last)
    }
}

/// What one cleaning pass has met of each transaction, to decide when a marker may go
/// (Kafka's `CleanedTransactionMetadata`). Feed it every batch in offset order.
#[derive(Debug, Default)]
pub struct MarkerTracker {
    /// Producers with a committed (not aborted) transactional batch met since their
    /// last marker.
    committed_open: HashSet<i64>,
    /// Aborted transactions (producer, marker offset) with a batch met.
    aborted_met: HashSet<(i64, i64)>,
}

impl MarkerTracker {
    /// A data batch; `aborted`: the marker offset of its aborted transaction.
    pub fn on_data(&mut self, h: &BatchHeader, aborted: Option<i64>) {
        if !h.is_transactional() {
            return;
        }
        match aborted {
            Some(marker) => {
                self.aborted_met.insert((h.producer_id, marker));
            }
            None => {
                self.committed_open.insert(h.producer_id);
            }
        }
    }

    /// A control batch holding `marker` (`None`: empty or another control record);
    /// returns whether the data it covers is gone, so that it may go (once old enough).
    pub fn on_marker(&mut self, h: &BatchHeader, marker: Option<EndTxnMarker>) -> bool {
        match marker {
            Some(m) if m.commit => !self.committed_open.remove(&h.producer_id),
            Some(_) => !self.aborted_met.remove(&(h.producer_id, h.base_offset)),
            // An emptied control batch covers nothing; other control records stay.
            None => h.record_count == 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::build;

    fn keyed(ts: i64, recs: &[(&[u8], Option<&[u8]>)]) -> Vec<u8> {
        let r: Vec<build::NullableRecord<'_>> = recs.iter().map(|(k, v)| (Some(*k), *v)).collect();
        build::batch_nullable(ts, &r)
    }

    #[test]
    fn records_parse_and_filter_keeps_offsets_and_crc() {
        let mut b = keyed(
            100,
            &[(b"a", Some(b"1")), (b"b", Some(b"2")), (b"a", Some(b"3"))],
        );
        batch::assign(&mut b, 10, 0, None);
        let (_, recs) = records(&b).unwrap();
        assert_eq!(
            recs.iter().map(|r| r.offset).collect::<Vec<_>>(),
            vec![10, 11, 12]
        );
        let mut map = KeyMap::default();
        map.add_batch(&b);
        assert_eq!(map.latest(b"a"), Some(12));
        let Filtered::Rewritten(out) = filter_batch(&b, |r| keep_record(&map, r, 0)) else {
            panic!("expected a rewrite");
        };
        let h = batch::validate(&out, false).unwrap();
        assert_eq!(
            (h.base_offset, h.last_offset_delta, h.record_count),
            (10, 2, 2)
        );
        let (_, kept) = records(&out).unwrap();
        assert_eq!(
            kept.iter().map(|r| r.offset).collect::<Vec<_>>(),
            vec![11, 12]
        );
    }

    #[test]
    fn compressed_batches_are_filtered_like_their_uncompressed_form() {
        use crate::codec::{compress, recompress_batch, Levels};
        let mut plain = keyed(
            100,
            &[
                (b"a", Some(b"1")),
                (b"b", None),
                (b"a", Some(b"3")),
                (b"c", Some(b"4")),
            ],
        );
        batch::assign(&mut plain, 10, 7, None);
        let mut map = KeyMap::default();
        map.add_batch(&plain);
        map.insert(b"c", 20);
        let keep = |r: &RecordRef<'_>| keep_record(&map, r, 0);
        let Filtered::Rewritten(want) = filter_batch(&plain, keep) else {
            panic!("expected a rewrite");
        };
        for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            let z = recompress_batch(&plain, codec, Levels::default()).unwrap();
            assert!(records(&z).is_none(), "records() reads uncompressed only");
            let mut zmap = KeyMap::default();
            zmap.add_batch(&z);
            assert_eq!(
                (zmap.latest(b"a"), zmap.latest(b"b"), zmap.len()),
                (Some(12), Some(11), 3),
                "{codec:?}: keys counted"
            );
            let Filtered::Rewritten(got) = filter_batch(&z, keep) else {
                panic!("{codec:?}: expected a rewrite");
            };
            let h = batch::validate(&got, false).unwrap();
            assert_eq!(h.compression(), codec.id() as i16);
            // Decompressed, it is byte for byte the uncompressed batch's rewrite.
            assert_eq!(
                recompress_batch(&got, Codec::None, Levels::default()).unwrap(),
                want,
                "{codec:?}"
            );
            // Nothing to drop: kept verbatim.
            assert_eq!(filter_batch(&z, |_| true), Filtered::Unchanged, "{codec:?}");
        }
        // A compressed batch that does not decompress is kept, its keys not counted;
        // so is one whose records inflate past the bound.
        let mut bad = plain.clone();
        bad[batch::OFF_ATTRIBUTES + 1] |= Codec::Gzip.id();
        let crc = crc32c::crc32c(&bad[batch::OFF_ATTRIBUTES..]);
        bad[17..21].copy_from_slice(&crc.to_be_bytes());
        let mut bomb = plain[..HEADER_BYTES].to_vec();
        bomb[batch::OFF_ATTRIBUTES + 1] |= Codec::Zstd.id();
        bomb.extend(compress(
            Codec::Zstd,
            &vec![0; codec::DECOMPRESSED_BYTES_MAX + 1],
            Levels::default(),
        ));
        let len = (bomb.len() - batch::LOG_OVERHEAD) as i32;
        bomb[8..12].copy_from_slice(&len.to_be_bytes());
        for b in [bad, bomb] {
            let mut m = KeyMap::default();
            m.add_batch(&b);
            assert!(m.is_empty());
            assert_eq!(filter_batch(&b, |_| false), Filtered::Unchanged);
        }
    }

    #[test]
    fn tombstones_survive_until_the_horizon() {
        let b = keyed(1_000, &[(b"k", None)]);
        let map = KeyMap::default();
        let (_, recs) = records(&b).unwrap();
        assert!(recs[0].is_tombstone);
        assert!(
            keep_record(&map, &recs[0], 1_000),
            "not older than the horizon"
        );
        assert!(!keep_record(&map, &recs[0], 1_001));
    }

    #[test]
    fn batch_with_nothing_left_is_dropped_and_untouched_batch_unchanged() {
        let b = keyed(1, &[(b"x", Some(b"1"))]);
        let mut map = KeyMap::default();
        map.insert(b"x", 5);
        assert_eq!(
            filter_batch(&b, |r| keep_record(&map, r, 0)),
            Filtered::Dropped
        );
        let map = KeyMap::default();
        assert_eq!(
            filter_batch(&b, |r| keep_record(&map, r, 0)),
            Filtered::Unchanged
        );
    }

    fn txn_batch(pid: i64, base: i64, n: usize) -> Vec<u8> {
        let recs: Vec<(&[u8], Option<&[u8]>)> = vec![(&b"k"[..], Some(&b"v"[..])); n];
        let mut b = keyed(1, &recs);
        b[batch::OFF_PRODUCER_ID..batch::OFF_PRODUCER_EPOCH].copy_from_slice(&pid.to_be_bytes());
        let attrs = batch::ATTR_TRANSACTIONAL;
        b[batch::OFF_ATTRIBUTES..batch::OFF_LAST_OFFSET_DELTA]
            .copy_from_slice(&attrs.to_be_bytes());
        let crc = crc32c::crc32c(&b[batch::OFF_ATTRIBUTES..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        batch::assign(&mut b, base, 0, None);
        b
    }

    #[test]
    fn aborted_set_finds_the_transaction_of_a_batch() {
        let set = AbortedSet::new([
            AbortedTxn {
                producer_id: 1,
                first_offset: 10,
                last_offset: 20,
                last_stable_offset: 21,
            },
            AbortedTxn {
                producer_id: 1,
                first_offset: 30,
                last_offset: 35,
                last_stable_offset: 36,
            },
        ]);
        let h = |pid, base| BatchHeader::parse(&txn_batch(pid, base, 1)).unwrap();
        assert_eq!(set.covering(&h(1, 10)), Some(20));
        assert_eq!(set.covering(&h(1, 19)), Some(20));
        assert_eq!(set.covering(&h(1, 25)), None, "committed between the two");
        assert_eq!(set.covering(&h(1, 31)), Some(35));
        assert_eq!(set.covering(&h(2, 12)), None, "another producer");
        let plain = BatchHeader {
            attributes: 0,
            ..h(1, 12)
        };
        assert_eq!(set.covering(&plain), None, "not transactional");
        // Records of transactional batches are readable for compaction.
        assert_eq!(records(&txn_batch(1, 0, 3)).unwrap().1.len(), 3);
    }

    #[test]
    fn markers_may_go_only_once_their_data_is_gone() {
        let data = |pid, base| BatchHeader::parse(&txn_batch(pid, base, 1)).unwrap();
        let ctl = |pid, base| BatchHeader {
            attributes: batch::ATTR_CONTROL | batch::ATTR_TRANSACTIONAL,
            base_offset: base,
            ..data(pid, base)
        };
        let commit = Some(EndTxnMarker {
            commit: true,
            coordinator_epoch: 0,
        });
        let abort = Some(EndTxnMarker {
            commit: false,
            coordinator_epoch: 0,
        });
        let mut t = MarkerTracker::default();
        t.on_data(&data(1, 0), None);
        t.on_data(&data(2, 1), Some(3));
        assert!(
            !t.on_marker(&ctl(1, 2), commit),
            "its committed data is still here"
        );
        assert!(
            !t.on_marker(&ctl(2, 3), abort),
            "its aborted data is still here"
        );
        // The next pass: the aborted batch is gone, the committed one still there.
        let mut t = MarkerTracker::default();
        t.on_data(&data(1, 0), None);
        assert!(!t.on_marker(&ctl(1, 2), commit));
        assert!(t.on_marker(&ctl(2, 3), abort));
        // A marker with nothing before it may go; so may an emptied control batch.
        assert!(t.on_marker(&ctl(3, 4), commit));
        let emptied = BatchHeader {
            record_count: 0,
            ..ctl(3, 5)
        };
        assert!(t.on_marker(&emptied, None));
    }
}
