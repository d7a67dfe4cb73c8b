//! Log compaction through the public API: latest record per key, offsets unchanged,
//! tombstones, the lag and dirty-ratio settings, restart, concurrent reads, and the
//! leftovers of a crash while cleaning.

use std::rc::Rc;

use crate::common::*;
use sluice_storage::batch::{self, build, BatchHeader};
use sluice_storage::codec::{self, Codec, Levels};
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

/// Every batch left in the log, each checked as stored batches must be (layout and
/// CRC-32C; compacted batches may hold fewer records than their offset span).
async fn stored(log: &PartitionLog) -> Vec<(BatchHeader, Vec<u8>)> {
    let mut out = Vec::new();
    for (_, chunk) in read_chunks(log).await {
        for (_, b) in batch::stored_batches(&chunk) {
            let h = batch::validate(b, false).expect("a valid batch");
            out.push((h, b.to_vec()));
        }
    }
    out
}

/// (offset, key, value) of every record left in the log, compressed batches
/// decompressed; every record's offset lies in its batch's offset span.
async fn contents(log: &PartitionLog) -> Vec<(i64, String, Option<String>)> {
    let mut out = Vec::new();
    for (h, b) in stored(log).await {
        if h.is_control() {
            continue;
        }
        let decoded = compact::decode(&b).expect("a readable batch");
        for rec in decoded.records().expect("records that parse") {
            assert!(rec.offset >= h.base_offset && rec.offset <= h.last_offset());
            let (key, value) = key_value(rec.raw);
            assert_eq!(Some(key.as_bytes()), rec.key);
            assert_eq!(value.is_none(), rec.is_tombstone);
            out.push((rec.offset, key, value));
        }
    }
    out
}

/// The key and value of a raw record (length prefix included).
fn key_value(raw: &[u8]) -> (String, Option<String>) {
    let mut rest = raw;
    batch::get_varint(&mut rest).unwrap(); // length
    rest = &rest[1..]; // attributes
    batch::get_varint(&mut rest).unwrap(); // timestamp delta
    batch::get_varint(&mut rest).unwrap(); // offset delta
    let kl = batch::get_varint(&mut rest).unwrap() as usize;
    let key = String::from_utf8(rest[..kl].to_vec()).unwrap();
    rest = &rest[kl..];
    let vl = batch::get_varint(&mut rest).unwrap();
    let value = (vl >= 0).then(|| String::from_utf8(rest[..vl as usize].to_vec()).unwrap());
    (key, value)
}

#[test]
fn keeps_the_latest_record_per_key_at_its_original_offset() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let limits = StorageLimits {
            index_memory_max: 0,
            ..no_cache()
        };
        let s = storage(&dir, limits).await;
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
        // With their indexes dropped from memory (a budget of 0), the cleaned segments
        // read back the same from their files.
        let sweep = s.limit_index_memory();
        assert!(sweep.unloaded_segments > 0, "{sweep:?}");
        assert_eq!(contents(&log).await, got);
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
fn cleaned_segments_keep_their_modification_time() {
    // ListOffsets v0 finds segments by the modification time of their `.log`; Kafka's
    // cleaner carries it over to the cleaned file, and so does this one.
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("mt", compacted(1024)).await.unwrap();
        for round in 0..20 {
            for k in 0..5 {
                put(&log, 1, &format!("k{k}"), Some(&format!("v{round}"))).await;
            }
        }
        let bases = log.segment_bases();
        assert!(bases.len() > 3);
        // Each closed segment gets a distinct time long ago.
        let old = |i: usize| {
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + 60 * i as u64)
        };
        for (i, base) in bases[..bases.len() - 1].iter().enumerate() {
            let path = log
                .dir()
                .join(sluice_storage::segment::file_name(*base, "log"));
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(old(i)).unwrap();
        }
        let ms = |i: usize| (1_000_000 + 60 * i as i64) * 1000;
        let before = log.segment_times();
        for (i, (base, size, modified)) in before[..before.len() - 1].iter().enumerate() {
            assert_eq!((*base, *modified), (bases[i], ms(i)));
            assert!(*size > 0);
        }
        let stats = log.compact().await.unwrap().expect("a pass ran");
        assert!(stats.segments_rewritten > 0, "{stats:?}");
        // Every closed segment still there has its old time.
        let after = log.segment_times();
        let closed_after = &after[..after.len() - 1];
        assert!(!closed_after.is_empty());
        for (base, _, modified) in closed_after {
            let i = bases.iter().position(|b| b == base).unwrap();
            assert_eq!(*modified, ms(i), "segment {base}");
        }
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

