//! Log compaction through the public API: latest record per key, offsets unchanged,
//! tombstones, the lag and dirty-ratio settings, restart, concurrent reads, and the
//! leftovers of a crash while cleaning.

mod common;

use std::rc::Rc;

use common::*;
use sluice_storage::batch::build;
use sluice_storage::compact;
use sluice_storage::{LogConfig, ManualClock, PartitionLog, StorageLimits};

fn compacted(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        cleanup_compact: true,
        cleanup_delete: false,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// Appends one record `key=value` (value `None`: tombstone); returns its offset.
async fn put(log: &PartitionLog, ts: i64, key: &str, value: Option<&str>) -> i64 {
    let b = build::batch_nullable(ts, &[(Some(key.as_bytes()), value.map(|v| v.as_bytes()))]);
    log.append(&b, 0).await.unwrap().base_offset
}

/// (offset, key, value) of every record left in the log.
async fn contents(log: &PartitionLog) -> Vec<(i64, String, Option<String>)> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    loop {
        let r = log.read(offset, 1 << 20, None).await.unwrap();
        if r.records.is_empty() {
            break;
        }
        let mut rest = &r.records[..];
        while let Some(total) = sluice_storage::batch::peek_total_bytes(rest) {
            let (_, recs) = compact::records(&rest[..total]).unwrap();
            for rec in recs {
                let key = String::from_utf8(rec.key.unwrap().to_vec()).unwrap();
                let value = (!rec.is_tombstone).then(|| {
                    // The value is the tail of the raw record before the headers count.
                    let raw = rec.raw;
                    String::from_utf8_lossy(&raw[raw.len() - 1 - value_len(raw)..raw.len() - 1])
                        .to_string()
                });
                out.push((rec.offset, key, value));
            }
            rest = &rest[total..];
        }
        offset = r.next_offset;
    }
    out
}

/// Values in these tests are short ASCII (< 64 bytes): one varint byte of length
/// right before them.
fn value_len(raw: &[u8]) -> usize {
    let mut i = raw.len() - 2;
    loop {
        let len = (raw[i] >> 1) as usize;
        if len == raw.len() - 2 - i {
            return len;
        }
        i -= 1;
    }
}

#[test]
fn keeps_the_latest_record_per_key_at_its_original_offset() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("c1", compacted(1024)).await.unwrap();
        let mut latest = std::collections::HashMap::new();
        let mut all = Vec::new();
        for round in 0..20 {
            for k in 0..5 {
                let key = format!("k{k}");
                let off = put(&log, 1, &key, Some(&format!("v{round}"))).await;
                latest.insert(key.clone(), (off, format!("v{round}")));
                all.push((off, key));
            }
        }
        let before_segments = log.segment_count();
        assert!(before_segments > 3);
        let active_base = *log.segment_bases().last().unwrap();
        let stats = log.compact().await.unwrap().expect("a pass ran");
        assert!(stats.records_removed > 50, "{stats:?}");
        assert!(stats.bytes_after < stats.bytes_before);
        let got = contents(&log).await;
        // Every key's latest record is there, at its own offset.
        for (key, (off, value)) in &latest {
            assert!(
                got.contains(&(*off, key.clone(), Some(value.clone()))),
                "{key} at {off} missing"
            );
        }
        // The cleaner's map covers the closed segments: there, only the latest record
        // of each key among them remains (the active segment is never cleaned).
        let mut latest_closed = std::collections::HashMap::new();
        for (off, key) in all.iter().filter(|(o, _)| *o < active_base) {
            latest_closed.insert(key.clone(), *off);
        }
        for (off, key, _) in got.iter().filter(|(o, _, _)| *o < active_base) {
            assert_eq!(
                latest_closed[key], *off,
                "stale record {key}@{off} survived"
            );
        }
        assert_eq!(
            got.iter().filter(|(o, _, _)| *o < active_base).count(),
            latest_closed.len()
        );
        // Offsets only ever increase, the log end did not move.
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(log.log_end_offset(), 100);
        // A second pass has nothing dirty to do.
        assert!(log.compact().await.unwrap().is_none());
        // The result survives a restart.
        log.close().await.unwrap();
        drop(log);
        let again = s.open_log("c1", compacted(1024)).await.unwrap();
        assert_eq!(contents(&again).await, got);
    });
}

#[test]
fn tombstones_are_dropped_only_after_delete_retention() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let clock = Rc::new(ManualClock::default());
        clock.0.set(1_000_000);
        let s = storage_with_clock(&dir, StorageLimits::default(), clock.clone()).await;
        let cfg = LogConfig {
            delete_retention_ms: 10_000,
            min_cleanable_dirty_ratio_bp: 0,
            ..compacted(1024)
        };
        let log = s.open_log("c2", cfg).await.unwrap();
        put(&log, 999_000, "gone", Some("old")).await;
        let tomb = put(&log, 999_000, "gone", None).await;
        for i in 0..40 {
            put(&log, 999_000, &format!("f{}", i % 4), Some("filler")).await;
        }
        log.compact().await.unwrap().expect("pass");
        let got = contents(&log).await;
        assert!(
            got.contains(&(tomb, "gone".into(), None)),
            "tombstone kept within delete.retention.ms"
        );
        assert!(!got.iter().any(|(_, k, v)| k == "gone" && v.is_some()));
        // Later: new dirty data, and the tombstone is past the horizon.
        clock.0.set(1_000_000 + 20_000);
        for i in 0..40 {
            put(&log, 1_019_000, &format!("f{}", i % 4), Some("filler")).await;
        }
        log.compact().await.unwrap().expect("second pass");
        let got = contents(&log).await;
        assert!(
            !got.iter().any(|(_, k, _)| k == "gone"),
            "tombstone dropped after delete.retention.ms"
        );
    });
}

