//! Unit-tier tests of the partition log through its public API: append, read, roll,
//! retention, truncation, timestamps, bad input, durability and the glommio trap.

use std::rc::Rc;
use std::time::Duration;

use crate::common::*;
use sluice_storage::batch::{self, BatchError};
use sluice_storage::{Error, FlushPolicy, LogConfig, ManualClock, StorageLimits, TimestampType};

#[test]
fn append_assigns_offsets_and_reads_back_from_cache_and_disk() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        for limits in [StorageLimits::default(), no_cache()] {
            let s = storage(&path, limits.clone()).await;
            let name = format!("t-{}", limits.tail_cache_bytes);
            let log = s.open_log(&name, LogConfig::default()).await.unwrap();
            let a = log.append(&batch(1000, 3, 0), 5).await.unwrap();
            let b = log.append(&batch(1001, 2, 1), 5).await.unwrap();
            assert_eq!((a.base_offset, a.last_offset), (0, 2));
            assert_eq!((b.base_offset, b.last_offset), (3, 4));
            assert_eq!(log.log_end_offset(), 5);
            // Reading from the middle of the first batch returns that whole batch.
            let r = log.read(1, 1 << 20, None).await.unwrap();
            let got = batches_of(&r.records);
            assert_eq!(got.len(), 2);
            assert_eq!(got[0].0, 0);
            assert_eq!(r.next_offset, 5);
            let h = sluice_storage::BatchHeader::parse(&r.records).unwrap();
            assert_eq!(h.leader_epoch, 5);
            // max_bytes smaller than one batch still returns one batch.
            let r = log.read(3, 10, None).await.unwrap();
            assert_eq!(batches_of(&r.records).len(), 1);
            // A bound below the log end hides what is above it.
            let r = log.read(0, 1 << 20, Some(3)).await.unwrap();
            assert_eq!(r.next_offset, 3);
            // At the end: empty; beyond: out of range.
            assert!(log.read(5, 100, None).await.unwrap().records.is_empty());
            assert!(matches!(
                log.read(6, 100, None).await,
                Err(Error::OffsetOutOfRange { .. })
            ));
        }
    });
}

#[test]
fn bad_batches_are_rejected_and_leave_the_log_unchanged() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let cfg = LogConfig {
            max_message_bytes: 4096,
            ..LogConfig::default()
        };
        let log = s.open_log("bad", cfg).await.unwrap();
        log.append(&batch(1, 2, 0), 0).await.unwrap();
        let before = (log.log_end_offset(), log.size_bytes());
        let good = batch(2, 2, 1);

        let mut bad_crc = good.clone();
        *bad_crc.last_mut().unwrap() ^= 1;
        let mut bad_magic = good.clone();
        bad_magic[16] = 1;
        let mut lie = good.clone();
        lie[8..12].copy_from_slice(&9999i32.to_be_bytes());
        let short = good[..40].to_vec();
        let big = batch::build::simple(1, 1, 5000);

        type Check = fn(&Error) -> bool;
        let cases: Vec<(Vec<u8>, Check)> = vec![
            (bad_crc, |e| {
                matches!(e, Error::Batch(BatchError::CrcMismatch { .. }))
            }),
            (bad_magic, |e| {
                matches!(e, Error::Batch(BatchError::BadMagic(1)))
            }),
            (lie, |e| {
                matches!(e, Error::Batch(BatchError::LengthMismatch { .. }))
            }),
            (short, |e| {
                matches!(e, Error::Batch(BatchError::TooShort { .. }))
            }),
            (big, |e| {
                matches!(e, Error::Batch(BatchError::TooLarge { .. }))
            }),
        ];
        for (bytes, is_expected) in cases {
            let err = log.append(&bytes, 0).await.unwrap_err();
            assert!(is_expected(&err), "unexpected error {err}");
            assert_eq!((log.log_end_offset(), log.size_bytes()), before);
        }
        log.flush().await.unwrap();
        let on_disk = std::fs::metadata(path.join("bad").join(format!("{:020}.log", 0)))
            .unwrap()
            .len();
        assert!(on_disk >= before.1);
        assert_eq!(read_all(&log).await.len(), 1);
    });
}

