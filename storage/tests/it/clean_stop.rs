//! A clean stop at scale (issue 14): `Storage::close_logs` closes every log of a shard in
//! rounds, with one file-system sync per round instead of several syncs per log, and
//! leaves every log marked clean, so the next start opens each without recovery. An
//! idle log's close (the descriptor budget's) does only the file work it needs: no sync
//! of bytes already durable, no index file for an index without entries.

use std::path::Path;

use crate::common::*;
use sluice_storage::fault::{self, FaultOp, FaultRule};
use sluice_storage::{simdisk, LogConfig};

/// More than one round of `close_logs` (1,024 logs a round).
const LOGS: usize = 1_030;

fn name(i: usize) -> String {
    format!("p-{i}")
}

fn config() -> LogConfig {
    LogConfig {
        index_interval_bytes: 128,
        ..LogConfig::default()
    }
}

/// Opens `LOGS` logs in `dir`, appends to most of them (a record each, several to every
/// seventh so that its indexes have entries, none to every eleventh), closes the idle
/// files of every fifth as the descriptor budget would, and returns what each holds.
async fn fill(dir: &Path) -> Vec<Vec<(i64, Vec<u8>)>> {
    let s = storage(dir, no_cache()).await;
    let mut logs = Vec::new();
    let mut want = Vec::new();
    for i in 0..LOGS {
        let log = s.open_log(&name(i), config()).await.unwrap();
        let n = match i {
            _ if i % 11 == 0 => 0,
            _ if i % 7 == 0 => 40,
            _ => 1,
        };
        for k in 0..n {
            log.append(&batch(1_000 + k as i64, 2, (i * 100 + k) as u64), 0)
                .await
                .unwrap();
        }
        log.flush().await.unwrap();
        if i % 5 == 0 && n > 0 {
            assert!(log.deactivate().await.unwrap());
        }
        want.push(read_all(&log).await);
        logs.push(log);
    }
    let report = s.close_logs(logs).await;
    let failed: Vec<_> = report
        .failed
        .iter()
        .map(|(l, e)| format!("{l}: {e}"))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(report.marked_clean, LOGS, "{report:?}");
    // Two rounds, and one more sync for the last round's records.
    assert_eq!(report.fs_syncs, 3, "{report:?}");
    want
}

#[test]
fn a_clean_stop_marks_every_log_clean_and_the_restart_recovers_none() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let want = {
        let dir = dir.clone();
        run(move || async move { fill(&dir).await })
    };
    for i in 0..LOGS {
        assert!(
            dir.join(name(i)).join("partition.clean").exists(),
            "{} has its record",
            name(i)
        );
    }
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let mut logs = Vec::new();
        for i in 0..LOGS {
            let (log, report) = s.open_log_with_report(&name(i), config()).await.unwrap();
            assert_eq!(report.truncated_bytes, 0, "{}: {report:?}", name(i));
            assert_eq!(report.replayed_batches, 0, "{}: {report:?}", name(i));
            logs.push(log);
        }
        assert_eq!(s.logs_opened(), (LOGS as u64, 0), "every log opened clean");
        for (i, log) in logs.iter().enumerate() {
            assert_eq!(read_all(log).await, want[i], "{}", name(i));
        }
        // Appends go on after the lazily read segments, and a second stop is clean too.
        for log in &logs {
            let end = log.log_end_offset();
            assert_eq!(
                log.append(&batch(9, 1, 9), 0).await.unwrap().base_offset,
                end
            );
        }
        let report = s.close_logs(logs).await;
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert_eq!(report.marked_clean, LOGS);
    });
}

/// A log whose record cannot be written is failed and left without one; the others are
/// marked clean, and the failed one is recovered at its next open with every record.
#[test]
fn a_log_whose_close_fails_is_recovered_and_the_others_are_clean() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let bad = dir
        .join("bad")
        .join("partition.clean")
        .display()
        .to_string();
    let want = {
        let dir = dir.clone();
        let bad = bad.clone();
        run(move || async move {
            let s = storage(&dir, no_cache()).await;
            let mut logs = Vec::new();
            let mut want = Vec::new();
            for n in ["a", "bad", "c"] {
                let log = s.open_log(n, config()).await.unwrap();
                for k in 0..3 {
                    log.append(&batch(1 + k, 2, k as u64), 0).await.unwrap();
                }
                log.flush().await.unwrap();
                want.push(read_all(&log).await);
                logs.push(log);
            }
            fault::arm(FaultRule {
                op: FaultOp::Write,
                errno: 5,
                path_contains: bad.clone(),
            });
            let report = s.close_logs(logs.clone()).await;
            fault::disarm(&bad);
            assert_eq!(report.marked_clean, 2, "{report:?}");
            assert_eq!(report.failed.len(), 1, "{report:?}");
            assert_eq!(report.failed[0].0, "bad");
            assert!(
                logs[1].failure().is_some(),
                "the failed close fails the log"
            );
            want
        })
    };
    assert!(!Path::new(&bad).exists());
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        for (i, n) in ["a", "bad", "c"].into_iter().enumerate() {
            let log = s.open_log(n, config()).await.unwrap();
            assert_eq!(read_all(&log).await, want[i], "{n}");
        }
        assert_eq!(s.logs_opened(), (2, 1));
    });
}

/// Closing an idle log's files when its bytes are durable already syncs nothing, and an
/// index without entries is not written; the `.log` is trimmed to its logical length
/// (no preallocated space kept). Before, each such close sealed the `.log` (trim and
/// fdatasync) and wrote both index files atomically (two syncs each, a rename and a
/// directory sync).
#[test]
fn an_idle_close_of_a_durable_log_syncs_nothing_and_writes_no_empty_index() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        simdisk::enable();
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("idle", LogConfig::default()).await.unwrap();
        log.append(&batch(1, 2, 1), 0).await.unwrap();
        log.flush().await.unwrap();
        let want = read_all(&log).await;
        let (base, size) = log.active_segment();
        let syncs = simdisk::syncs();
        assert!(log.deactivate().await.unwrap());
        assert_eq!(simdisk::syncs(), syncs, "no sync for durable bytes");
        let seg = |ext: &str| dir.join("idle").join(format!("{base:020}.{ext}"));
        assert!(!seg("index").exists() && !seg("timeindex").exists());
        assert_eq!(
            std::fs::metadata(seg("log")).unwrap().len(),
            size,
            "trimmed"
        );
        // Reopened on demand by the next append; a close then writes the indexes.
        log.append(&batch(2, 2, 2), 0).await.unwrap();
        log.flush().await.unwrap();
        log.close().await.unwrap();
        assert!(seg("timeindex").exists());
        simdisk::disable();
        drop(log);
        let log = s.open_log("idle", LogConfig::default()).await.unwrap();
        let all = read_all(&log).await;
        assert_eq!(all[..want.len()], want[..]);
        assert_eq!(all.len(), want.len() + 1, "and the batch appended after");
    });
}
