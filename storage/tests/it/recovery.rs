//! Crash-recovery tier: one test per case of the recovery table in
//! `sluice_storage::segment` (R1–R19; R15–R19 are the transaction index and the
//! producer state). Each builds a log, "crashes" it (drops it
//! without closing, so the active segment keeps its O_DIRECT page padding) or damages
//! its files, reopens it and checks what recovery kept and reported.

use std::path::{Path, PathBuf};

use crate::common::*;
use sluice_storage::segment::RecoveryReport;
use sluice_storage::{LogConfig, StorageLimits};

fn seg(dir: &Path, log: &str, base: i64, ext: &str) -> PathBuf {
    dir.join(log).join(format!("{base:020}.{ext}"))
}

fn cfg() -> LogConfig {
    LogConfig {
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// Appends `n` batches of 3 records to a new log and drops it without closing.
async fn crashed_log(dir: &Path, name: &str, n: u64, config: LogConfig) -> Vec<(i64, Vec<u8>)> {
    let s = storage(dir, no_cache()).await;
    let log = s.open_log(name, config).await.unwrap();
    for i in 0..n {
        log.append(&batch(1000 + i as i64, 3, i), 0).await.unwrap();
    }
    log.flush().await.unwrap();
    read_all(&log).await
}

/// [`crashed_log`] whose active segment's indexes were written before the crash: they
/// reach their files when the segment is sealed (here its idle file closed, as the
/// descriptor budget does), not at every flush (issue 14).
async fn crashed_log_indexed(
    dir: &Path,
    name: &str,
    n: u64,
    config: LogConfig,
) -> Vec<(i64, Vec<u8>)> {
    let s = storage(dir, no_cache()).await;
    let log = s.open_log(name, config).await.unwrap();
    for i in 0..n {
        log.append(&batch(1000 + i as i64, 3, i), 0).await.unwrap();
    }
    log.flush().await.unwrap();
    assert!(log.deactivate().await.unwrap());
    read_all(&log).await
}

async fn reopen(
    dir: &Path,
    name: &str,
    config: LogConfig,
) -> (Vec<(i64, Vec<u8>)>, RecoveryReport, i64) {
    let s = storage(dir, no_cache()).await;
    let (log, report) = s.open_log_with_report(name, config).await.unwrap();
    let all = read_all(&log).await;
    // Appends still work after recovery and continue the offsets.
    let end = log.log_end_offset();
    let info = log.append(&batch(9, 1, 999), 0).await.unwrap();
    assert_eq!(info.base_offset, end);
    (all, report, end)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

fn batch_positions(log_file: &Path) -> Vec<(u64, u64)> {
    let data = std::fs::read(log_file).unwrap();
    let mut out = Vec::new();
    let mut pos = 0usize;
    while let Some(total) = sluice_storage::batch::peek_total_bytes(&data[pos..]) {
        if pos + total > data.len() {
            break;
        }
        out.push((pos as u64, total as u64));
        pos += total;
    }
    out
}

#[test]
fn r1_clean_shutdown_needs_nothing() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("r1", cfg()).await.unwrap();
        for i in 0..50 {
            log.append(&batch(i, 3, i as u64), 0).await.unwrap();
        }
        let before = read_all(&log).await;
        log.close().await.unwrap();
        drop(log);
        let (after, report, _) = reopen(&dir, "r1", cfg()).await;
        assert_eq!(after, before);
        // Closing wrote a producer snapshot at the log end: nothing to replay.
        assert_eq!(
            report,
            RecoveryReport {
                producer_snapshot: Some(150),
                ..RecoveryReport::default()
            }
        );
    });
}

#[test]
fn r2_page_padding_after_crash_is_cut() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let before = crashed_log(&dir, "r2", 7, cfg()).await;
        let path = seg(&dir, "r2", 0, "log");
        let padded = file_len(&path);
        assert_eq!(
            padded % 4096,
            0,
            "an active O_DIRECT segment is page padded"
        );
        let (after, report, end) = reopen(&dir, "r2", cfg()).await;
        assert_eq!(after, before);
        assert_eq!(end, 21);
        assert!(report.truncated_bytes > 0 && report.truncated_bytes <= padded);
    });
}