#[test]
fn rolls_on_segment_bytes_and_segment_ms() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let clock = Rc::new(ManualClock::default());
        clock.0.set(1_000_000);
        let s = storage_with_clock(&path, no_cache(), clock.clone()).await;
        let cfg = LogConfig {
            segment_ms: 60_000,
            ..small_segments(2048)
        };
        let log = s.open_log("roll", cfg).await.unwrap();
        for i in 0..100 {
            log.append(&batch(1_000_000, 4, i), 0).await.unwrap();
        }
        let bases = log.segment_bases();
        assert!(bases.len() > 3, "expected several segments, got {bases:?}");
        assert!(bases.windows(2).all(|w| w[0] < w[1]));
        for b in &bases[..bases.len() - 1] {
            let len = std::fs::metadata(path.join("roll").join(format!("{b:020}.log")))
                .unwrap()
                .len();
            assert!(len <= 2048, "closed segment {b} is {len} bytes");
            assert!(
                !len.is_multiple_of(4096),
                "closed segments are trimmed, not page padded"
            );
        }
        assert_eq!(read_all(&log).await.len(), 100);

        // Time-based roll: a big segment limit, then the clock passes segment.ms.
        let log2 = s
            .open_log(
                "roll-ms",
                LogConfig {
                    segment_ms: 60_000,
                    ..LogConfig::default()
                },
            )
            .await
            .unwrap();
        log2.append(&batch(1, 1, 0), 0).await.unwrap();
        log2.append(&batch(1, 1, 1), 0).await.unwrap();
        assert_eq!(log2.segment_count(), 1);
        clock.0.set(1_000_000 + 60_000);
        log2.append(&batch(1, 1, 2), 0).await.unwrap();
        assert_eq!(log2.segment_bases(), vec![0, 2]);

        // segment.jitter.ms: the segment rolls its own jitter before segment.ms.
        let cfg = LogConfig {
            segment_ms: 60_000,
            segment_jitter_ms: 30_000,
            ..LogConfig::default()
        };
        let jitter = cfg.segment_jitter(0, 1_060_000);
        assert!((0..30_000).contains(&jitter));
        let log3 = s.open_log("roll-jitter", cfg.clone()).await.unwrap();
        log3.append(&batch(1, 1, 0), 0).await.unwrap();
        clock.0.set(1_060_000 + 60_000 - jitter - 1);
        log3.append(&batch(1, 1, 1), 0).await.unwrap();
        assert_eq!(log3.segment_count(), 1, "not yet");
        clock.0.set(1_060_000 + 60_000 - jitter);
        log3.append(&batch(1, 1, 2), 0).await.unwrap();
        assert_eq!(log3.segment_bases(), vec![0, 2], "rolled {jitter} ms early");
        // Jitter differs between segments, stays below min(jitter, segment.ms), and is
        // zero when not set.
        let spread: std::collections::BTreeSet<i64> =
            (0..64).map(|b| cfg.segment_jitter(b, 5)).collect();
        assert!(spread.len() > 32 && spread.iter().all(|j| (0..30_000).contains(j)));
        let short = LogConfig {
            segment_ms: 1_000,
            ..cfg.clone()
        };
        assert!((0..64).all(|b| short.segment_jitter(b, 5) < 1_000));
        assert_eq!(LogConfig::default().segment_jitter(7, 5), 0);

        // max.compaction.lag.ms shortens segment.ms on compacted topics only.
        let lagged = LogConfig {
            segment_ms: 60_000,
            max_compaction_lag_ms: 10_000,
            ..LogConfig::default()
        };
        assert_eq!(lagged.roll_age_ms(0, 0), 60_000);
        let compacted = LogConfig {
            cleanup_compact: true,
            ..lagged
        };
        assert_eq!(compacted.roll_age_ms(0, 0), 10_000);
    });
}

