//! Shared test scaffolding: a glommio executor per test and batch builders.
#![allow(dead_code)]

use std::future::Future;
use std::path::Path;
use std::rc::Rc;

use sluice_storage::batch::build;
use sluice_storage::{Clock, LogConfig, ManualClock, Storage, StorageLimits, SystemClock};

/// Runs `f` on a fresh glommio executor thread (as every executor of the project: see
/// `sluice_shard::keep_awake`) and returns its output.
pub fn run<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    sluice_shard::run_unpinned("storage-test", 8 << 20, f)
}

/// Runs `f` on every log at once, one task each (so that their writes share rounds),
/// and returns the outputs in the logs' order.
pub async fn each_log_at_once<T, Fut>(
    logs: &[Rc<sluice_storage::PartitionLog>],
    f: impl Fn(usize, Rc<sluice_storage::PartitionLog>) -> Fut,
) -> Vec<T>
where
    Fut: Future<Output = T> + 'static,
    T: 'static,
{
    let tasks: Vec<_> = logs
        .iter()
        .enumerate()
        .map(|(i, log)| glommio::spawn_local(f(i, log.clone())))
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

/// A temp dir on the real disk (not tmpfs), so O_DIRECT paths are exercised.
pub fn tempdir() -> tempfile::TempDir {
    let base = std::env::var("SLUICE_TEST_TMP")
        .unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    tempfile::Builder::new()
        .prefix("sluice-storage-")
        .tempdir_in(base)
        .expect("tempdir")
}

pub async fn storage(dir: &Path, limits: StorageLimits) -> Rc<Storage> {
    Storage::open(dir, limits, Rc::new(SystemClock))
        .await
        .expect("open storage")
}

pub async fn storage_with_clock(
    dir: &Path,
    limits: StorageLimits,
    clock: Rc<ManualClock>,
) -> Rc<Storage> {
    let clock: Rc<dyn Clock> = clock;
    Storage::open(dir, limits, clock)
        .await
        .expect("open storage")
}

/// Limits with no tail cache, so every read goes to disk.
pub fn no_cache() -> StorageLimits {
    StorageLimits {
        tail_cache_bytes: 0,
        ..StorageLimits::default()
    }
}

pub fn small_segments(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// A batch of `n` records whose values name their index `i`, timestamp `ts`.
pub fn batch(ts: i64, n: usize, tag: u64) -> Vec<u8> {
    let values: Vec<Vec<u8>> = (0..n).map(|i| format!("v{tag}-{i}").into_bytes()).collect();
    let recs: Vec<(Option<&[u8]>, &[u8])> = values.iter().map(|v| (None, &v[..])).collect();
    build::batch(ts, &recs)
}

/// Splits concatenated batches into (base offset, bytes-after-header-fields) pairs, for
/// comparing what was read with what was appended (base offset and epoch differ).
pub fn batches_of(buf: &[u8]) -> Vec<(i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = buf;
    while let Some(total) = sluice_storage::batch::peek_total_bytes(rest) {
        let h = sluice_storage::BatchHeader::parse(rest).expect("header");
        out.push((
            h.base_offset,
            rest[sluice_storage::batch::OFF_ATTRIBUTES..total].to_vec(),
        ));
        rest = &rest[total..];
    }
    assert!(rest.is_empty(), "trailing bytes after batches");
    out
}

/// Everything in the log from its start, as the chunks reads return: (the offset the
/// read asked for, whole batches from the one holding it).
pub async fn read_chunks(log: &sluice_storage::PartitionLog) -> Vec<(i64, bytes::Bytes)> {
    try_read_chunks(log).await.expect("read")
}

/// [`read_chunks`], failing with the first read that fails (a read of a process the
/// crash simulation has killed fails).
pub async fn try_read_chunks(
    log: &sluice_storage::PartitionLog,
) -> Result<Vec<(i64, bytes::Bytes)>, sluice_storage::Error> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    loop {
        let r = log.read(offset, 1 << 20, None).await?;
        if r.records.is_empty() {
            break;
        }
        out.push((offset, r.records));
        offset = r.next_offset;
    }
    Ok(out)
}

/// Everything in the log from its start, as batches.
pub async fn read_all(log: &sluice_storage::PartitionLog) -> Vec<(i64, Vec<u8>)> {
    let chunks = read_chunks(log).await;
    chunks.iter().flat_map(|(_, b)| batches_of(b)).collect()
}

/// Makes `batch` a batch of producer `pid` at `epoch` from sequence `seq`, transactional
/// or not (the CRC is recomputed).
pub fn set_producer(batch: &mut [u8], pid: i64, epoch: i16, seq: i32, transactional: bool) {
    use sluice_storage::batch as b;
    batch[b::OFF_PRODUCER_ID..b::OFF_PRODUCER_EPOCH].copy_from_slice(&pid.to_be_bytes());
    batch[b::OFF_PRODUCER_EPOCH..b::OFF_BASE_SEQUENCE].copy_from_slice(&epoch.to_be_bytes());
    batch[b::OFF_BASE_SEQUENCE..b::OFF_RECORD_COUNT].copy_from_slice(&seq.to_be_bytes());
    let mut attrs = i16::from_be_bytes([batch[b::OFF_ATTRIBUTES], batch[b::OFF_ATTRIBUTES + 1]]);
    if transactional {
        attrs |= b::ATTR_TRANSACTIONAL;
    } else {
        attrs &= !b::ATTR_TRANSACTIONAL;
    }
    batch[b::OFF_ATTRIBUTES..b::OFF_LAST_OFFSET_DELTA].copy_from_slice(&attrs.to_be_bytes());
    let crc = crc32c::crc32c(&batch[b::OFF_ATTRIBUTES..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// A batch of `n` unkeyed records of producer `pid` (epoch `epoch`, first sequence
/// `seq`), transactional or not.
pub fn producer_batch(pid: i64, epoch: i16, seq: i32, transactional: bool, n: usize) -> Vec<u8> {
    let mut b = batch(1_000, n, pid as u64);
    set_producer(&mut b, pid, epoch, seq, transactional);
    b
}

/// The producer state and the aborted transactions that replaying the whole log from
/// its start gives: what recovery must rebuild, however it gets there.
pub async fn replayed(
    log: &sluice_storage::PartitionLog,
) -> (
    sluice_storage::producer::ProducerStateTable,
    Vec<sluice_storage::AbortedTxn>,
) {
    let mut table = sluice_storage::producer::ProducerStateTable::default();
    let mut aborted = Vec::new();
    for (_, chunk) in read_chunks(log).await {
        for (h, b) in sluice_storage::batch::stored_batches(&chunk) {
            if let Some(done) = table.apply(&h, b) {
                if done.aborted {
                    aborted.push(sluice_storage::AbortedTxn {
                        producer_id: done.producer_id,
                        first_offset: done.first_offset,
                        last_offset: done.last_offset,
                        last_stable_offset: done.last_stable_offset,
                    });
                }
            }
        }
    }
    (table, aborted)
}

/// A storage on a manual clock at `now_ms`.
pub async fn storage_at(
    dir: &Path,
    limits: StorageLimits,
    now_ms: i64,
) -> (Rc<Storage>, Rc<ManualClock>) {
    let clock = Rc::new(ManualClock(std::cell::Cell::new(now_ms)));
    (storage_with_clock(dir, limits, clock.clone()).await, clock)
}

/// Cases per proptest: `default` in `make test`, `PROPTEST_CASES` when set (`make
/// test-long` runs ten times as many). An explicit `cases` in a proptest config would
/// otherwise override proptest's own reading of that variable.
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
