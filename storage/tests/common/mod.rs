//! Shared test scaffolding: a glommio executor per test and batch builders.
#![allow(dead_code)]

use std::future::Future;
use std::path::Path;
use std::rc::Rc;

use glommio::{LocalExecutorBuilder, Placement};
use sluice_storage::batch::build;
use sluice_storage::{Clock, LogConfig, ManualClock, Storage, StorageLimits, SystemClock};

/// Runs `f` on a fresh glommio executor thread and returns its output.
pub fn run<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(8 << 20)
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor thread")
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
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    loop {
        let r = log.read(offset, 1 << 20, None).await.expect("read");
        if r.records.is_empty() {
            break;
        }
        out.push((offset, r.records));
        offset = r.next_offset;
    }
    out
}

/// Everything in the log from its start, as batches.
pub async fn read_all(log: &sluice_storage::PartitionLog) -> Vec<(i64, Vec<u8>)> {
    let chunks = read_chunks(log).await;
    chunks.iter().flat_map(|(_, b)| batches_of(b)).collect()
}