#[test]
fn retention_by_size_and_time_deletes_whole_closed_segments() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let clock = Rc::new(ManualClock::default());
        clock.0.set(10_000_000);
        let s = storage_with_clock(&path, no_cache(), clock.clone()).await;
        let cfg = LogConfig {
            retention_bytes: 4096,
            ..small_segments(1024)
        };
        let log = s.open_log("ret", cfg).await.unwrap();
        for i in 0..200 {
            log.append(&batch(10_000_000, 4, i), 0).await.unwrap();
        }
        let before = log.segment_count();
        let deleted = s.enforce_retention().await.unwrap();
        assert!(deleted > 0);
        assert_eq!(log.segment_count(), before - deleted as usize);
        assert!(
            log.size_bytes() <= 4096 + 1024,
            "size {} after retention",
            log.size_bytes()
        );
        let start = log.log_start_offset();
        assert_eq!(start, log.segment_bases()[0]);
        assert!(matches!(
            log.read(0, 100, None).await,
            Err(Error::OffsetOutOfRange { .. })
        ));
        assert!(!log.read(start, 100, None).await.unwrap().records.is_empty());
        // Deleted files are gone from disk.
        let logs = std::fs::read_dir(path.join("ret")).unwrap().filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".log")
        });
        assert_eq!(logs.count(), log.segment_count());

        // Time: records stamped long ago, retention.ms of one hour.
        let cfg = LogConfig {
            retention_ms: 3_600_000,
            ..small_segments(1024)
        };
        let old = s.open_log("ret-time", cfg).await.unwrap();
        for i in 0..50 {
            old.append(&batch(10_000_000, 4, i), 0).await.unwrap();
        }
        assert_eq!(
            old.enforce_retention().await.unwrap(),
            0,
            "nothing expired yet"
        );
        clock.0.set(10_000_000 + 3_600_001 + 100);
        let n = old.segment_count();
        assert_eq!(
            old.enforce_retention().await.unwrap() as usize,
            n - 1,
            "all but the active segment"
        );
        assert_eq!(old.log_start_offset(), old.segment_bases()[0]);
        // The start survives a reopen.
        let start = old.log_start_offset();
        old.close().await.unwrap();
        drop(old);
        let again = s.open_log("ret-time", small_segments(1024)).await.unwrap();
        assert_eq!(again.log_start_offset(), start);
    });
}

#[test]
fn truncate_and_delete_records() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let log = s.open_log("trunc", small_segments(1024)).await.unwrap();
        for i in 0..30 {
            log.append(&batch(5, 2, i), 0).await.unwrap();
        }
        assert_eq!(log.log_end_offset(), 60);
        // Truncate into an earlier segment, in the middle of a batch.
        log.truncate_to(21).await.unwrap();
        assert_eq!(log.log_end_offset(), 20);
        let all = read_all(&log).await;
        assert_eq!(all.len(), 10);
        assert_eq!(all.last().unwrap().0, 18);
        // Appends continue from the truncation point.
        let a = log.append(&batch(5, 2, 99), 1).await.unwrap();
        assert_eq!(a.base_offset, 20);
        assert_eq!(read_all(&log).await.len(), 11);

        let start = log.delete_records_before(7).await.unwrap();
        assert_eq!(start, 7);
        assert_eq!(log.log_start_offset(), 7);
        assert!(matches!(
            log.read(6, 100, None).await,
            Err(Error::OffsetOutOfRange { .. })
        ));
        let r = log.read(7, 100, None).await.unwrap();
        assert_eq!(
            batches_of(&r.records)[0].0,
            6,
            "the batch holding offset 7 is served whole"
        );
        assert!(log.delete_records_before(1000).await.is_err());
        log.close().await.unwrap();
        drop(log);
        let log = s.open_log("trunc", small_segments(1024)).await.unwrap();
        assert_eq!(log.log_start_offset(), 7);
        assert_eq!(log.log_end_offset(), 22);
    });
}

