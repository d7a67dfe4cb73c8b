//! Fault-injection tier: I/O errors injected through `sluice_storage::fault` on one
//! partition's files. An error must fail the file or the log (never panic, never hang,
//! never report as durable what a failed sync covered), every later call must refuse,
//! and dropping the log and opening it again once the fault is gone (recovery) must
//! serve everything that was durable before.
//!
//! Rules are process-global and the tests of this binary run in parallel threads, so
//! every test arms rules for its own temp dir only (`Armed`, which disarms on drop,
//! also when an assertion fails).

use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use crate::common::*;
use sluice_storage::fault::{self, FaultOp, FaultRule};
use sluice_storage::file::AppendFile;
use sluice_storage::{Error, PartitionLog, Storage, StorageLimits};

/// Storage whose segment logs are synced by fdatasync, not written through (`O_DSYNC`),
/// for the tests of sync faults between a write and its sync.
fn fdatasync_synced() -> StorageLimits {
    StorageLimits {
        dsync_logs_max: 0,
        ..no_cache()
    }
}

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

/// Rules armed for one test's paths, disarmed when dropped.
struct Armed(String);

impl Armed {
    fn new(path: &Path, ops: &[(FaultOp, i32)]) -> Armed {
        let marker = path.display().to_string();
        for &(op, errno) in ops {
            fault::arm(FaultRule {
                op,
                errno,
                path_contains: marker.clone(),
            });
        }
        Armed(marker)
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        fault::disarm(&self.0);
    }
}

fn is_failed_or_io<T: std::fmt::Debug>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(Error::Failed(_)) | Err(Error::Io { .. }))
}

/// Appends `n` batches (tags from `tag`), then flushes: all of them durable.
async fn append_durable(log: &PartitionLog, n: u64, tag: u64) {
    for i in 0..n {
        log.append(&batch(1_000 + i as i64, 3, tag + i), 0)
            .await
            .unwrap();
    }
    log.flush().await.unwrap();
}

/// A file with 5,000 bytes durable, then 3,000 more written but not synced (their
/// end returned).
async fn durable_then_written(dir: &Path) -> (Rc<AppendFile>, u64) {
    let f = AppendFile::open(&dir.join("f.log"), 0, 1 << 16, 0)
        .await
        .unwrap();
    f.push(&[7u8; 5000]).unwrap();
    f.sync_all().await.unwrap();
    let end = f.push(&[8u8; 3000]).unwrap();
    f.wait_written(end).await.unwrap();
    (f, end)
}

async fn reopen(s: &Rc<Storage>, name: &str) -> Rc<PartitionLog> {
    s.open_log(name, small_segments(4096)).await.unwrap()
}

#[test]
fn write_fault_fails_wait_durable_and_the_file_refuses_later_pushes() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let _s = storage(&dir, no_cache()).await;
        let path = dir.join("f.log");
        let f = AppendFile::open(&path, 0, 1 << 16, 0).await.unwrap();
        f.push(b"durable").unwrap();
        f.sync_all().await.unwrap();
        assert_eq!(f.durable_len(), 7);
        let armed = Armed::new(&dir, &[(FaultOp::Write, ENOSPC)]);
        let end = f.push(b" lost").unwrap();
        let err = f.wait_durable(end).await.unwrap_err();
        assert!(err.to_string().contains("os error 28"), "{err}");
        assert_eq!(f.durable_len(), 7, "nothing more is durable");
        assert!(f.failure().is_some());
        drop(armed);
        // The fault is gone, the file's state is still unknown: it refuses work.
        assert!(matches!(f.push(b"more"), Err(Error::Failed(_))));
        assert!(matches!(f.sync_all().await, Err(Error::Failed(_))));
    });
}

#[test]
fn sync_fault_fails_wait_durable_and_nothing_is_reported_durable() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let _s = storage(&dir, no_cache()).await;
        let (f, end) = durable_then_written(&dir).await;
        let armed = Armed::new(&dir, &[(FaultOp::Sync, EIO)]);
        let err = f.wait_durable(end).await.unwrap_err();
        assert!(err.to_string().contains("os error 5"), "{err}");
        assert_eq!(
            f.durable_len(),
            5000,
            "the failed sync made nothing durable"
        );
        drop(armed);
        // A later sync that would succeed must not vouch for what the failed one lost.
        assert!(matches!(f.wait_durable(end).await, Err(Error::Failed(_))));
        assert_eq!(f.durable_len(), 5000);
        assert!(f.failure().unwrap().contains("os error 5"));
    });
}