#[test]
fn r3_torn_last_batch_is_dropped() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let before = crashed_log(&dir, "r3", 10, cfg()).await;
        let path = seg(&dir, "r3", 0, "log");
        let (pos, len) = *batch_positions(&path).last().unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(pos + len / 2).unwrap();
        let (after, report, end) = reopen(&dir, "r3", cfg()).await;
        assert_eq!(after, before[..9].to_vec());
        assert_eq!(end, 27);
        assert_eq!(report.truncated_bytes, len / 2);
    });
}

#[test]
fn r4_corrupt_batch_and_everything_after_it_are_dropped() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let before = crashed_log_indexed(&dir, "r4", 40, cfg()).await;
        let path = seg(&dir, "r4", 0, "log");
        let positions = batch_positions(&path);
        // Corrupt the batch just after the last index entry: in the tail recovery checks.
        let idx = std::fs::read(seg(&dir, "r4", 0, "index")).unwrap();
        let last_entry = sluice_storage::index::OffsetIndex::decode(&idx)
            .last()
            .unwrap();
        let victim = positions
            .iter()
            .position(|(p, _)| *p >= u64::from(last_entry.position))
            .unwrap();
        let (pos, len) = positions[victim];
        let mut data = std::fs::read(&path).unwrap();
        data[(pos + len - 3) as usize] ^= 0xff; // inside the CRC-covered records
        std::fs::write(&path, &data).unwrap();
        let (after, report, _) = reopen(&dir, "r4", cfg()).await;
        assert_eq!(after, before[..victim].to_vec());
        assert!(report.truncated_bytes >= len);
    });
}

/// Bit rot inside the already-indexed part of a segment is not a crash artifact and is
/// not scanned at open; the CRC check after every disk read refuses to serve it.
#[test]
fn corrupt_bytes_before_the_recovery_point_are_never_served() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        crashed_log_indexed(&dir, "rot", 40, cfg()).await;
        let path = seg(&dir, "rot", 0, "log");
        let (pos, len) = batch_positions(&path)[5];
        let mut data = std::fs::read(&path).unwrap();
        data[(pos + len - 3) as usize] ^= 0xff;
        std::fs::write(&path, &data).unwrap();
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("rot", cfg()).await.unwrap();
        let err = log.read(15, 1 << 20, None).await.unwrap_err();
        assert!(
            matches!(err, sluice_storage::Error::Corrupt { .. }),
            "{err}"
        );
        assert_eq!(
            batches_of(&log.read(0, 1, None).await.unwrap().records).len(),
            1
        );
    });
}

#[test]
fn r5_offsets_going_backwards_are_cut() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let before = crashed_log(&dir, "r5", 12, cfg()).await;
        let path = seg(&dir, "r5", 0, "log");
        let (pos, _) = batch_positions(&path)[11];
        let mut data = std::fs::read(&path).unwrap();
        // The base offset is outside the CRC: only the offset check can catch this.
        data[pos as usize..pos as usize + 8].copy_from_slice(&3i64.to_be_bytes());
        std::fs::write(&path, &data).unwrap();
        let (after, _, end) = reopen(&dir, "r5", cfg()).await;
        assert_eq!(after, before[..11].to_vec());
        assert_eq!(end, 33);
    });
}

#[test]
fn r6_missing_index_is_rebuilt_identically() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("r6", cfg()).await.unwrap();
        for i in 0..60 {
            log.append(&batch(i, 3, i as u64), 0).await.unwrap();
        }
        let before = read_all(&log).await;
        log.close().await.unwrap();
        drop(log);
        let idx = seg(&dir, "r6", 0, "index");
        let original = std::fs::read(&idx).unwrap();
        assert!(original.len() >= 16, "several index entries expected");
        std::fs::remove_file(&idx).unwrap();
        // As after a crash: the open recovers (a clean close's record skips that).
        std::fs::remove_file(dir.join("r6").join("partition.clean")).unwrap();
        let (after, report, _) = reopen(&dir, "r6", cfg()).await;
        assert_eq!(after, before);
        assert!(report.rebuilt_indexes >= 1);
        let rebuilt = std::fs::read(&idx).unwrap();
        assert_eq!(&rebuilt[..original.len()], &original[..]);
    });
}

