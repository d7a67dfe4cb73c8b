//! Names of a segment's objects, and reading a remote segment's batches back through
//! a bounded cache of fixed-size chunks (a consumer reading old data sequentially pays
//! one ranged GET per chunk, not one per fetch).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::pool::Pool;
use crate::store::{Store, StoreError, StoreResult};

/// The files uploaded beside a segment's log, by extension (as on local disk).
pub const LOG: &str = "log";
pub const INDEX: &str = "index";
pub const TIME_INDEX: &str = "timeindex";
pub const TXN_INDEX: &str = "txnindex";
/// Producer state below the segment's end (the local snapshot at the next base).
pub const SNAPSHOT: &str = "snapshot";
/// The leader epochs that begin at or below the segment's last offset.
pub const EPOCHS: &str = "leader-epoch-checkpoint";

/// One uploaded file of a segment: `<prefix><base,20>-<segment id>.<ext>`, the prefix
/// being the partition's folder (`<topic>-<topic id>/<partition>/`). Each upload
/// attempt has its own id, so an attempt cut short by a leader change never mixes its
/// objects with the next leader's.
pub fn object_key(prefix: &str, base_offset: i64, segment_id: &[u8; 16], ext: &str) -> String {
    format!("{prefix}{base_offset:020}-{}.{ext}", hex(segment_id))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A remote segment as a reader needs it.
#[derive(Clone, Debug)]
pub struct SegmentRef {
    pub prefix: String,
    pub id: [u8; 16],
    pub base_offset: i64,
    pub last_offset: i64,
    pub size: u64,
}

impl SegmentRef {
    pub fn key(&self, ext: &str) -> String {
        object_key(&self.prefix, self.base_offset, &self.id, ext)
    }
}

/// What a read of a remote segment found: whole batches from the one holding the
/// asked offset.
#[derive(Debug)]
pub struct RemoteRead {
    pub records: Bytes,
    /// The offset after the last batch returned (the segment's end if none was).
    pub next_offset: i64,
}

/// Bytes of one remote object read in chunks of this size.
pub const CHUNK: u64 = 1 << 20;
/// The batch header fields a reader needs: base offset (8), length (4), then the last
/// offset delta at byte 23.
const HEADER: usize = 27;

/// A shard's reader of remote segments: the store's thread pool and a bounded cache of
/// chunks and indexes, least recently used out first.
pub struct Reader {
    store: Arc<Store>,
    pool: Pool,
    cache: RefCell<Cache>,
}

struct Cache {
    capacity: u64,
    used: u64,
    tick: u64,
    entries: HashMap<(String, u64), (Bytes, u64)>,
    by_age: BTreeMap<u64, (String, u64)>,
}

/// Chunk number of a whole small object (an index).
const WHOLE: u64 = u64::MAX;

impl Reader {
    pub fn new(store: Arc<Store>, pool: Pool, cache_bytes: u64) -> Reader {
        Reader {
            store,
            pool,
            cache: RefCell::new(Cache {
                capacity: cache_bytes.max(CHUNK),
                used: 0,
                tick: 0,
                entries: HashMap::new(),
                by_age: BTreeMap::new(),
            }),
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Bytes held by the cache.
    pub fn cached_bytes(&self) -> u64 {
        self.cache.borrow().used
    }

    async fn object(&self, key: String, chunk: u64) -> StoreResult<Bytes> {
        if let Some(b) = self.cache.borrow_mut().get(&key, chunk) {
            return Ok(b);
        }
        let store = self.store.clone();
        let k = key.clone();
        let range = (chunk != WHOLE).then(|| (chunk * CHUNK, CHUNK));
        let got = self
            .pool
            .run(
                move || store.get(&k, range),
                || Err(StoreError::Failed("remote store threads stopped".into())),
            )
            .await;
        let b = match got {
            Ok(got) => Bytes::from(got),
            // A segment's optional file (an index without entries, the transaction
            // index of a segment without aborts) is absent for good: remembered as
            // empty, so a read_committed fetch does not ask for it again.
            Err(StoreError::NotFound(_)) if chunk == WHOLE => Bytes::new(),
            Err(e) => return Err(e),
        };
        self.cache.borrow_mut().put(key, chunk, b.clone());
        Ok(b)
    }

    /// `len` bytes of `key` from `from` (fewer at its end `size`).
    async fn range(&self, key: &str, size: u64, from: u64, len: u64) -> StoreResult<Bytes> {
        let end = (from + len).min(size);
        if from >= end {
            return Ok(Bytes::new());
        }
        let (first, last) = (from / CHUNK, (end - 1) / CHUNK);
        if first == last {
            let c = self.object(key.to_string(), first).await?;
            let lo = (from - first * CHUNK) as usize;
            let hi = ((end - first * CHUNK) as usize).min(c.len());
            return Ok(c.slice(lo.min(hi)..hi));
        }
        let mut out = BytesMut::with_capacity((end - from) as usize);
        for n in first..=last {
            let c = self.object(key.to_string(), n).await?;
            let lo = from.saturating_sub(n * CHUNK).min(c.len() as u64) as usize;
            let hi = ((end - n * CHUNK) as usize).min(c.len());
            out.extend_from_slice(&c[lo..hi.max(lo)]);
        }
        Ok(out.freeze())
    }

    /// The segment's offset index (cached whole; indexes are small).
    async fn index(&self, seg: &SegmentRef) -> StoreResult<Bytes> {
        self.object(seg.key(INDEX), WHOLE).await
    }

    /// Whole batches of `seg` from the one holding `offset`, up to `max_bytes` (at
    /// least one batch), none starting at or past `upper`.
    pub async fn read(
        &self,
        seg: &SegmentRef,
        offset: i64,
        max_bytes: usize,
        upper: i64,
    ) -> StoreResult<RemoteRead> {
        let index = self.index(seg).await?;
        let mut pos = index_position(&index, seg.base_offset, offset);
        let key = seg.key(LOG);
        let window = (max_bytes as u64).clamp(64 << 10, 8 << 20);
        let mut out = BytesMut::new();
        let mut next_offset = offset;
        let mut buf = Bytes::new();
        let mut buf_at = pos;
        while pos < seg.size {
            if pos + HEADER as u64 > buf_at + buf.len() as u64 {
                buf = self.range(&key, seg.size, pos, window).await?;
                buf_at = pos;
                if buf.len() < HEADER {
                    break;
                }
            }
            let at = (pos - buf_at) as usize;
            let h = &buf[at..at + HEADER];
            let base = i64::from_be_bytes(h[0..8].try_into().unwrap_or_default());
            let len = i32::from_be_bytes(h[8..12].try_into().unwrap_or_default());
            let delta = i32::from_be_bytes(h[23..27].try_into().unwrap_or_default());
            // Past the segment's last offset: batches a truncation cut off (an unclean
            // election's; the object keeps them, the remote log does not).
            if len < (HEADER as i32 - 12) || base >= upper || base > seg.last_offset {
                break;
            }
            let size = 12 + len as u64;
            let last = base + delta as i64;
            if last >= offset {
                if !out.is_empty() && out.len() as u64 + size > max_bytes as u64 {
                    break;
                }
                if pos + size > buf_at + buf.len() as u64 {
                    buf = self.range(&key, seg.size, pos, size.max(window)).await?;
                    buf_at = pos;
                    if (buf.len() as u64) < size {
                        return Err(StoreError::Failed(format!(
                            "{key}: batch at {pos} cut short"
                        )));
                    }
                }
                let at = (pos - buf_at) as usize;
                out.extend_from_slice(&buf[at..at + size as usize]);
                next_offset = last + 1;
                if out.len() >= max_bytes {
                    break;
                }
            }
            pos += size;
        }
        if out.is_empty() {
            next_offset = next_offset.max(seg.last_offset + 1);
        }
        Ok(RemoteRead {
            records: out.freeze(),
            next_offset,
        })
    }

    /// The first batch of `seg` holding a record at or after `timestamp` (its max
    /// timestamp is that far) and an offset at or past `start` (the log start):
    /// (its base offset, its max timestamp); None if none does.
    pub async fn offset_for_timestamp(
        &self,
        seg: &SegmentRef,
        timestamp: i64,
        start: i64,
    ) -> StoreResult<Option<(i64, i64)>> {
        let time_index = self.object(seg.key(TIME_INDEX), WHOLE).await?;
        let index = self.index(seg).await?;
        let from = time_lower_bound(&time_index, seg.base_offset, timestamp).max(start);
        let mut pos = index_position(&index, seg.base_offset, from);
        let key = seg.key(LOG);
        while pos < seg.size {
            // The header through max timestamp: base 8, length 4, epoch 4, magic 1,
            // crc 4, attributes 2, last offset delta 4, base timestamp 8, max 8.
            let h = self.range(&key, seg.size, pos, 43).await?;
            if h.len() < 43 {
                break;
            }
            let base = i64::from_be_bytes(h[0..8].try_into().unwrap_or_default());
            let len = i32::from_be_bytes(h[8..12].try_into().unwrap_or_default());
            let delta = i32::from_be_bytes(h[23..27].try_into().unwrap_or_default());
            let max_ts = i64::from_be_bytes(h[35..43].try_into().unwrap_or_default());
            if len < 31 || base > seg.last_offset {
                break;
            }
            if max_ts >= timestamp && base + delta as i64 >= start {
                return Ok(Some((base, max_ts)));
            }
            pos += 12 + len as u64;
        }
        Ok(None)
    }

    /// The aborted transactions of `segs` (their transaction indexes, as Kafka's
    /// 34-byte entries: version, producer id, first offset, last offset, last stable
    /// offset) that overlap `from..to`: (producer id, first offset), and whether the
    /// search is complete (as Kafka's: an entry whose last stable offset reaches `to`
    /// means no later segment holds one that overlaps; else the local log is next).
    pub async fn aborted(
        &self,
        segs: &[SegmentRef],
        from: i64,
        to: i64,
    ) -> StoreResult<(Vec<(i64, i64)>, bool)> {
        let mut out = Vec::new();
        for seg in segs {
            let idx = self.object(seg.key(TXN_INDEX), WHOLE).await?;
            for e in idx.chunks_exact(34) {
                let pid = i64::from_be_bytes(e[2..10].try_into().unwrap_or_default());
                let first = i64::from_be_bytes(e[10..18].try_into().unwrap_or_default());
                let last = i64::from_be_bytes(e[18..26].try_into().unwrap_or_default());
                let lso = i64::from_be_bytes(e[26..34].try_into().unwrap_or_default());
                if last >= from && first < to {
                    out.push((pid, first));
                }
                if lso >= to {
                    return Ok((out, true));
                }
            }
        }
        Ok((out, false))
    }

    /// Forgets what is cached of `seg` (deleted from the store).
    pub fn forget(&self, seg: &SegmentRef) {
        let prefix = object_key(&seg.prefix, seg.base_offset, &seg.id, "");
        self.cache
            .borrow_mut()
            .remove_where(|k| k.starts_with(&prefix));
    }
}

impl Cache {
    fn get(&mut self, key: &str, chunk: u64) -> Option<Bytes> {
        self.tick += 1;
        let tick = self.tick;
        let k = (key.to_string(), chunk);
        let (b, age) = self.entries.get_mut(&k)?;
        let b = b.clone();
        let old = std::mem::replace(age, tick);
        self.by_age.remove(&old);
        self.by_age.insert(tick, k);
        Some(b)
    }

    fn put(&mut self, key: String, chunk: u64, b: Bytes) {
        self.tick += 1;
        let k = (key, chunk);
        if let Some((old, age)) = self.entries.remove(&k) {
            self.used -= (old.len() as u64).max(64);
            self.by_age.remove(&age);
        }
        // An empty entry (an absent object) still counts: the cache stays bounded.
        self.used += (b.len() as u64).max(64);
        self.by_age.insert(self.tick, k.clone());
        self.entries.insert(k, (b, self.tick));
        while self.used > self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            if let Some((b, _)) = self.entries.remove(&oldest) {
                self.used -= (b.len() as u64).max(64);
            }
        }
    }

    fn remove_where(&mut self, f: impl Fn(&str) -> bool) {
        let gone: Vec<_> = self.entries.keys().filter(|(k, _)| f(k)).cloned().collect();
        for k in gone {
            if let Some((b, age)) = self.entries.remove(&k) {
                self.used -= (b.len() as u64).max(64);
                self.by_age.remove(&age);
            }
        }
    }
}

/// Position of the last offset index entry at or below `offset` (0 if none): entries
/// are a relative offset (u32) and a position (u32), big-endian.
pub fn index_position(index: &[u8], base: i64, offset: i64) -> u64 {
    let rel = offset - base;
    let mut pos = 0u64;
    for e in index.chunks_exact(8) {
        let r = u32::from_be_bytes([e[0], e[1], e[2], e[3]]) as i64;
        if r > rel {
            break;
        }
        pos = u32::from_be_bytes([e[4], e[5], e[6], e[7]]) as u64;
    }
    pos
}

/// The offset of the last time index entry whose timestamp is below `timestamp`
/// (the segment's base if none): entries are a timestamp (i64) and a relative offset
/// (u32), big-endian, both ascending.
pub fn time_lower_bound(time_index: &[u8], base: i64, timestamp: i64) -> i64 {
    let mut at = base;
    for e in time_index.chunks_exact(12) {
        let ts = i64::from_be_bytes(e[0..8].try_into().unwrap_or_default());
        if ts >= timestamp {
            break;
        }
        at = base + u32::from_be_bytes([e[8], e[9], e[10], e[11]]) as i64;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v2 batch header (no records): base, length, last offset delta, max timestamp;
    /// padded to `size` bytes.
    fn batch(base: i64, delta: i32, max_ts: i64, size: usize) -> Vec<u8> {
        let mut b = vec![0u8; size];
        b[0..8].copy_from_slice(&base.to_be_bytes());
        b[8..12].copy_from_slice(&((size - 12) as i32).to_be_bytes());
        b[16] = 2;
        b[23..27].copy_from_slice(&delta.to_be_bytes());
        b[35..43].copy_from_slice(&max_ts.to_be_bytes());
        b
    }

    fn setup(
        batches: &[(i64, i32, i64, usize)],
        index: &[(u32, u32)],
    ) -> (tempfile::TempDir, Reader, SegmentRef) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&format!("file://{}", dir.path().display())).unwrap());
        let seg = SegmentRef {
            prefix: "t-07/0/".into(),
            id: [1; 16],
            base_offset: batches[0].0,
            last_offset: batches.last().map(|b| b.0 + b.1 as i64).unwrap(),
            size: batches.iter().map(|b| b.3 as u64).sum(),
        };
        let log: Vec<u8> = batches
            .iter()
            .flat_map(|&(b, d, t, s)| batch(b, d, t, s))
            .collect();
        store.put(&seg.key(LOG), &log).unwrap();
        let idx: Vec<u8> = index
            .iter()
            .flat_map(|(r, p)| [r.to_be_bytes(), p.to_be_bytes()].concat())
            .collect();
        store.put(&seg.key(INDEX), &idx).unwrap();
        let reader = Reader::new(store, Pool::new(1, "t").unwrap(), 4 * CHUNK);
        (dir, reader, seg)
    }

    #[test]
    fn reads_whole_batches_from_the_one_holding_the_offset() {
        let batches = [
            (100, 9, 1000, 200),
            (110, 9, 2000, 300),
            (120, 4, 3000, 100),
            (125, 0, 4000, 70),
        ];
        let (_d, r, seg) = setup(&batches, &[(10, 200)]);
        let run = |o, m, u| futures_lite::future::block_on(r.read(&seg, o, m, u)).unwrap();
        let all = run(100, 1 << 20, i64::MAX);
        assert_eq!((all.records.len(), all.next_offset), (670, 126));
        let mid = run(115, 1 << 20, i64::MAX);
        assert_eq!((mid.records.len(), mid.next_offset), (470, 126));
        assert_eq!(
            i64::from_be_bytes(mid.records[0..8].try_into().unwrap()),
            110
        );
        // At least one batch even when it is over max_bytes; then whole batches only.
        assert_eq!(run(100, 10, i64::MAX).records.len(), 200);
        assert_eq!(run(100, 450, i64::MAX).records.len(), 200);
        assert_eq!(run(100, 500, i64::MAX).records.len(), 500);
        // Nothing at or past the upper bound.
        assert_eq!(run(100, 1 << 20, 120).records.len(), 500);
        assert_eq!(run(126, 1 << 20, i64::MAX).next_offset, 126);
        // A segment an unclean leader cut at 120 (its object unchanged): a read returns
        // nothing past its last offset.
        let cut = SegmentRef {
            last_offset: 119,
            ..seg.clone()
        };
        let got = futures_lite::future::block_on(r.read(&cut, 100, 1 << 20, i64::MAX)).unwrap();
        assert_eq!((got.records.len(), got.next_offset), (500, 120));
        let past = futures_lite::future::block_on(r.read(&cut, 120, 1 << 20, i64::MAX)).unwrap();
        assert_eq!((past.records.len(), past.next_offset), (0, 120));
    }

    #[test]
    fn batches_across_chunks_and_the_cache_bound() {
        let big = CHUNK as usize + 1000;
        let batches = [(0, 0, 10, 500), (1, 0, 20, big), (2, 0, 30, 600)];
        let (_d, r, seg) = setup(&batches, &[]);
        let got = futures_lite::future::block_on(r.read(&seg, 1, 100, i64::MAX)).unwrap();
        assert_eq!((got.records.len(), got.next_offset), (big, 2));
        let got = futures_lite::future::block_on(r.read(&seg, 2, 100, i64::MAX)).unwrap();
        assert_eq!(got.records.len(), 600);
        assert!(r.cached_bytes() <= 4 * CHUNK);
        let ts = futures_lite::future::block_on(r.offset_for_timestamp(&seg, 15, 0)).unwrap();
        assert_eq!(ts, Some((1, 20)));
        assert_eq!(
            futures_lite::future::block_on(r.offset_for_timestamp(&seg, 31, 0)).unwrap(),
            None
        );
        r.forget(&seg);
        assert_eq!(r.cached_bytes(), 0);
    }

    #[test]
    fn index_lookups() {
        let idx: Vec<u8> = [(0u32, 0u32), (10, 500), (20, 900)]
            .iter()
            .flat_map(|(r, p)| [r.to_be_bytes(), p.to_be_bytes()].concat())
            .collect();
        assert_eq!(index_position(&idx, 100, 105), 0);
        assert_eq!(index_position(&idx, 100, 110), 500);
        assert_eq!(index_position(&idx, 100, 150), 900);
        let tidx: Vec<u8> = [(1000i64, 0u32), (2000, 10)]
            .iter()
            .flat_map(|(t, r)| [t.to_be_bytes().to_vec(), r.to_be_bytes().to_vec()].concat())
            .collect();
        assert_eq!(time_lower_bound(&tidx, 100, 500), 100);
        assert_eq!(time_lower_bound(&tidx, 100, 1500), 100);
        assert_eq!(time_lower_bound(&tidx, 100, 2500), 110);
    }
}