#[test]
fn sync_fault_fails_the_log_and_every_method_refuses() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, fdatasync_synced()).await;
        let log = reopen(&s, "p").await;
        append_durable(&log, 10, 0).await;
        assert_eq!(log.failure(), None);
        let before = read_all(&log).await;
        let armed = Armed::new(&dir, &[(FaultOp::Sync, EIO)]);
        // The append is written (no sync needed for it), the flush fails.
        log.append(&batch(2_000, 2, 99), 0).await.unwrap();
        assert!(is_failed_or_io(&log.flush().await));
        let cause = log.failure().expect("the log is failed");
        assert!(cause.contains("os error 5"), "{cause}");
        drop(armed);
        // Disarmed: the log stays failed, every method refuses, none hangs.
        let every = async {
            assert!(is_failed_or_io(&log.append(&batch(1, 1, 1), 0).await));
            assert!(is_failed_or_io(&log.flush().await));
            assert!(is_failed_or_io(&log.flush_for_ack().await));
            assert!(is_failed_or_io(&log.read(0, 1 << 20, None).await));
            assert!(is_failed_or_io(&log.roll().await));
            assert!(is_failed_or_io(&log.offset_for_timestamp(0).await));
            assert!(is_failed_or_io(&log.truncate_to(5).await));
            assert!(is_failed_or_io(&log.delete_records_before(3).await));
            assert!(is_failed_or_io(&log.enforce_retention().await));
            assert!(is_failed_or_io(&log.compact().await));
            assert!(is_failed_or_io(&log.reset_to(1_000).await));
            assert!(is_failed_or_io(
                &log.append_with_offsets(batch(1, 1, 1).into()).await
            ));
            assert!(is_failed_or_io(
                &log.append_checked(&batch(1, 1, 1), 0).await
            ));
            assert!(is_failed_or_io(
                &log.append_judged(&batch(1, 1, 1), 0).await
            ));
            assert!(is_failed_or_io(&log.append_marker(7, 0, true, 0, 0).await));
            assert!(!log.wait_for_append(100, Duration::from_secs(5)).await);
            assert!(is_failed_or_io(&log.close().await));
        };
        let done = futures_lite::future::or(
            async {
                every.await;
                true
            },
            async {
                glommio::timer::sleep(Duration::from_secs(30)).await;
                false
            },
        )
        .await;
        assert!(done, "a method of a failed log hung");
        // The background passes skip it (and do not fail for it).
        assert_eq!(s.enforce_retention().await.unwrap(), 0);
        assert_eq!(s.compact_all().await.unwrap(), 0);
        s.flush_due().await.unwrap();
        drop(log);
        let log = reopen(&s, "p").await;
        assert_eq!(log.failure(), None);
        // Everything flushed is back (the unsynced batch may be too: it was written).
        let after = read_all(&log).await;
        assert!(after.len() >= before.len());
        assert_eq!(after[..before.len()], before[..]);
    });
}

/// A write-through log (the default for a few busy logs) syncs as it writes: a sync
/// fault fails the write itself, so nothing after it is acknowledged and the log is
/// failed; what was durable before reads back after a reopen.
#[test]
fn sync_fault_on_a_write_through_log_fails_its_write_and_the_log() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let d2 = dir.clone();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = reopen(&s, "wt").await;
        append_durable(&log, 10, 0).await;
        let armed = Armed::new(&dir.join("wt"), &[(FaultOp::Sync, EIO)]);
        let appended = log.append(&batch(1, 2, 99), 0).await;
        assert!(appended.is_err() || log.flush_for_ack().await.is_err());
        let cause = log.failure().expect("the log is failed");
        assert!(cause.contains("os error 5"), "{cause}");
        drop(armed);
        assert!(is_failed_or_io(&log.flush().await));
    });
    run(move || async move {
        let s = storage(&d2, no_cache()).await;
        let log = reopen(&s, "wt").await;
        assert_eq!(read_all(&log).await.len(), 10);
    });
}