#[test]
fn r7_index_entries_past_the_log_are_dropped() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("r7", cfg()).await.unwrap();
        for i in 0..60 {
            log.append(&batch(i, 3, i as u64), 0).await.unwrap();
        }
        let before = read_all(&log).await;
        log.close().await.unwrap();
        drop(log);
        let idx = seg(&dir, "r7", 0, "index");
        let mut bytes = std::fs::read(&idx).unwrap();
        // An entry pointing beyond the end, and one pointing mid-batch.
        bytes.extend_from_slice(&1000u32.to_be_bytes());
        bytes.extend_from_slice(&1_000_000u32.to_be_bytes());
        std::fs::write(&idx, &bytes).unwrap();
        std::fs::remove_file(dir.join("r7").join("partition.clean")).unwrap();
        let (after, report, _) = reopen(&dir, "r7", cfg()).await;
        assert_eq!(after, before);
        assert!(report.dropped_index_entries >= 1);
        let kept = sluice_storage::index::OffsetIndex::decode(&std::fs::read(&idx).unwrap());
        assert!(kept.entries().iter().all(|e| e.relative_offset != 1000));
        assert!(kept.len() >= bytes.len() / 8 - 1);
    });
}

#[test]
fn r8_garbage_index_keeps_its_increasing_prefix() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let before = crashed_log_indexed(&dir, "r8", 60, cfg()).await;
        let idx = seg(&dir, "r8", 0, "index");
        let mut bytes = std::fs::read(&idx).unwrap();
        let n = bytes.len();
        for b in &mut bytes[n / 2..] {
            *b = 0xee;
        }
        std::fs::write(&idx, &bytes).unwrap();
        let (after, report, _) = reopen(&dir, "r8", cfg()).await;
        assert_eq!(after, before);
        assert!(report.dropped_index_entries >= 1);
    });
}

#[test]
fn r9_missing_time_index_is_rebuilt() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        crashed_log_indexed(&dir, "r9", 60, cfg()).await;
        std::fs::remove_file(seg(&dir, "r9", 0, "timeindex")).unwrap();
        let s = storage(&dir, no_cache()).await;
        let (log, report) = s.open_log_with_report("r9", cfg()).await.unwrap();
        assert!(report.rebuilt_indexes >= 1);
        // Batch i holds offsets 3i..3i+2 at timestamps 1000+i+0..2: 1040 is first at 3*38+2.
        assert_eq!(
            log.offset_for_timestamp(1040).await.unwrap(),
            Some((116, 1040))
        );
        assert!(file_len(&seg(&dir, "r9", 0, "timeindex")) > 0);
    });
}

#[test]
fn r10_empty_segment_reopens_empty() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        drop(s.open_log("r10", cfg()).await.unwrap());
        let (after, _, end) = reopen(&dir, "r10", cfg()).await;
        assert!(after.is_empty());
        assert_eq!(end, 0);
    });
}

#[test]
fn r11_torn_closed_segment_drops_later_segments() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let config = LogConfig {
            segment_bytes: 2048,
            ..cfg()
        };
        let before = crashed_log(&dir, "r11", 80, config.clone()).await;
        let first = seg(&dir, "r11", 0, "log");
        let positions = batch_positions(&first);
        let kept = positions.len() - 2;
        let (pos, _) = positions[kept];
        let mut data = std::fs::read(&first).unwrap();
        data[pos as usize + 30] ^= 0x55;
        std::fs::write(&first, &data).unwrap();
        let segments_before = std::fs::read_dir(dir.join("r11"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".log")
            })
            .count();
        assert!(segments_before > 2);
        let (after, report, _) = reopen(&dir, "r11", config).await;
        assert_eq!(after, before[..kept].to_vec());
        assert_eq!(report.deleted_segments as usize, segments_before - 1);
    });
}

#[test]
fn r12_leftover_temp_and_orphan_index_files_are_removed() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let before = crashed_log(&dir, "r12", 5, cfg()).await;
        std::fs::write(
            dir.join("r12").join("00000000000000000000.index.tmp"),
            b"junk",
        )
        .unwrap();
        std::fs::write(seg(&dir, "r12", 777, "index"), b"junk").unwrap();
        let (after, report, _) = reopen(&dir, "r12", cfg()).await;
        assert_eq!(after, before);
        assert_eq!(report.removed_files, 2);
        assert!(!seg(&dir, "r12", 777, "index").exists());
    });
}