const CODECS: [Codec; 4] = [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd];

/// A batch of `key=value` records (value `None`: tombstone) compressed with `codec`,
/// of producer `pid` (`None`: no producer) with sequence 0, transactional or not.
fn batch_with(
    codec: Codec,
    ts: i64,
    records: &[(&str, Option<&str>)],
    producer: Option<(i64, bool)>,
) -> Vec<u8> {
    let recs: Vec<build::NullableRecord<'_>> = records
        .iter()
        .map(|(k, v)| (Some(k.as_bytes()), v.map(str::as_bytes)))
        .collect();
    let mut plain = build::batch_nullable(ts, &recs);
    if let Some((pid, txn)) = producer {
        set_producer(&mut plain, pid, 0, 0, txn);
    }
    let b = codec::recompress_batch(&plain, codec, Levels::default()).unwrap();
    assert_eq!(
        BatchHeader::parse(&b).unwrap().compression(),
        codec.id() as i16
    );
    b
}

/// Writes 40 batches of three records (two of six recurring keys and a key of their
/// own, so every batch keeps something), batch `i` compressed with `codec_of(i)`,
/// compacts, and checks that the closed segments hold exactly the latest record of
/// each key, at its offset, in batches that keep their codec.
async fn compacts_batches_of(
    s: &Rc<sluice_storage::Storage>,
    name: &str,
    codec_of: impl Fn(usize) -> Codec,
) {
    let log = s.open_log(name, compacted(1024)).await.unwrap();
    let mut written = std::collections::BTreeMap::new();
    let mut codec_at = std::collections::HashMap::new();
    for round in 0..40 {
        let keys = [
            format!("k{}", round % 6),
            format!("k{}", (round * 5 + 1) % 6),
            format!("u{round}"),
        ];
        let values: Vec<String> = (0..3).map(|i| format!("v{round}-{i}")).collect();
        let recs: Vec<(&str, Option<&str>)> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| (k.as_str(), Some(v.as_str())))
            .collect();
        let codec = codec_of(round);
        let base = log
            .append(&batch_with(codec, 1, &recs, None), 0)
            .await
            .unwrap()
            .base_offset;
        codec_at.insert(base, codec);
        for (i, (k, v)) in keys.iter().zip(&values).enumerate() {
            written.insert(base + i as i64, (k.clone(), v.clone()));
        }
    }
    assert!(log.segment_count() > 3, "{name}");
    let active_base = *log.segment_bases().last().unwrap();
    let stats = log.compact().await.unwrap().expect("a pass ran");
    let mut latest_closed = std::collections::HashMap::new();
    for (off, (key, _)) in written.range(..active_base) {
        latest_closed.insert(key.clone(), *off);
    }
    let expected: Vec<(i64, String, Option<String>)> = written
        .iter()
        .filter(|(off, (key, _))| **off >= active_base || latest_closed[key] == **off)
        .map(|(off, (k, v))| (*off, k.clone(), Some(v.clone())))
        .collect();
    assert_eq!(
        stats.records_removed,
        (written.len() - expected.len()) as u64,
        "{name}: {stats:?}"
    );
    assert!(stats.records_removed > 40, "{name}: {stats:?}");
    let got = contents(&log).await;
    assert_eq!(got, expected, "{name}");
    // Every batch left keeps its codec; some were rewritten (fewer records than
    // their offset span) rather than kept or dropped whole.
    let batches = stored(&log).await;
    let mut rewritten = 0;
    for (h, _) in &batches {
        assert_eq!(
            h.compression(),
            codec_at[&h.base_offset].id() as i16,
            "{name}: batch at {}",
            h.base_offset
        );
        assert!(h.record_count > 0);
        if i64::from(h.record_count) < i64::from(h.last_offset_delta) + 1 {
            rewritten += 1;
        }
    }
    assert!(rewritten >= 5, "{name}: {rewritten} rewritten");
    // Idempotent: nothing dirty is left, and a restart reads the same records.
    assert!(log.compact().await.unwrap().is_none());
    log.close().await.unwrap();
    drop(log);
    let again = s.open_log(name, compacted(1024)).await.unwrap();
    assert_eq!(contents(&again).await, got, "{name}");
}

#[test]
fn compressed_batches_are_compacted_and_keep_their_codec() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        for codec in CODECS {
            compacts_batches_of(&s, &format!("z-{}", codec.name()), |_| codec).await;
        }
    });
}