#[test]
fn lag_and_dirty_ratio_hold_compaction_back() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let clock = Rc::new(ManualClock::default());
        clock.0.set(5_000);
        let s = storage_with_clock(&dir, StorageLimits::default(), clock.clone()).await;
        let cfg = LogConfig {
            min_compaction_lag_ms: 60_000,
            ..compacted(1024)
        };
        let log = s.open_log("c3", cfg).await.unwrap();
        for i in 0..60 {
            put(&log, 4_000, &format!("k{}", i % 3), Some("v")).await;
        }
        assert!(
            log.compact().await.unwrap().is_none(),
            "records younger than the lag"
        );
        clock.0.set(4_000 + 60_001);
        assert!(log.compact().await.unwrap().is_some(), "old enough now");

        let cfg = LogConfig {
            min_cleanable_dirty_ratio_bp: 10_000,
            ..compacted(1024)
        };
        let log2 = s.open_log("c4", cfg).await.unwrap();
        for i in 0..60 {
            put(&log2, 1, &format!("k{}", i % 3), Some("v")).await;
        }
        // Everything is dirty: ratio 1.0 is met.
        assert!(log2.compact().await.unwrap().is_some());
        for i in 0..30 {
            put(&log2, 1, &format!("k{}", i % 3), Some("v")).await;
        }
        // Now only part of the cleanable bytes is dirty: below ratio 1.0.
        assert!(log2.compact().await.unwrap().is_none());
        // max.compaction.lag.ms: a dirty segment that old is cleaned below the ratio.
        let cfg = LogConfig {
            min_cleanable_dirty_ratio_bp: 10_000,
            max_compaction_lag_ms: 30_000,
            ..compacted(1024)
        };
        let log3 = s.open_log("c6", cfg).await.unwrap();
        for i in 0..60 {
            put(&log3, 1, &format!("k{}", i % 3), Some("v")).await;
        }
        assert!(log3.compact().await.unwrap().is_some());
        for i in 0..30 {
            put(&log3, 1, &format!("k{}", i % 3), Some("v")).await;
        }
        assert!(
            log3.compact().await.unwrap().is_none(),
            "below the ratio, not overdue"
        );
        clock.0.set(clock.0.get() + 30_000);
        assert!(
            log3.compact().await.unwrap().is_some(),
            "overdue: cleaned anyway"
        );
        // Delete-only topics are never compacted.
        let plain = s.open_log("c5", small_segments(1024)).await.unwrap();
        for i in 0..60 {
            put(&plain, 1, &format!("k{}", i % 3), Some("v")).await;
        }
        assert!(plain.compact().await.unwrap().is_none());
    });
}

#[test]
fn reads_during_compaction_see_a_consistent_log() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("c6", compacted(1024)).await.unwrap();
        for i in 0..300 {
            put(&log, 1, &format!("k{}", i % 7), Some(&format!("v{i}"))).await;
        }
        let reader_log = log.clone();
        let reader = glommio::spawn_local(async move {
            let mut reads = 0;
            for _ in 0..50 {
                let got = contents(&reader_log).await;
                assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
                reads += 1;
                glommio::yield_if_needed().await;
            }
            reads
        });
        log.compact().await.unwrap().expect("pass");
        assert_eq!(reader.await, 50);
        let got = contents(&log).await;
        for k in 0..7 {
            assert!(got.iter().any(|(_, key, _)| key == &format!("k{k}")));
        }
    });
}

#[test]
fn crash_while_cleaning_leaves_a_readable_log() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("c7", compacted(1024)).await.unwrap();
        for i in 0..100 {
            put(&log, 1, &format!("k{}", i % 5), Some(&format!("v{i}"))).await;
        }
        log.compact().await.unwrap().expect("pass");
        let got = contents(&log).await;
        log.close().await.unwrap();
        drop(log);
        // A crash mid-swap: a half-written cleaned file beside the segment, and the old
        // index already removed.
        let base = std::fs::read_dir(dir.join("c7"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".log"))
            .min()
            .unwrap();
        let stem = base.trim_end_matches(".log");
        std::fs::write(
            dir.join("c7").join(format!("{stem}.log.cleaned")),
            b"partial",
        )
        .unwrap();
        std::fs::remove_file(dir.join("c7").join(format!("{stem}.index"))).unwrap();
        let (again, report) = s.open_log_with_report("c7", compacted(1024)).await.unwrap();
        assert!(report.removed_files >= 1);
        assert!(!dir.join("c7").join(format!("{stem}.log.cleaned")).exists());
        assert_eq!(contents(&again).await, got);
    });
}