#[test]
fn r13_log_start_checkpoint_is_clamped_into_the_log() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        crashed_log(&dir, "r13", 5, cfg()).await;
        std::fs::write(
            dir.join("r13").join("partition.meta"),
            "log_start_offset=500\n",
        )
        .unwrap();
        let s = storage(&dir, StorageLimits::default()).await;
        let log = s.open_log("r13", cfg()).await.unwrap();
        assert_eq!(log.log_start_offset(), 15);
        assert_eq!(log.log_end_offset(), 15);
    });
}

#[test]
fn r14_no_segments_start_at_the_checkpoint() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        std::fs::create_dir_all(dir.join("r14")).unwrap();
        std::fs::write(
            dir.join("r14").join("partition.meta"),
            "log_start_offset=50\n",
        )
        .unwrap();
        let s = storage(&dir, StorageLimits::default()).await;
        let log = s.open_log("r14", cfg()).await.unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (50, 50));
        assert_eq!(
            log.append(&batch(1, 2, 0), 0).await.unwrap().base_offset,
            50
        );
        assert!(seg(&dir, "r14", 50, "log").exists());
    });
}

#[test]
fn r10_empty_segment_left_by_a_failed_roll_is_dropped() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let before = crashed_log(&dir, "r10b", 10, cfg()).await;
        // A roll created `<base 12>.log` and failed; the old segment kept growing.
        std::fs::write(seg(&dir, "r10b", 12, "log"), b"").unwrap();
        let (after, report, end) = reopen(&dir, "r10b", cfg()).await;
        assert_eq!(after, before);
        assert_eq!(end, 30);
        assert_eq!(report.deleted_segments, 1);
    });
}

// ---- producer state and the transaction index (R15–R19) ----

/// Appends, across many small segments, idempotent batches of three producers and
/// transactions (some aborted) of two more; flushes. Returns the log.
/// On a manual clock near the batches' timestamps (1000 + index), so that loading a
/// snapshot does not expire the producers (it would on the system clock: Kafka's rule).
async fn producer_log(dir: &Path, name: &str) -> std::rc::Rc<sluice_storage::PartitionLog> {
    let (s, _) = storage_at(dir, no_cache(), 10_000).await;
    let log = s.open_log(name, small_segments(1024)).await.unwrap();
    let mut seq = [0i32; 6];
    for round in 0..80usize {
        let pid = 1 + round % 5;
        let n = 1 + round % 3;
        let txn = pid >= 4;
        let b = producer_batch(pid as i64, 0, seq[pid], txn, n);
        seq[pid] += n as i32;
        log.append_judged(&b, 0).await.unwrap();
        if txn && round % 3 == 0 {
            log.append_marker(pid as i64, 0, round % 2 == 0, 0, 0)
                .await
                .unwrap();
        }
    }
    log.flush().await.unwrap();
    assert!(log.segment_count() >= 4, "{} segments", log.segment_count());
    assert!(!log.aborted_index().is_empty());
    log
}

fn snapshot_path(dir: &Path, name: &str, offset: i64) -> PathBuf {
    dir.join(name).join(format!("{offset:020}.snapshot"))
}

async fn reopen_producers(
    dir: &Path,
    name: &str,
) -> (std::rc::Rc<sluice_storage::PartitionLog>, RecoveryReport) {
    let (s, _) = storage_at(dir, no_cache(), 10_000).await;
    let (log, report) = s
        .open_log_with_report(name, small_segments(1024))
        .await
        .unwrap();
    // Whatever recovery loaded, the state and the index are what a full replay gives.
    let (state, aborted) = replayed(&log).await;
    assert_eq!(log.producer_state(), state);
    assert_eq!(log.aborted_index(), aborted);
    (log, report)
}

/// Batches in the active segment of `log`.
async fn active_batches(log: &sluice_storage::PartitionLog) -> u64 {
    let base = *log.segment_bases().last().unwrap();
    let mut n = 0;
    for (_, chunk) in read_chunks(log).await {
        n += sluice_storage::batch::stored_batches(&chunk)
            .filter(|(h, _)| h.base_offset >= base)
            .count() as u64;
    }
    n
}