#[test]
fn mixed_compressed_and_uncompressed_batches_are_compacted_together() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let all = [
            Codec::None,
            Codec::Gzip,
            Codec::Snappy,
            Codec::Lz4,
            Codec::Zstd,
        ];
        compacts_batches_of(&s, "mixed", |round| all[round % all.len()]).await;
    });
}

#[test]
fn tombstones_in_compressed_batches_go_after_delete_retention() {
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
        for codec in CODECS {
            clock.0.set(1_000_000);
            let name = format!("t-{}", codec.name());
            let log = s.open_log(&name, cfg.clone()).await.unwrap();
            let put = |recs: &[(&str, Option<&str>)], ts| batch_with(codec, ts, recs, None);
            log.append(&put(&[("gone", Some("old"))], 999_000), 0)
                .await
                .unwrap();
            // A tombstone and a live record in one compressed batch.
            let tomb = log
                .append(&put(&[("gone", None), ("stay", Some("s"))], 999_000), 0)
                .await
                .unwrap()
                .base_offset;
            for i in 0..40 {
                let k = format!("f{}", i % 4);
                log.append(&put(&[(&k, Some("filler"))], 999_000), 0)
                    .await
                    .unwrap();
            }
            log.compact().await.unwrap().expect("pass");
            let got = contents(&log).await;
            assert!(
                got.contains(&(tomb, "gone".into(), None)),
                "{name}: tombstone kept within delete.retention.ms"
            );
            assert!(!got.iter().any(|(_, k, v)| k == "gone" && v.is_some()));
            assert!(got.contains(&(tomb + 1, "stay".into(), Some("s".into()))));
            // Later: new dirty data, and the tombstone is past the horizon.
            clock.0.set(1_000_000 + 20_000);
            for i in 0..40 {
                let k = format!("f{}", i % 4);
                log.append(&put(&[(&k, Some("filler"))], 1_019_000), 0)
                    .await
                    .unwrap();
            }
            log.compact().await.unwrap().expect("second pass");
            let got = contents(&log).await;
            assert!(
                !got.iter().any(|(_, k, _)| k == "gone"),
                "{name}: tombstone dropped after delete.retention.ms"
            );
            assert!(got.contains(&(tomb + 1, "stay".into(), Some("s".into()))));
            // Its batch stays, compressed as it was, with the one record left.
            let (h, _) = stored(&log)
                .await
                .into_iter()
                .find(|(h, _)| h.base_offset == tomb)
                .expect("the tombstone's batch");
            assert_eq!(
                (h.compression(), h.record_count, h.last_offset_delta),
                (codec.id() as i16, 1, 1),
                "{name}"
            );
            assert_eq!(
                (h.base_timestamp, h.max_timestamp),
                (999_000, 999_001),
                "{name}"
            );
        }
    });
}

/// Transactional data compressed with `codec`: producer 1 commits a, b, c; producer 2
/// aborts a, d; later plain records overwrite b. Returns the records and the batch
/// headers left after compaction.
async fn transactional_scenario(
    s: &Rc<sluice_storage::Storage>,
    codec: Codec,
) -> (Vec<(i64, String, Option<String>)>, Vec<BatchHeader>) {
    let cfg = LogConfig {
        min_cleanable_dirty_ratio_bp: 0,
        ..compacted(1024)
    };
    let log = s
        .open_log(&format!("x-{}", codec.name()), cfg)
        .await
        .unwrap();
    let judged = |j: sluice_storage::Judged| match j {
        sluice_storage::Judged::Appended(info) => info.base_offset,
        other => panic!("expected an append, got {other:?}"),
    };
    log.append(&batch_with(codec, 1_000, &[("a", Some("a0"))], None), 0)
        .await
        .unwrap(); // 0
    let committed = &[("a", Some("a1")), ("b", Some("b1")), ("c", Some("c1"))];
    let b1 = batch_with(codec, 1_000, committed, Some((1, true)));
    assert_eq!(judged(log.append_judged(&b1, 0).await.unwrap()), 1); // 1..=3
    let b2 = batch_with(
        codec,
        1_000,
        &[("a", Some("a2")), ("d", Some("d2"))],
        Some((2, true)),
    );
    assert_eq!(judged(log.append_judged(&b2, 0).await.unwrap()), 4); // 4..=5
    judged(log.append_marker(1, 0, true, 0, 0).await.unwrap()); // 6
    judged(log.append_marker(2, 0, false, 0, 0).await.unwrap()); // 7
    log.append(&batch_with(codec, 1_000, &[("b", Some("b9"))], None), 0)
        .await
        .unwrap(); // 8
    for i in 0..40 {
        let k = format!("f{}", i % 3);
        log.append(&batch_with(codec, 1_000, &[(&k, Some("v"))], None), 0)
            .await
            .unwrap();
    }
    log.roll().await.unwrap();
    log.compact().await.unwrap().expect("a pass ran");
    let headers = stored(&log).await.into_iter().map(|(h, _)| h).collect();
    (contents(&log).await, headers)
}