#[test]
fn reset_to_moves_start_and_end_forward_and_survives_reopen() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let log = s.open_log("reset", small_segments(1024)).await.unwrap();
        for i in 0..10 {
            log.append(&batch(5, 2, i), 0).await.unwrap();
        }
        assert_eq!(log.log_end_offset(), 20);
        assert!(log.reset_to(20).await.is_err(), "must move past the end");
        log.reset_to(500).await.unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (500, 500));
        assert!(read_all(&log).await.is_empty());
        assert!(matches!(
            log.read(10, 100, None).await,
            Err(Error::OffsetOutOfRange { .. })
        ));
        // A follower copies the leader's batch at 500 with its offsets.
        let mut b = batch(5, 2, 7);
        batch::assign(&mut b, 500, 3, None);
        log.append_with_offsets(b.into()).await.unwrap();
        log.flush().await.unwrap();
        assert_eq!(log.log_end_offset(), 502);
        log.close().await.unwrap();
        drop(log);
        let log = s.open_log("reset", small_segments(1024)).await.unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (500, 502));
        assert_eq!(read_all(&log).await[0].0, 500);
        // And an empty log moves too (reopened empty at the new offset).
        let empty = s
            .open_log("reset-empty", small_segments(1024))
            .await
            .unwrap();
        empty.reset_to(42).await.unwrap();
        empty.close().await.unwrap();
        drop(empty);
        let empty = s
            .open_log("reset-empty", small_segments(1024))
            .await
            .unwrap();
        assert_eq!((empty.log_start_offset(), empty.log_end_offset()), (42, 42));
        let a = empty.append(&batch(5, 2, 1), 0).await.unwrap();
        assert_eq!(a.base_offset, 42);
    });
}

#[test]
fn offset_for_timestamp_and_log_append_time() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, no_cache()).await;
        let log = s.open_log("ts", small_segments(1024)).await.unwrap();
        // Batch i has records at 1000*i + 0..4.
        for i in 0..20i64 {
            log.append(&batch(1000 * i, 4, i as u64), 0).await.unwrap();
        }
        assert_eq!(log.offset_for_timestamp(0).await.unwrap(), Some((0, 0)));
        assert_eq!(
            log.offset_for_timestamp(5002).await.unwrap(),
            Some((22, 5002))
        );
        assert_eq!(
            log.offset_for_timestamp(5004).await.unwrap(),
            Some((24, 6000))
        );
        assert_eq!(
            log.offset_for_timestamp(19_003).await.unwrap(),
            Some((79, 19_003))
        );
        assert_eq!(log.offset_for_timestamp(19_004).await.unwrap(), None);

        let cfg = LogConfig {
            timestamp_type: TimestampType::LogAppendTime,
            ..LogConfig::default()
        };
        let lat = s.open_log("lat", cfg).await.unwrap();
        let info = lat.append(&batch(1, 2, 0), 0).await.unwrap();
        assert!(info.log_append_time_ms > 1_600_000_000_000);
        let r = lat.read(0, 1000, None).await.unwrap();
        let h = batch::validate(&r.records, true).unwrap();
        assert_eq!(h.max_timestamp, info.log_append_time_ms);
        assert_ne!(h.attributes & batch::ATTR_TIMESTAMP_LOG_APPEND, 0);
    });
}

#[test]
fn long_poll_wakes_on_append_and_times_out() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let log = s.open_log("lp", LogConfig::default()).await.unwrap();
        assert!(!log.wait_for_append(0, Duration::from_millis(20)).await);
        let l2 = log.clone();
        let waiter =
            glommio::spawn_local(
                async move { l2.wait_for_append(0, Duration::from_secs(30)).await },
            );
        log.append(&batch(1, 1, 0), 0).await.unwrap();
        assert!(waiter.await);
    });
}

#[test]
fn first_dma_file_empty_and_read_write_still_reads() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, no_cache()).await;
        let log = s.open_log("trap", LogConfig::default()).await.unwrap();
        log.append(&batch(1, 3, 0), 0).await.unwrap();
        let r = log
            .read(0, 4096, None)
            .await
            .expect("read after first empty rw open");
        assert_eq!(batches_of(&r.records).len(), 1);
        assert!(path.join(sluice_storage::probe::PROBE_FILE).exists());
    });
}

#[test]
fn config_and_limits_are_validated() {
    assert!(LogConfig {
        segment_bytes: 10,
        ..LogConfig::default()
    }
    .validate()
    .is_err());
    assert!(LogConfig {
        retention_ms: -5,
        ..LogConfig::default()
    }
    .validate()
    .is_err());
    assert!(LogConfig {
        flush: FlushPolicy::IntervalMs(0),
        ..LogConfig::default()
    }
    .validate()
    .is_err());
    assert!(StorageLimits {
        write_bytes_max: 100,
        ..StorageLimits::default()
    }
    .validate()
    .is_err());
    assert!(StorageLimits {
        open_segment_files_max: 0,
        ..StorageLimits::default()
    }
    .validate()
    .is_err());
    assert!(LogConfig::default().validate().is_ok());
}