#[test]
fn read_fault_fails_a_read_of_a_sealed_segment_and_the_log() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = reopen(&s, "p").await;
        append_durable(&log, 200, 0).await;
        assert!(log.segment_count() > 2, "several sealed segments");
        let before = read_all(&log).await;
        let armed = Armed::new(
            &dir.join("p").join("00000000000000000000.log"),
            &[(FaultOp::Read, EIO)],
        );
        // A read of the last segment does not touch the faulty file.
        let tail = log.segment_bases().last().copied().unwrap();
        log.read(tail, 1 << 20, None).await.unwrap();
        assert_eq!(log.failure(), None);
        let err = log.read(0, 1 << 20, None).await.unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(log.failure().unwrap().contains("os error 5"));
        // The failed read fails the log: the file's state is unknown.
        assert!(matches!(
            log.read(tail, 1 << 20, None).await,
            Err(Error::Failed(_))
        ));
        assert!(matches!(
            log.append(&batch(1, 1, 1), 0).await,
            Err(Error::Failed(_))
        ));
        drop(log);
        // Still armed: recovery reads the file too, and fails (no panic).
        assert!(matches!(
            s.open_log("p", small_segments(4096)).await,
            Err(Error::Io { .. })
        ));
        drop(armed);
        let log = reopen(&s, "p").await;
        assert_eq!(read_all(&log).await, before);
        append_durable(&log, 1, 500).await;
    });
}

#[test]
fn write_fault_then_reopen_serves_everything_durable_before() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = reopen(&s, "p").await;
        append_durable(&log, 40, 0).await;
        let durable_end = log.log_end_offset();
        let before = read_all(&log).await;
        let armed = Armed::new(&dir.join("p"), &[(FaultOp::Write, ENOSPC)]);
        let mut failed = 0;
        for i in 0..5 {
            if log.append(&batch(3_000, 3, 900 + i), 0).await.is_err() {
                failed += 1;
            }
        }
        assert_eq!(failed, 5, "no append after the fault succeeds");
        assert!(log.failure().unwrap().contains("os error 28"));
        drop(log);
        drop(armed);
        let log = reopen(&s, "p").await;
        assert_eq!(log.failure(), None);
        assert_eq!(log.log_end_offset(), durable_end);
        assert_eq!(read_all(&log).await, before);
        // And it takes appends again.
        append_durable(&log, 3, 100).await;
        assert_eq!(log.log_end_offset(), durable_end + 9);
    });
}

#[test]
fn failed_meta_or_snapshot_write_fails_the_log() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = reopen(&s, "meta").await;
        append_durable(&log, 10, 0).await;
        let armed = Armed::new(
            &dir.join("meta").join("partition.meta"),
            &[(FaultOp::Write, EIO)],
        );
        assert!(is_failed_or_io(&log.delete_records_before(3).await));
        assert!(log.failure().unwrap().contains("partition.meta"));
        drop(armed);
        drop(log);
        // The checkpoint did not move: the records are all there.
        let log = reopen(&s, "meta").await;
        assert_eq!(log.log_start_offset(), 0);
        assert_eq!(read_all(&log).await.len(), 10);

        let log2 = reopen(&s, "snap").await;
        append_durable(&log2, 2, 0).await;
        let armed = Armed::new(&dir.join("snap"), &[(FaultOp::Open, EIO)]);
        // A roll writes a snapshot (opening its temp file) and creates a segment.
        assert!(is_failed_or_io(&log2.roll().await));
        assert!(log2.failure().is_some());
        drop(armed);
        drop(log2);
        let log2 = reopen(&s, "snap").await;
        assert_eq!(read_all(&log2).await.len(), 2);
    });
}

#[test]
fn a_failed_log_can_still_be_deleted() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = reopen(&s, "gone").await;
        append_durable(&log, 5, 0).await;
        let armed = Armed::new(&dir.join("gone"), &[(FaultOp::Write, ENOSPC)]);
        assert!(log.append(&batch(1, 1, 1), 0).await.is_err());
        assert!(log.failure().is_some());
        s.delete_log(&log).await.unwrap();
        assert!(!dir.join("gone").exists());
        drop(armed);
    });
}

#[test]
fn a_fault_on_one_partition_leaves_the_others_working() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, fdatasync_synced()).await;
        let bad = reopen(&s, "bad").await;
        let good = reopen(&s, "good").await;
        append_durable(&bad, 3, 0).await;
        append_durable(&good, 3, 0).await;
        let _armed = Armed::new(&dir.join("bad"), &[(FaultOp::Sync, EIO)]);
        bad.append(&batch(1, 1, 1), 0).await.unwrap();
        assert!(bad.flush().await.is_err());
        assert!(bad.failure().is_some());
        append_durable(&good, 3, 10).await;
        assert_eq!(good.failure(), None);
        assert_eq!(read_all(&good).await.len(), 6);
    });
}