#[test]
fn transactional_compressed_batches_are_compacted_like_uncompressed_ones() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        // A fixed clock: the markers carry the time they were written.
        let (s, _clock) = storage_at(&dir, no_cache(), 5_000).await;
        let (plain_records, plain_headers) = transactional_scenario(&s, Codec::None).await;
        // a0 went (a1 is later and committed; the aborted a2 does not hide it), b1
        // went (b9 is later), the aborted records went.
        let low: Vec<_> = plain_records
            .iter()
            .filter(|(o, _, _)| *o < 9)
            .cloned()
            .collect();
        assert_eq!(
            low,
            vec![
                (1, "a".into(), Some("a1".into())),
                (3, "c".into(), Some("c1".into())),
                (8, "b".into(), Some("b9".into())),
            ]
        );
        let txn = plain_headers.iter().find(|h| h.base_offset == 1).unwrap();
        assert_eq!(
            (txn.record_count, txn.last_offset_delta, txn.producer_id),
            (2, 2, 1)
        );
        assert!(txn.is_transactional());
        let ignoring_codec = |h: &BatchHeader| {
            (
                h.base_offset,
                h.last_offset_delta,
                h.record_count,
                h.attributes & !batch::ATTR_COMPRESSION_MASK,
                h.base_timestamp,
                h.max_timestamp,
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.leader_epoch,
            )
        };
        for codec in CODECS {
            let (records, headers) = transactional_scenario(&s, codec).await;
            assert_eq!(records, plain_records, "{codec:?}");
            assert_eq!(
                headers.iter().map(ignoring_codec).collect::<Vec<_>>(),
                plain_headers.iter().map(ignoring_codec).collect::<Vec<_>>(),
                "{codec:?}"
            );
            for h in &headers {
                // Batches with records keep their codec; markers and emptied
                // batches (headers only) are uncompressed, as Kafka writes them.
                let expected = if h.record_count > 0 && !h.is_control() {
                    codec.id() as i16
                } else {
                    0
                };
                assert_eq!(h.compression(), expected, "{codec:?} at {}", h.base_offset);
            }
        }
    });
}

#[test]
fn batches_over_max_message_bytes_from_the_broker_are_stored_read_and_compacted() {
    // A consumer group's metadata record can outgrow max.message.bytes (1 MiB): the
    // broker appends it with its own bound, and every reader must take it whole.
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let cfg = compacted(8 << 20);
        let log = s.open_log("big", cfg.clone()).await.unwrap();
        let big = |v: char| {
            let value = v.to_string().repeat(3 << 20);
            build::batch_nullable(1, &[(Some(b"group".as_slice()), Some(value.as_bytes()))])
        };
        let first = big('a');
        assert!(first.len() > cfg.max_message_bytes);
        assert!(matches!(
            log.append(&first, 0).await,
            Err(sluice_storage::Error::Batch(
                batch::BatchError::TooLarge { .. }
            ))
        ));
        assert!(matches!(
            log.append_bounded(&first, 0, 1 << 20).await,
            Err(sluice_storage::Error::Batch(
                batch::BatchError::TooLarge { .. }
            ))
        ));
        assert_eq!(log.log_end_offset(), 0, "a refused batch leaves nothing");
        assert_eq!(
            log.append_bounded(&first, 0, 32 << 20)
                .await
                .unwrap()
                .base_offset,
            0
        );
        put(&log, 1, "offset", Some("1")).await;
        assert_eq!(
            log.append_bounded(&big('b'), 0, 32 << 20)
                .await
                .unwrap()
                .base_offset,
            2
        );
        log.roll().await.unwrap();
        put(&log, 1, "offset", Some("2")).await;
        // A read window smaller than the batch still returns it whole.
        let r = log.read(0, 1 << 20, None).await.unwrap();
        assert_eq!(r.records.len(), first.len());
        assert_eq!(r.next_offset, 1);
        let r = log.read(1, 1 << 20, None).await.unwrap();
        assert_eq!(
            (r.next_offset, batch::stored_batches(&r.records).count()),
            (2, 1)
        );
        let r = log.read(2, 1 << 20, None).await.unwrap();
        assert_eq!((r.next_offset, r.records.len()), (3, first.len()));
        // The cleaner drops the superseded big record and keeps the latest whole.
        let stats = log.compact().await.unwrap().expect("a pass ran");
        assert_eq!(stats.records_removed, 1, "{stats:?}");
        let b = "b".repeat(3 << 20);
        let want = vec![
            (1, "offset".to_string(), Some("1".to_string())),
            (2, "group".into(), Some(b)),
            (3, "offset".into(), Some("2".into())),
        ];
        assert_eq!(contents(&log).await, want);
        log.close().await.unwrap();
        drop(log);
        let again = s.open_log("big", cfg).await.unwrap();
        assert_eq!(contents(&again).await, want, "the same after a reopen");
    });
}