#[test]
fn tiered_retention_deletes_only_uploaded_segments_by_the_local_window() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, no_cache()).await;
        let cfg = LogConfig {
            retention_bytes: 1 << 30,
            remote_storage: true,
            local_retention_bytes: 2048,
            ..small_segments(1024)
        };
        let log = s.open_log("tiered", cfg).await.unwrap();
        for i in 0..100 {
            log.append(&batch(10_000_000, 4, i), 0).await.unwrap();
        }
        let closed = log.closed_segments();
        assert_eq!(closed.len(), log.segment_count() - 1);
        assert!(closed
            .windows(2)
            .all(|w| w[0].next_offset == w[1].base_offset));
        assert!(closed.iter().all(|c| c.log.exists() && c.size > 0));
        // Over the local window, but nothing is in the object store yet.
        assert_eq!(log.enforce_retention().await.unwrap(), 0);
        // The first three closed segments uploaded: only they may go.
        log.set_remote_end(closed[2].next_offset);
        assert_eq!(log.enforce_retention().await.unwrap(), 3);
        assert_eq!(log.log_start_offset(), closed[3].base_offset);
        // All uploaded: the local window (2 KiB past the active segment) is what stays.
        log.set_remote_end(i64::MAX);
        assert!(log.enforce_retention().await.unwrap() > 0);
        assert!(
            log.size_bytes() <= 2048 + 2 * 1024,
            "size {}",
            log.size_bytes()
        );
        // remote.log.copy.disable: nothing more is uploaded, so retention.* decides,
        // uploaded or not.
        log.set_remote_end(i64::MIN);
        log.set_config(LogConfig {
            retention_bytes: 2048,
            remote_storage: true,
            remote_copy_disabled: true,
            local_retention_bytes: 2048,
            ..small_segments(1024)
        })
        .unwrap();
        for i in 100..200 {
            log.append(&batch(10_000_000, 4, i), 0).await.unwrap();
        }
        assert!(log.enforce_retention().await.unwrap() > 0);
        assert!(
            log.size_bytes() <= 2048 + 2 * 1024,
            "size {}",
            log.size_bytes()
        );
        // Compacted topics cannot be tiered; the local window is within the total.
        let bad = LogConfig {
            remote_storage: true,
            cleanup_compact: true,
            ..LogConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = LogConfig {
            remote_storage: true,
            retention_ms: 1000,
            local_retention_ms: 2000,
            ..LogConfig::default()
        };
        assert!(bad.validate().is_err());
    });
}

#[test]
fn background_retention_task_deletes_expired_segments() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        // Records stamped at time 1: long expired under a one-minute retention.
        let cfg = LogConfig {
            retention_ms: 60_000,
            ..small_segments(1024)
        };
        let log = s.open_log("bg", cfg).await.unwrap();
        for i in 0..60 {
            log.append(&batch(1, 4, i), 0).await.unwrap();
        }
        assert!(log.segment_count() > 2);
        s.spawn_background(5, 3_600_000, 3_600_000).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while log.segment_count() > 1 && std::time::Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            log.segment_count(),
            1,
            "background retention left closed segments"
        );
        assert_eq!(log.log_start_offset(), log.segment_bases()[0]);
        // Appends kept working meanwhile and still do.
        log.append(&batch(1, 1, 99), 0).await.unwrap();
    });
}

#[test]
fn reads_across_many_segments_with_few_open_file_handles() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let limits = StorageLimits {
            open_segment_files_max: 2,
            ..no_cache()
        };
        let s = storage(&path, limits).await;
        let log = s.open_log("lru", small_segments(1024)).await.unwrap();
        for i in 0..80 {
            log.append(&batch(1, 4, i), 0).await.unwrap();
        }
        assert!(log.segment_count() > 5);
        // Twice through, so evicted handles are reopened.
        for _ in 0..2 {
            assert_eq!(read_all(&log).await.len(), 80);
        }
    });
}