#[test]
fn preallocation_starts_small_and_grows_by_doubling() {
    use sluice_storage::file::{preallocate_step, PREALLOCATE_BYTES, PREALLOCATE_FIRST_BYTES};
    const MIB: u64 = 1 << 20;
    assert_eq!(PREALLOCATE_FIRST_BYTES, MIB);
    assert_eq!(PREALLOCATE_BYTES, 32 * MIB);
    assert_eq!(preallocate_step(0, PREALLOCATE_BYTES), MIB);
    assert_eq!(preallocate_step(MIB, PREALLOCATE_BYTES), MIB);
    assert_eq!(preallocate_step(3 * MIB, PREALLOCATE_BYTES), 3 * MIB);
    assert_eq!(preallocate_step(32 * MIB, PREALLOCATE_BYTES), 32 * MIB);
    assert_eq!(preallocate_step(900 * MIB, PREALLOCATE_BYTES), 32 * MIB);
    assert_eq!(
        preallocate_step(0, 4096),
        4096,
        "a smaller maximum caps the first step"
    );

    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("pre", small_segments(1 << 30)).await.unwrap();
        log.append(&batch(1, 3, 0), 0).await.unwrap();
        log.flush().await.unwrap();
        let seg = dir.join("pre").join("00000000000000000000.log");
        let len = std::fs::metadata(&seg).unwrap().len();
        assert!(
            len <= MIB,
            "a new segment takes {len} bytes, more than the first step"
        );
        // 5 MiB of data: steps of 1, 1, 2, 4 MiB (8 MiB), never a 32 MiB one.
        let big: Vec<u8> = vec![0x42; 64 << 10];
        let rec = sluice_storage::batch::build::batch(1, &[(None, &big[..])]);
        for _ in 0..80 {
            log.append(&rec, 0).await.unwrap();
        }
        log.flush().await.unwrap();
        let (_, size) = log.active_segment();
        let len = std::fs::metadata(&seg).unwrap().len();
        assert!(len >= size);
        assert!(len <= 2 * size.max(MIB), "{len} bytes for {size} of data");
    });
}

/// A truncation refuses work while it runs, but that is no failure: `failure()` stays
/// `None` (the broker would take the partition offline otherwise). A truncation whose
/// future is dropped half-way leaves the file failed, and says so.
#[test]
fn a_truncation_under_way_is_not_a_failure_but_an_interrupted_one_is() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let _s = storage(&dir, no_cache()).await;
        for interrupt in [false, true] {
            let f = AppendFile::open(&dir.join(format!("t{interrupt}.log")), 0, 1 << 16, 0)
                .await
                .unwrap();
            f.push(&[3u8; 10_000]).unwrap();
            f.sync_all().await.unwrap();
            let mut cut = Box::pin(f.truncate(5_000));
            assert!(futures_lite::future::poll_once(&mut cut).await.is_none());
            assert_eq!(f.failure(), None, "under way");
            assert!(
                matches!(f.push(b"x"), Err(Error::Failed(_))),
                "refused meanwhile"
            );
            if interrupt {
                drop(cut);
                assert!(f.failure().unwrap().contains("truncation interrupted"));
            } else {
                cut.await.unwrap();
                assert_eq!(f.failure(), None);
                assert_eq!(f.len(), 5_000);
                f.push(b"y").unwrap();
                f.sync_all().await.unwrap();
            }
        }
    });
}

/// A sync that fails while a truncation waits for it fails the truncation and the file:
/// the truncation must not clear the error (the kernel reports a failed writeback only
/// once, so its own sync would succeed) and count as durable what that sync lost.
#[test]
fn a_sync_that_fails_while_a_truncation_waits_fails_the_truncation() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let _s = storage(&dir, no_cache()).await;
        let (f, end) = durable_then_written(&dir).await;
        let armed = Armed::new(&dir, &[(FaultOp::Sync, EIO)]);
        // A sync starts; its waiter goes away (a request cancelled), the sync runs on.
        let mut sync = Box::pin(f.wait_durable(end));
        assert!(futures_lite::future::poll_once(&mut sync).await.is_none());
        let mut cut = Box::pin(f.truncate(7000));
        assert!(
            futures_lite::future::poll_once(&mut cut).await.is_none(),
            "the truncation waits for the sync in flight"
        );
        drop(sync);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while f.failure().is_none() {
            assert!(std::time::Instant::now() < deadline, "the sync never ended");
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        // The next sync of the same descriptor would succeed.
        drop(armed);
        assert!(matches!(cut.await, Err(Error::Failed(_))));
        assert!(
            f.failure().unwrap().contains("os error 5"),
            "{:?}",
            f.failure()
        );
        assert_eq!(
            f.durable_len(),
            5000,
            "nothing the failed sync covered counts"
        );
    });
}
