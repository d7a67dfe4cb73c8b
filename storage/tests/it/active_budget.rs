//! The shard's descriptor budget (`StorageLimits::active_logs_max`): at most that many
//! logs keep their active segment's files open; appending to another first closes the
//! least recently appended idle one, whose next append reopens it. Nothing appended is
//! lost or reordered across the close and reopen, reads are served meanwhile, a roll and
//! a truncation of a closed log work, and a restart recovers every log.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use crate::common::*;
use sluice_storage::{stats, LogConfig, PartitionLog, StorageLimits};

/// The tests of this file run one at a time: one of them counts the process's open
/// descriptors, which another's files would disturb.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn limits(active: usize) -> StorageLimits {
    StorageLimits {
        active_logs_max: active,
        open_segment_files_max: 4,
        ..no_cache()
    }
}

#[test]
fn active_files_stay_within_the_budget_and_nothing_is_lost() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const LOGS: usize = 40;
    const BUDGET: usize = 5;
    const ROUNDS: usize = 6;
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, limits(BUDGET)).await;
        let before = open_descriptors();
        let mut logs: Vec<Rc<PartitionLog>> = Vec::new();
        for i in 0..LOGS {
            logs.push(
                s.open_log(&format!("t-{i}"), small_segments(4096))
                    .await
                    .unwrap(),
            );
            assert!(
                s.active_logs() <= BUDGET,
                "{} logs open after opening {i}",
                s.active_logs()
            );
        }
        let mut want: Vec<Vec<Vec<u8>>> = vec![Vec::new(); LOGS];
        for round in 0..ROUNDS {
            for (i, log) in logs.iter().enumerate() {
                let b = batch(1000 + round as i64, 3, (round * LOGS + i) as u64);
                log.append(&b, 0).await.unwrap();
                log.flush().await.unwrap();
                want[i].push(b);
                assert!(s.active_logs() <= BUDGET, "{} logs open", s.active_logs());
            }
            // Reads of logs whose files were closed.
            let got = read_all(&logs[0]).await;
            assert_eq!(got.len(), want[0].len());
        }
        // One descriptor per open log (its active segment's `.log`: the indexes are
        // not held open), plus read handles: bounded by the budget, not by the number
        // of logs.
        let used = open_descriptors().saturating_sub(before);
        assert!(used <= BUDGET + 4 + 8, "{used} descriptors for {LOGS} logs");
        for (i, log) in logs.iter().enumerate() {
            let got = read_all(log).await;
            let expect: Vec<Vec<u8>> = want[i]
                .iter()
                .flat_map(|b| batches_of(b))
                .map(|(_, v)| v)
                .collect();
            let values: Vec<Vec<u8>> = got.into_iter().map(|(_, v)| v).collect();
            assert_eq!(values, expect, "log {i}");
            assert_eq!(log.log_end_offset(), (ROUNDS * 3) as i64);
        }
        // A roll and a truncation of a log whose files are closed.
        logs[1].deactivate().await.unwrap();
        logs[1].roll().await.unwrap();
        logs[1].append(&batch(2000, 2, 9999), 0).await.unwrap();
        logs[1].flush().await.unwrap();
        assert_eq!(logs[1].log_end_offset(), (ROUNDS * 3 + 2) as i64);
        logs[2].deactivate().await.unwrap();
        logs[2].truncate_to(3).await.unwrap();
        assert_eq!(logs[2].log_end_offset(), 3);
        logs[2].append(&batch(3000, 1, 7777), 0).await.unwrap();
        logs[2].flush().await.unwrap();
        assert_eq!(logs[2].log_end_offset(), 4);
        let ends: Vec<i64> = logs.iter().map(|l| l.log_end_offset()).collect();
        // Logs left with closed files and logs with open ones restart alike.
        for log in &logs {
            log.close().await.unwrap();
        }
        drop(logs);
        let s = storage(&dir, limits(BUDGET)).await;
        for (i, end) in ends.iter().enumerate() {
            let log = s
                .open_log(&format!("t-{i}"), LogConfig::default())
                .await
                .unwrap();
            assert_eq!(log.log_end_offset(), *end, "log {i} after restart");
            let got = read_all(&log).await;
            assert_eq!(
                got.last().map(|(o, _)| *o),
                Some(
                    *end - if i == 1 {
                        2
                    } else if i == 2 {
                        1
                    } else {
                        3
                    }
                )
            );
            assert!(s.active_logs() <= BUDGET);
        }
    });
}