/// A compressed-looking batch claiming `count` records (offset span `count`): the
/// record-count plausibility check cannot apply to compressed bytes, so only the
/// segment roll on offset span keeps relative offsets within 32 bits.
fn huge_span_batch(count: i32) -> Vec<u8> {
    let mut b = batch(1, 1, 0);
    b[sluice_storage::batch::OFF_ATTRIBUTES + 1] |= 1; // gzip
    b[sluice_storage::batch::OFF_LAST_OFFSET_DELTA
        ..sluice_storage::batch::OFF_LAST_OFFSET_DELTA + 4]
        .copy_from_slice(&(count - 1).to_be_bytes());
    b[sluice_storage::batch::OFF_RECORD_COUNT..sluice_storage::batch::OFF_RECORD_COUNT + 4]
        .copy_from_slice(&count.to_be_bytes());
    let crc = crc32c::crc32c(&b[sluice_storage::batch::OFF_ATTRIBUTES..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

#[test]
fn segments_roll_before_offsets_overflow_32_bits() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let log = s.open_log("span", LogConfig::default()).await.unwrap();
        for _ in 0..5 {
            log.append(&huge_span_batch(1 << 30), 0).await.unwrap();
        }
        assert!(log.segment_count() >= 3, "{:?}", log.segment_bases());
        let end = log.log_end_offset();
        assert_eq!(end, 5 << 30);
        log.close().await.unwrap();
        drop(log);
        let again = s.open_log("span", LogConfig::default()).await.unwrap();
        assert_eq!(again.log_end_offset(), end, "recovery kept every batch");
    });
}

#[test]
fn implausible_record_counts_are_rejected() {
    let mut b = batch(1, 1, 0);
    let n: i32 = 1 << 20;
    b[sluice_storage::batch::OFF_LAST_OFFSET_DELTA
        ..sluice_storage::batch::OFF_LAST_OFFSET_DELTA + 4]
        .copy_from_slice(&(n - 1).to_be_bytes());
    b[sluice_storage::batch::OFF_RECORD_COUNT..sluice_storage::batch::OFF_RECORD_COUNT + 4]
        .copy_from_slice(&n.to_be_bytes());
    let crc = crc32c::crc32c(&b[sluice_storage::batch::OFF_ATTRIBUTES..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(matches!(
        batch::validate(&b, true),
        Err(BatchError::BadRecordCount { .. })
    ));
}

/// Dropping an append or a flush midway (a closed connection cancels its request
/// tasks) must not wedge the log: the I/O runs in tasks of its own.
#[test]
fn cancelled_appends_and_flushes_do_not_wedge_the_log() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let log = s.open_log("cancel", LogConfig::default()).await.unwrap();
        for i in 0..20 {
            let l = log.clone();
            let t = glommio::spawn_local(async move {
                l.append(&batch(1, 10, i), 0).await.unwrap();
                l.flush().await.unwrap();
            });
            glommio::yield_if_needed().await;
            glommio::executor().yield_task_queue_now().await;
            drop(t);
        }
        let done = futures_lite::future::or(
            async {
                log.append(&batch(1, 1, 99), 0).await.unwrap();
                log.flush().await.unwrap();
                true
            },
            async {
                glommio::timer::sleep(Duration::from_secs(20)).await;
                false
            },
        )
        .await;
        assert!(done, "append + flush hung after cancellations");
        let all = read_all(&log).await;
        assert!(all.len() <= 21 && !all.is_empty());
    });
}

/// Truncation keeps the log's last segment in place while it awaits, so concurrent
/// readers never find a log without an active segment.
#[test]
fn reads_during_truncation_do_not_panic() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, no_cache()).await;
        let log = s.open_log("tr", small_segments(1024)).await.unwrap();
        for i in 0..40 {
            log.append(&batch(5, 2, i), 0).await.unwrap();
        }
        let reader_log = log.clone();
        let stop = Rc::new(std::cell::Cell::new(false));
        let stop2 = stop.clone();
        let reader = glommio::spawn_local(async move {
            let mut n = 0u64;
            while !stop2.get() {
                let end = reader_log.log_end_offset();
                let _ = reader_log
                    .read(reader_log.log_start_offset(), 1 << 16, Some(end))
                    .await;
                n += 1;
                glommio::yield_if_needed().await;
                glommio::executor().yield_task_queue_now().await;
            }
            n
        });
        for cut in [70, 41, 9] {
            log.truncate_to(cut).await.unwrap();
            assert!(log.log_end_offset() <= cut);
        }
        stop.set(true);
        assert!(reader.await > 0);
        assert_eq!(read_all(&log).await.len(), 4);
    });
}