#[test]
fn r15_damaged_txnindex_is_rebuilt_from_the_log() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let (index, victim) = {
            let log = producer_log(&dir, "r15").await;
            let index = log.aborted_index();
            let bases = log.segment_bases();
            // A closed segment holding an abort.
            let victim = *bases[..bases.len() - 1]
                .iter()
                .find(|b| seg(&dir, "r15", **b, "txnindex").exists())
                .expect("a closed segment with aborted transactions");
            log.close().await.unwrap();
            (index, victim)
        };
        let path = seg(&dir, "r15", victim, "txnindex");
        let original = std::fs::read(&path).unwrap();
        let mut damaged = original.clone();
        damaged.extend_from_slice(&[0xee; 40]);
        std::fs::write(&path, &damaged).unwrap();
        let (log, report) = reopen_producers(&dir, "r15").await;
        assert!(report.dropped_txn_entries >= 1, "{report:?}");
        assert!(
            report.producer_snapshot.is_none_or(|o| o <= victim),
            "{report:?}"
        );
        assert_eq!(log.aborted_index(), index);
        assert_eq!(std::fs::read(&path).unwrap(), original, "rewritten");
    });
}

#[test]
fn r16_snapshot_present_bounds_the_replay() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let active = {
            let log = producer_log(&dir, "r16").await;
            *log.segment_bases().last().unwrap()
            // Dropped without closing: a crash after the last roll's snapshot.
        };
        assert!(snapshot_path(&dir, "r16", active).exists());
        let (log, report) = reopen_producers(&dir, "r16").await;
        assert_eq!(report.producer_snapshot, Some(active));
        assert_eq!(report.replayed_batches, active_batches(&log).await);
        assert_eq!(report.deleted_snapshots, 0);
    });
}

#[test]
fn r17_corrupt_snapshot_falls_back_to_an_older_one() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let bases = {
            let log = producer_log(&dir, "r17").await;
            log.segment_bases()
        };
        let newest = bases[bases.len() - 1];
        let older = bases[bases.len() - 2];
        let path = snapshot_path(&dir, "r17", newest);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        let (_, report) = reopen_producers(&dir, "r17").await;
        assert_eq!(report.deleted_snapshots, 1);
        assert_eq!(report.producer_snapshot, Some(older));
        // The replay began below the active segment: a fresh snapshot at its base.
        assert!(path.exists());
        assert_ne!(std::fs::read(&path).unwrap(), bytes);
    });
}

#[test]
fn r18_snapshot_above_a_torn_tail_is_deleted() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let (active, end) = {
            let log = producer_log(&dir, "r18").await;
            log.close().await.unwrap();
            (*log.segment_bases().last().unwrap(), log.log_end_offset())
        };
        // Closing snapshotted the end; then the last batch is torn (its bytes were
        // never durable after all, as far as this test pretends).
        assert!(snapshot_path(&dir, "r18", end).exists());
        let path = seg(&dir, "r18", active, "log");
        let (pos, len) = *batch_positions(&path).last().unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(pos + len / 2)
            .unwrap();
        let (log, report) = reopen_producers(&dir, "r18").await;
        assert!(log.log_end_offset() < end);
        assert_eq!(report.deleted_snapshots, 1);
        assert!(!snapshot_path(&dir, "r18", end).exists());
        assert_eq!(report.producer_snapshot, Some(active));
    });
}

#[test]
fn r19_no_snapshot_replays_from_the_log_start() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let active = {
            let log = producer_log(&dir, "r19").await;
            *log.segment_bases().last().unwrap()
        };
        for e in std::fs::read_dir(dir.join("r19")).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "snapshot") {
                std::fs::remove_file(p).unwrap();
            }
        }
        let (log, report) = reopen_producers(&dir, "r19").await;
        assert_eq!(report.producer_snapshot, None);
        let all: usize = read_chunks(&log)
            .await
            .iter()
            .map(|(_, c)| sluice_storage::batch::stored_batches(c).count())
            .sum();
        assert_eq!(report.replayed_batches, all as u64);
        // The next recovery will only replay the active segment.
        assert_eq!(log.snapshot_offsets(), vec![active]);
    });
}