/// Appends to many more logs than the budget all at once (a produce spread over
/// thousands of partitions): each reopen waits for a close to finish rather than
/// opening past the budget, and nothing is lost.
#[test]
fn concurrent_reopens_wait_for_closes_and_stay_within_the_budget() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const LOGS: usize = 64;
    const BUDGET: usize = 4;
    const ROUNDS: usize = 3;
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, limits(BUDGET)).await;
        let mut logs: Vec<Rc<PartitionLog>> = Vec::new();
        for i in 0..LOGS {
            logs.push(
                s.open_log(&format!("c-{i}"), small_segments(1 << 20))
                    .await
                    .unwrap(),
            );
        }
        for round in 0..ROUNDS {
            let tasks: Vec<_> = logs
                .iter()
                .enumerate()
                .map(|(i, log)| {
                    let b = batch(1000 + round as i64, 2, (round * LOGS + i) as u64);
                    let log = log.clone();
                    glommio::spawn_local(async move {
                        log.append(&b, 0).await.unwrap();
                        log.flush().await.unwrap();
                    })
                })
                .collect();
            for t in tasks {
                t.await;
            }
            assert!(
                s.active_logs_peak() <= BUDGET,
                "{} logs had open files at once (budget {BUDGET})",
                s.active_logs_peak()
            );
        }
        let ends: Vec<i64> = logs.iter().map(|l| l.log_end_offset()).collect();
        assert!(
            ends.iter().all(|e| *e == (ROUNDS * 2) as i64),
            "log ends {ends:?}"
        );
        for (i, log) in logs.iter().enumerate() {
            assert_eq!(
                read_all(log).await.len(),
                ROUNDS,
                "log {i}: one batch per round"
            );
        }
    });
}

/// A log closed to save descriptors holds no preallocated space.
#[test]
fn closing_an_idle_log_trims_its_preallocation() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, limits(1)).await;
        let a = s.open_log("a-0", LogConfig::default()).await.unwrap();
        a.append(&batch(1, 1, 1), 0).await.unwrap();
        a.flush().await.unwrap();
        let seg = dir.join("a-0").join(format!("{:020}.log", 0));
        let len_open = std::fs::metadata(&seg).unwrap().len();
        let b = s.open_log("b-0", LogConfig::default()).await.unwrap();
        b.append(&batch(1, 1, 2), 0).await.unwrap();
        assert_eq!(s.active_logs(), 1);
        let len_closed = std::fs::metadata(&seg).unwrap().len();
        let logical = read_chunks(&a)
            .await
            .iter()
            .map(|(_, b)| b.len() as u64)
            .sum::<u64>();
        assert_eq!(len_closed, logical, "closed segment trimmed to its records");
        assert!(len_open >= len_closed);
    });
}