/// Found by the crash proptest: DeleteRecords inside a batch, then a truncation to the
/// log start, rounded down to that batch's start below the log start (log end < log
/// start: an invariant abort). The log now starts over, empty, at the log start.
#[test]
fn truncating_a_batch_that_straddles_the_log_start_leaves_an_empty_log_at_the_start() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let log = s.open_log("ts", LogConfig::default()).await.unwrap();
        log.append(&batch(1, 2, 0), 0).await.unwrap();
        assert_eq!(log.delete_records_before(1).await.unwrap(), 1);
        log.truncate_to(1).await.unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (1, 1));
        let info = log.append(&batch(1, 1, 1), 0).await.unwrap();
        assert_eq!(info.base_offset, 1);
        log.flush().await.unwrap();
        drop(log);
        let log = s.open_log("ts", LogConfig::default()).await.unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (1, 2));
    });
}

/// Found by the crash proptest: truncating to an offset inside a compaction gap cut at
/// the next batch but left the log end at that batch's base, above the offset asked.
#[test]
fn truncating_into_a_compaction_gap_ends_the_log_at_the_offset() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let cfg = LogConfig {
            cleanup_compact: true,
            min_cleanable_dirty_ratio_bp: 0,
            min_compaction_lag_ms: 0,
            ..LogConfig::default()
        };
        let log = s.open_log("tg", cfg).await.unwrap();
        let keyed = |k: &[u8], v: &[u8]| batch::build::batch(1, &[(Some(k), v)]);
        log.append(&keyed(b"a", b"1"), 0).await.unwrap(); // 0: superseded by 2
        log.append(&keyed(b"b", b"1"), 0).await.unwrap(); // 1: superseded by 3
        log.append(&keyed(b"a", b"2"), 0).await.unwrap(); // 2
        log.append(&keyed(b"b", b"2"), 0).await.unwrap(); // 3
        log.append(&keyed(b"c", b"1"), 0).await.unwrap(); // 4
        log.roll().await.unwrap();
        log.append(&keyed(b"c", b"2"), 0).await.unwrap(); // 5
        log.compact().await.unwrap();
        // Segment 0 now holds offsets 2, 3, 4 (0 and 1 compacted away): a gap at 1.
        log.truncate_to(1).await.unwrap();
        assert_eq!(log.log_end_offset(), 1);
        let info = log.append(&keyed(b"d", b"1"), 0).await.unwrap();
        assert_eq!(info.base_offset, 1);
    });
}

/// A large client batch is stored as a rewritten header beside the client's own bytes
/// (no copy of the batch), a small one copied whole: read back from the tail cache and,
/// after a reopen, from disk, every batch is whole, valid (CRC included, recomputed for
/// LogAppendTime) and carries its assigned offset and leader epoch.
#[test]
fn client_batches_kept_uncopied_read_back_whole_from_cache_and_disk() {
    use sluice_storage::Judged;
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        for (name, timestamp_type) in [
            ("create", TimestampType::CreateTime),
            ("append", TimestampType::LogAppendTime),
        ] {
            let cfg = LogConfig {
                timestamp_type,
                ..LogConfig::default()
            };
            let log = s.open_log(name, cfg.clone()).await.unwrap();
            // Small batches are copied, large ones kept: two of each, interleaved.
            for tag in 0..4u64 {
                let n = [3, 3000][tag as usize % 2];
                let sent = bytes::Bytes::from(batch(1000 + tag as i64, n, tag));
                assert_eq!(
                    sent.len() >= sluice_storage::log::UNCOPIED_BATCH_BYTES_MIN,
                    n == 3000
                );
                let (judged, write) = log.append_judged_staged(sent, 5).await.unwrap();
                assert!(matches!(judged, Judged::Appended(_)), "{judged:?}");
                log.written(write.unwrap()).await.unwrap();
            }
            log.flush().await.unwrap();
            let check = |records: &[u8]| {
                let mut seen = Vec::new();
                for (h, b) in batch::stored_batches(records) {
                    let v = batch::validate(b, true).unwrap();
                    assert_eq!(v.leader_epoch, 5);
                    let append_time = v.attributes & batch::ATTR_TIMESTAMP_LOG_APPEND != 0;
                    assert_eq!(append_time, timestamp_type == TimestampType::LogAppendTime);
                    seen.push(h.base_offset);
                }
                seen
            };
            let cached = log.read(0, 1 << 20, None).await.unwrap();
            assert_eq!(
                check(&cached.records),
                [0, 3, 3003, 3006],
                "{name}: from the cache"
            );
            log.close().await.unwrap();
            drop(log);
            let log = s.open_log(name, cfg).await.unwrap();
            let from_disk = log.read(0, 1 << 20, None).await.unwrap();
            assert_eq!(
                from_disk.records, cached.records,
                "{name}: disk and cache agree"
            );
        }
    });
}

