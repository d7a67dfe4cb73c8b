//! The per-shard tail cache: the most recently appended batches of every partition on
//! this shard, so that consumers and followers close to the tail are served from memory
//! instead of DMA reads. One budget in bytes for the whole shard; the globally oldest
//! batch is evicted first. Each partition's cached batches are a contiguous run ending
//! at its log end, so a hit can be served without touching disk.

use std::collections::VecDeque;

use bytes::Bytes;
use foldhash::HashMap;

/// Identifies a log within a shard.
pub type LogId = u64;

/// One cached batch, as two pieces that read back as the batch: `head` is the batch
/// header rewritten by the append (base offset, leader epoch), or empty when `body` is
/// the whole batch. A large client batch is kept as the header rewritten beside the
/// rest of the client's own bytes (a slice of its request), not copied whole (see
/// `log::UNCOPIED_BATCH_BYTES_MIN`), until its first read joins the two.
#[derive(Debug, Clone)]
pub struct CachedBatch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub head: Bytes,
    pub body: Bytes,
}

impl CachedBatch {
    fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }
}

#[derive(Debug, Default)]
pub struct TailCache {
    budget_bytes: usize,
    used_bytes: usize,
    logs: HashMap<LogId, VecDeque<CachedBatch>>,
    /// Insertion order across logs, for eviction: (log, base offset).
    order: VecDeque<(LogId, i64)>,
}

impl TailCache {
    pub fn new(budget_bytes: usize) -> TailCache {
        TailCache {
            budget_bytes,
            ..Default::default()
        }
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    /// Adds a batch at the end of `log`'s run. It must follow the run's last batch.
    pub fn insert(&mut self, log: LogId, batch: CachedBatch) {
        if batch.len() > self.budget_bytes {
            // Too large to ever fit: the run must stay contiguous, so drop it.
            self.invalidate(log);
            return;
        }
        let run = self.logs.entry(log).or_default();
        if let Some(last) = run.back() {
            assert!(batch.base_offset > last.last_offset, "cache run must grow");
        }
        self.used_bytes += batch.len();
        self.order.push_back((log, batch.base_offset));
        run.push_back(batch);
        while self.used_bytes > self.budget_bytes {
            self.evict_one();
        }
    }

    fn evict_one(&mut self) {
        let Some((log, base)) = self.order.pop_front() else {
            return;
        };
        if let Some(run) = self.logs.get_mut(&log) {
            // Entries of an invalidated run may linger in `order`; skip those.
            if run.front().map(|b| b.base_offset) == Some(base) {
                let b = run.pop_front().expect("front checked");
                self.used_bytes -= b.len();
                if run.is_empty() {
                    self.logs.remove(&log);
                }
            }
        }
    }

    /// Forgets everything cached for `log` (truncation, deletion).
    pub fn invalidate(&mut self, log: LogId) {
        if let Some(run) = self.logs.remove(&log) {
            self.used_bytes -= run.iter().map(CachedBatch::len).sum::<usize>();
        }
        // Compact `order` lazily: only when it is mostly stale.
        if self.order.len() > 1024
            && self.order.len() > 4 * self.logs.values().map(|r| r.len()).sum::<usize>()
        {
            let logs = &self.logs;
            self.order.retain(|(l, b)| {
                logs.get(l)
                    .is_some_and(|r| r.iter().any(|x| x.base_offset == *b))
            });
        }
    }

    /// Whole batches from the one containing `offset`, up to `max_bytes` (at least one),
    /// stopping before `max_offset_exclusive`. `None` when the run does not reach back
    /// to `offset`.
    ///
    /// A batch kept as head and body is joined into one piece the first time it is read
    /// and kept so: one copy per batch that is read at all (a reader at the tail then
    /// gets a lone batch without a copy, as before), and its frame is freed.
    pub fn read(
        &mut self,
        log: LogId,
        offset: i64,
        max_bytes: usize,
        max_offset_exclusive: i64,
    ) -> Option<Vec<Bytes>> {
        let run = self.logs.get_mut(&log)?;
        if run.front()?.base_offset > offset {
            return None;
        }
        let start = run.partition_point(|b| b.last_offset < offset);
        let mut out = Vec::new();
        let mut bytes = 0;
        for b in run.iter_mut().skip(start) {
            if b.base_offset >= max_offset_exclusive {
                break;
            }
            if bytes > 0 && bytes + b.len() > max_bytes {
                break;
            }
            bytes += b.len();
            if !b.head.is_empty() {
                b.body = [&b.head[..], &b.body[..]].concat().into();
                b.head = Bytes::new();
            }
            out.push(b.body.clone());
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(base: i64, last: i64, size: usize) -> CachedBatch {
        CachedBatch {
            base_offset: base,
            last_offset: last,
            head: Bytes::new(),
            body: Bytes::from(vec![0u8; size]),
        }
    }

    #[test]
    fn evicts_oldest_across_logs_within_budget() {
        let mut c = TailCache::new(300);
        c.insert(1, b(0, 9, 100));
        c.insert(2, b(0, 0, 100));
        c.insert(1, b(10, 19, 100));
        c.insert(2, b(1, 1, 100));
        assert_eq!(c.used_bytes(), 300);
        assert!(
            c.read(1, 0, 1000, i64::MAX).is_none(),
            "oldest of log 1 evicted"
        );
        assert_eq!(c.read(1, 15, 1000, i64::MAX).unwrap().len(), 1);
        assert_eq!(c.read(2, 0, 1000, i64::MAX).unwrap().len(), 2);
    }

    #[test]
    fn read_honours_max_bytes_but_returns_one_batch() {
        let mut c = TailCache::new(10_000);
        c.insert(1, b(0, 4, 500));
        c.insert(1, b(5, 9, 500));
        assert_eq!(c.read(1, 3, 10, i64::MAX).unwrap().len(), 1);
        assert_eq!(c.read(1, 3, 1000, i64::MAX).unwrap().len(), 2);
        assert_eq!(c.read(1, 3, 1000, 5).unwrap().len(), 1);
        c.invalidate(1);
        assert_eq!(c.used_bytes(), 0);
        assert!(c.read(1, 3, 1000, i64::MAX).is_none());
    }

    #[test]
    fn a_batch_kept_as_head_and_body_reads_back_joined_once() {
        let mut c = TailCache::new(10_000);
        c.insert(1, b(0, 4, 500));
        c.insert(
            1,
            CachedBatch {
                base_offset: 5,
                last_offset: 9,
                head: Bytes::from_static(b"head"),
                body: Bytes::from_static(b"body"),
            },
        );
        assert_eq!(c.used_bytes(), 508);
        let pieces = c.read(1, 5, 1000, i64::MAX).unwrap();
        assert_eq!(pieces, [&b"headbody"[..]], "joined on its first read");
        let again = c.read(1, 5, 1000, i64::MAX).unwrap();
        assert_eq!(again[0].as_ptr(), pieces[0].as_ptr(), "and kept joined");
        // The byte limit counts both pieces: 500 + 8 is over 505, so one batch.
        let pieces = c.read(1, 0, 505, i64::MAX).unwrap();
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].len(), 500);
        c.invalidate(1);
        assert_eq!(c.used_bytes(), 0);
    }
}