/// Beyond its own share a shard takes places from the process's shared pool, and gives
/// them back as its logs close; a shard that finds the pool empty closes its own idle
/// logs instead, and nothing appended is lost either way.
#[test]
fn shards_share_a_pool_beyond_their_own_budgets() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const OWN: usize = 2;
    const POOL: usize = 4;
    let (da, db) = (tempdir(), tempdir());
    let (dir_a, dir_b) = (da.path().to_path_buf(), db.path().to_path_buf());
    run(move || async move {
        let pool = sluice_storage::DescriptorPool::new(POOL);
        let a = storage(&dir_a, limits(OWN)).await;
        let b = storage(&dir_b, limits(OWN)).await;
        a.share_descriptors(pool.clone());
        b.share_descriptors(pool.clone());
        assert_eq!(a.active_logs_allowed(), OWN + POOL);
        let open = |s: Rc<sluice_storage::Storage>, n: usize| async move {
            let mut logs = Vec::new();
            for i in 0..n {
                logs.push(
                    s.open_log(&format!("t-{i}"), LogConfig::default())
                        .await
                        .unwrap(),
                );
            }
            logs
        };
        let logs_a = open(a.clone(), 8).await;
        let logs_b = open(b.clone(), 4).await;
        // Opening holds no descriptor; the first append opens the files.
        for (i, log) in logs_a.iter().enumerate() {
            log.append(&batch(1, 2, i as u64), 0).await.unwrap();
            log.flush().await.unwrap();
        }
        assert_eq!(
            a.active_logs(),
            OWN + POOL,
            "a uses its own share and the whole pool"
        );
        assert_eq!(pool.taken(), POOL);
        for (i, log) in logs_b.iter().enumerate() {
            log.append(&batch(1, 2, 100 + i as u64), 0).await.unwrap();
            log.flush().await.unwrap();
            assert!(
                b.active_logs() <= OWN,
                "b is held to its own share while the pool is empty"
            );
        }
        assert_eq!(pool.taken(), POOL);
        // a's logs close: the pool is whole again, and b can take from it.
        for log in &logs_a {
            log.close().await.unwrap();
        }
        assert_eq!(pool.taken(), 0);
        for (i, log) in logs_b.iter().enumerate() {
            log.append(&batch(10, 1, 200 + i as u64), 0).await.unwrap();
            log.flush().await.unwrap();
        }
        assert_eq!(b.active_logs(), 4);
        assert_eq!(pool.taken(), 4 - OWN);
        for log in &logs_b {
            assert_eq!(log.log_end_offset(), 3);
            assert_eq!(read_all(log).await.len(), 2, "both batches read back");
            log.close().await.unwrap();
        }
        assert_eq!(pool.taken(), 0);
    });
}

/// More logs flushing at once than the shard lets into the kernel together (its
/// device-op limit, 64): the writes wait their turn, the syncs past the first few
/// share `syncfs` rounds (fewer rounds than the file syncs they make), and every log's
/// appends are durable and read back whole.
#[test]
fn many_logs_flushing_at_once_take_turns_and_lose_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const LOGS: usize = 200;
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, limits(LOGS)).await;
        let mut logs = Vec::new();
        for i in 0..LOGS {
            logs.push(
                s.open_log(&format!("t-{i}"), LogConfig::default())
                    .await
                    .unwrap(),
            );
        }
        let rounds_before = stats::FS_SYNC_ROUNDS.load(Ordering::Relaxed);
        let files_before = stats::FS_SYNC_FILES.load(Ordering::Relaxed);
        for round in 0..3u64 {
            each_log_at_once(&logs, |i, log| async move {
                log.append(&batch(1, 2, round * 1000 + i as u64), 0)
                    .await
                    .unwrap();
                log.flush().await.unwrap();
            })
            .await;
        }
        for log in &logs {
            assert_eq!(log.log_end_offset(), 6);
        }
        let rounds = stats::FS_SYNC_ROUNDS.load(Ordering::Relaxed) - rounds_before;
        let files = stats::FS_SYNC_FILES.load(Ordering::Relaxed) - files_before;
        assert!(rounds > 0, "some syncs went to shared rounds");
        assert!(
            files > rounds,
            "{files} file syncs shared {rounds} rounds: a round stands in for several"
        );
        for log in &logs {
            log.close().await.unwrap();
        }
        drop(logs);
        let s = storage(&dir, limits(LOGS)).await;
        for i in 0..LOGS {
            let log = s
                .open_log(&format!("t-{i}"), LogConfig::default())
                .await
                .unwrap();
            assert_eq!(
                read_all(&log).await.len(),
                3,
                "log {i}: its three batches after reopen"
            );
        }
    });
}