/// A staged append has its offsets and is readable by the log's own bookkeeping
/// without waiting for the device: the next batch can be staged at once, so batches
/// that arrive during a write share the next one. A staged write dropped unawaited
/// still reaches the disk with the next write or flush.
#[test]
fn staged_appends_take_offsets_without_waiting_for_the_device() {
    use futures_lite::future::poll_once;
    use sluice_storage::Judged;
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, no_cache()).await;
        let log = s.open_log("staged", LogConfig::default()).await.unwrap();
        // The first append opens the segment's files.
        log.append(&batch(1000, 2, 0), 1).await.unwrap();
        let mut staged = Vec::new();
        for tag in 1..=3u64 {
            let b = batch(1000 + tag as i64, 2, tag);
            let (judged, write) = poll_once(log.append_judged_staged(b.into(), 1))
                .await
                .expect("staging does not wait for a write")
                .unwrap();
            let Judged::Appended(info) = judged else {
                panic!("not appended: {judged:?}");
            };
            assert_eq!(info.base_offset, 2 * tag as i64);
            staged.push(write.expect("an appended batch has a write"));
        }
        assert_eq!(log.log_end_offset(), 8);
        let dropped = staged.pop().unwrap();
        drop(dropped);
        for w in staged {
            log.written(w).await.unwrap();
        }
        log.close().await.unwrap();
        drop(log);
        // Reopened: recovered from the files, read from disk (no cache).
        let log = s.open_log("staged", LogConfig::default()).await.unwrap();
        let got = read_all(&log).await;
        let offsets: Vec<i64> = got.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            offsets,
            [0, 2, 4, 6],
            "the dropped write reached the disk too"
        );
    });
}

#[test]
fn a_followers_staged_copies_keep_their_offsets_without_waiting_for_the_device() {
    use futures_lite::future::poll_once;
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, no_cache()).await;
        let log = s.open_log("copies", LogConfig::default()).await.unwrap();
        // The first copy opens the segment's files.
        let mut first = batch(1000, 2, 0);
        batch::assign(&mut first, 0, 1, None);
        log.append_with_offsets(first.into()).await.unwrap();
        // One fetch's batches, with the leader's offsets (a gap at 4..10: compaction).
        let mut writes = Vec::new();
        for (tag, base) in [(1u64, 2i64), (2, 10), (3, 12)] {
            let mut b = batch(1000 + base, 2, tag);
            batch::assign(&mut b, base, 1, None);
            let (info, write) = poll_once(log.append_with_offsets_staged(b.into()))
                .await
                .expect("staging a copy does not wait for a write")
                .unwrap();
            assert_eq!((info.base_offset, info.last_offset), (base, base + 1));
            writes.push(write.expect("an appended batch has a write"));
        }
        assert_eq!(log.log_end_offset(), 14);
        for w in writes {
            log.written(w).await.unwrap();
        }
        log.flush().await.unwrap();
        log.close().await.unwrap();
        drop(log);
        // Reopened: recovered from the files, read from disk (no cache).
        let log = s.open_log("copies", LogConfig::default()).await.unwrap();
        let offsets: Vec<i64> = read_all(&log).await.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            offsets,
            [0, 2, 10, 12],
            "each batch at its leader's offsets"
        );
    });
}