/// A truncation into a compacted segment, where compaction removed the batches just
/// below the cut, leaves the log end recovery derives from the files (the end of the
/// last batch kept): a clean close and reopen then read the segment back instead of
/// refusing it as changed since the close.
#[test]
fn a_truncation_after_a_compaction_gap_survives_a_clean_reopen() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("g", compacted(1024)).await.unwrap();
        // Keys overwritten every round, and one key per round written once: compaction
        // removes the overwritten records between the single ones, leaving gaps.
        for round in 0..20 {
            put(&log, 1, &format!("once-{round}"), Some("kept")).await;
            for k in 0..5 {
                put(&log, 1, &format!("k{k}"), Some(&format!("v{round}"))).await;
            }
        }
        log.compact().await.unwrap().expect("a pass ran");
        // A batch whose base lies above the previous batch's end: a gap compaction made.
        let batches: Vec<BatchHeader> = stored(&log).await.into_iter().map(|(h, _)| h).collect();
        let after_gap = batches
            .windows(2)
            .find(|w| w[1].base_offset > w[0].last_offset() + 1)
            .map(|w| (w[0].last_offset() + 1, w[1].base_offset))
            .expect("compaction left a gap between two batches");
        let (gap_start, next_base) = after_gap;
        log.truncate_to(next_base).await.unwrap();
        let end = log.log_end_offset();
        assert!(
            end <= next_base && end >= gap_start,
            "log end {end} after cutting at {next_base}"
        );
        let kept = contents(&log).await;
        log.close().await.unwrap();
        drop(log);
        let again = s.open_log("g", compacted(1024)).await.unwrap();
        assert_eq!(
            contents(&again).await,
            kept,
            "the log read back after a clean reopen"
        );
        assert_eq!(again.log_end_offset(), end);
    });
}

/// Closed segments' records and distinct keys (equal once they are cleaned; the
/// active segment is never cleaned).
async fn closed_records_and_keys(log: &PartitionLog) -> (usize, usize) {
    let active = *log.segment_bases().last().unwrap();
    let closed: Vec<String> = contents(log)
        .await
        .into_iter()
        .filter(|(off, ..)| *off < active)
        .map(|(_, k, _)| k)
        .collect();
    let mut keys = closed.clone();
    keys.sort();
    keys.dedup();
    (closed.len(), keys.len())
}

/// Waits (until `deadline`) for every closed segment to hold one record per key.
async fn until_closed_segments_are_clean(log: &PartitionLog, deadline: std::time::Instant) {
    loop {
        let (records, keys) = closed_records_and_keys(log).await;
        if records == keys {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{records} records for {keys} keys"
        );
        glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The background cleaner (`Storage::spawn_background`) compacts on its own schedule,
/// not retention's: with retention checked hourly and a cleaner backoff of 20 ms,
/// every closed segment of a compacted log is cleaned in one go shortly after it rolls,
/// and segments rolled later are cleaned by later rounds (issue 43 item 2).
#[test]
fn the_background_cleaner_cleans_every_closed_segment_after_a_roll() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("bgc", compacted(1024)).await.unwrap();
        for round in 0..30 {
            for k in 0..4 {
                put(&log, 1, &format!("k{k}"), Some(&format!("v{round}"))).await;
            }
        }
        assert!(log.segment_count() > 3);
        s.spawn_background(3_600_000, 20, 3_600_000).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        until_closed_segments_are_clean(&log, deadline).await;
        // More rounds roll more segments: cleaned again without anyone asking.
        let first_active = *log.segment_bases().last().unwrap();
        for round in 30..60 {
            for k in 0..4 {
                put(&log, 1, &format!("k{k}"), Some(&format!("v{round}"))).await;
            }
        }
        assert!(
            *log.segment_bases().last().unwrap() > first_active,
            "rolled again"
        );
        until_closed_segments_are_clean(&log, deadline).await;
        assert_eq!(
            contents(&log).await.last().unwrap().2.as_deref(),
            Some("v59")
        );
    });
}
