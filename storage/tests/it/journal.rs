//! The shard journal (`sluice_storage::wal`, issue 40): appends of many logs become
//! durable through one sequential write-through stream, with no fdatasync, and every
//! acknowledged one survives a crash that drops what was not synced (the crash
//! simulation); checkpoints delete chunks whose records the segment files hold; a clean
//! stop leaves no journal to replay; a deleted log's records never reach a new log of
//! the same name. The crash property test (`crash.rs`) runs a third of its cases with
//! the journal, small chunks included.

use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::common::*;
use sluice_storage::simdisk::{self, CrashMode};
use sluice_storage::{wal, LogConfig, PartitionLog, Storage, StorageLimits};

/// An acknowledged append: the log's index, its base offset, its batch past the header.
type Acked = (usize, i64, Vec<u8>);

fn journal(chunk_bytes: u64) -> StorageLimits {
    StorageLimits {
        journal_chunk_bytes: chunk_bytes,
        // No write-through segment logs: every durable write here is the journal's.
        dsync_logs_max: 0,
        ..no_cache()
    }
}

/// Opens `names` in `s` with the default config.
async fn open_all(s: &Rc<Storage>, names: &[String]) -> Vec<Rc<PartitionLog>> {
    let mut logs = Vec::with_capacity(names.len());
    for n in names {
        logs.push(s.open_log(n, LogConfig::default()).await.unwrap());
    }
    logs
}

/// Reopens `names` in `dir` (a new process: the journal's replay, then recovery) and
/// returns each log's batches.
fn recover_all(dir: std::path::PathBuf, names: Vec<String>) -> Vec<Vec<(i64, Vec<u8>)>> {
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let mut out = Vec::new();
        for n in &names {
            let log = s.open_log(n, LogConfig::default()).await.expect("recovery");
            out.push(read_all(&log).await);
        }
        out
    })
}

#[test]
fn appends_to_many_logs_share_journal_writes_and_survive_a_crash() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let names: Vec<String> = (0..200).map(|i| format!("t-{i}")).collect();
    let (acked, writes, syncs) = {
        let (dir, names) = (dir.clone(), names.clone());
        run(move || async move {
            simdisk::enable();
            let s = storage(&dir, journal(64 << 20)).await;
            let logs = open_all(&s, &names).await;
            let before = simdisk::syncs();
            let acked: Vec<Acked> = each_log_at_once(&logs, |i, log| async move {
                let b = batch(1_000, 1 + i % 3, i as u64);
                let info = log.append(&b, 0).await.unwrap();
                log.flush_for_ack().await.unwrap();
                let (_, body) = batches_of(&b).remove(0);
                (i, info.base_offset, body)
            })
            .await;
            let writes = s.journal().expect("a journal").active_writes();
            let syncs = simdisk::syncs() - before;
            simdisk::crash(CrashMode::LoseUnsynced).await;
            (acked, writes, syncs)
        })
    };
    assert_eq!(acked.len(), 200, "every append was acknowledged");
    assert_eq!(syncs, 0, "acknowledging journaled appends took fdatasyncs");
    assert!(
        writes <= 50,
        "{writes} journal writes for 200 concurrent appends to 200 logs: rounds are not shared"
    );
    let got = recover_all(dir, names);
    for (i, base, body) in acked {
        assert_eq!(
            got[i],
            vec![(base, body)],
            "log t-{i} lost its acknowledged append"
        );
    }
}

#[test]
fn checkpoints_delete_chunks_and_a_crash_after_them_loses_nothing_acknowledged() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let (acked, chunks_left) = {
        let dir = dir.clone();
        run(move || async move {
            simdisk::enable();
            let s = storage(&dir, journal(16 << 10)).await;
            let log = s.open_log("c", LogConfig::default()).await.unwrap();
            let mut acked = Vec::new();
            for i in 0..300u64 {
                let b = batch(1_000, 4, i);
                let info = log.append(&b, 0).await.unwrap();
                log.flush_for_ack().await.unwrap();
                acked.push((info.base_offset, batches_of(&b).remove(0).1));
            }
            // ~100 KiB through 16 KiB chunks: the checkpoints delete all but the last
            // few (bounded wait, they run in the background).
            let jdir = s.journal().unwrap().dir().to_path_buf();
            let deadline = Instant::now() + Duration::from_secs(20);
            let left = loop {
                let left = wal::chunks_in(&jdir).unwrap().len();
                if left <= wal::CLOSED_CHUNKS_MAX + 1 || Instant::now() > deadline {
                    break left;
                }
                glommio::timer::sleep(Duration::from_millis(5)).await;
            };
            simdisk::crash(CrashMode::Torn { seed: 7 }).await;
            (acked, left)
        })
    };
    assert!(
        chunks_left <= wal::CLOSED_CHUNKS_MAX + 1,
        "{chunks_left} journal chunks left: checkpoints did not delete them"
    );
    let got = recover_all(dir, vec!["c".into()]).remove(0);
    assert_eq!(got, acked, "the log after checkpoints and a crash");
}

/// A start-up replay writes each log's journaled batches to its segment file together,
/// not one write per batch, also with more logs than its lanes and an active-log budget
/// smaller than its lanes; every acknowledged batch is there after it.
#[test]
fn a_replay_writes_each_logs_batches_together() {
    const LOGS: usize = 100;
    const BATCHES: u64 = 30;
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let names: Vec<String> = (0..LOGS).map(|i| format!("r-{i}")).collect();
    let acked = {
        let (dir, names) = (dir.clone(), names.clone());
        run(move || async move {
            simdisk::enable();
            let s = storage(&dir, journal(64 << 20)).await;
            let logs = open_all(&s, &names).await;
            let mut acked = vec![Vec::new(); LOGS];
            for round in 0..BATCHES {
                let appended = each_log_at_once(&logs, |i, log| async move {
                    let b = batch(100, 1, round * LOGS as u64 + i as u64);
                    let info = log.append(&b, 0).await.unwrap();
                    log.flush_for_ack().await.unwrap();
                    (info.base_offset, batches_of(&b).remove(0).1)
                })
                .await;
                for (i, a) in appended.into_iter().enumerate() {
                    acked[i].push(a);
                }
            }
            // The segment files lose what the journal holds for them.
            simdisk::crash(CrashMode::LoseUnsynced).await;
            acked
        })
    };
    let writes = {
        let dir = dir.clone();
        run(move || async move {
            simdisk::enable();
            let before = simdisk::writes();
            let limits = StorageLimits {
                active_logs_max: 4,
                ..journal(64 << 20)
            };
            let s = storage(&dir, limits).await;
            drop(s);
            simdisk::writes() - before
        })
    };
    // A log's 30 batches in one or two segment writes (the close's small files do not
    // go through `AppendFile`); waited for one by one they were 30 writes.
    assert!(
        writes <= 2 * LOGS as u64,
        "{writes} segment writes to replay {BATCHES} batches into each of {LOGS} logs"
    );
    let got = recover_all(dir, names);
    for (i, want) in acked.into_iter().enumerate() {
        assert_eq!(got[i].len(), BATCHES as usize, "log r-{i} after the replay");
        assert_eq!(got[i], want, "log r-{i} after the replay");
    }
}

#[test]
fn a_clean_stop_leaves_no_journal_and_the_restart_replays_nothing() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let jdir = wal::dir_of(&dir, 0);
    {
        let dir = dir.clone();
        run(move || async move {
            let s = storage(&dir, journal(64 << 20)).await;
            let log = s.open_log("s", LogConfig::default()).await.unwrap();
            for i in 0..20 {
                log.append(&batch(1_000, 2, i), 0).await.unwrap();
                log.flush_for_ack().await.unwrap();
            }
            let report = s.close_logs(vec![log]).await;
            assert!(report.failed.is_empty());
            s.stop_journal().await.unwrap();
        });
    }
    assert_eq!(
        wal::chunks_in(&jdir).unwrap().len(),
        0,
        "a clean stop left journal chunks"
    );
    let got = recover_all(dir, vec!["s".into()]).remove(0);
    assert_eq!(got.len(), 20);
}

#[test]
fn a_deleted_logs_records_never_reach_a_new_log_of_the_same_name() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let fresh = batch(2_000, 1, 99);
    {
        let (dir, fresh) = (dir.clone(), fresh.clone());
        run(move || async move {
            simdisk::enable();
            let s = storage(&dir, journal(64 << 20)).await;
            let old = s.open_log("d", LogConfig::default()).await.unwrap();
            for i in 0..5 {
                old.append(&batch(1_000, 3, i), 0).await.unwrap();
                old.flush_for_ack().await.unwrap();
            }
            s.delete_log(&old).await.unwrap();
            let new = s.open_log("d", LogConfig::default()).await.unwrap();
            new.append(&fresh, 0).await.unwrap();
            new.flush_for_ack().await.unwrap();
            simdisk::crash(CrashMode::LoseUnsynced).await;
        });
    }
    let got = recover_all(dir, vec!["d".into()]).remove(0);
    assert_eq!(
        got,
        vec![(0, batches_of(&fresh).remove(0).1)],
        "the new log holds exactly its own record"
    );
}

/// A log's journaled bytes reach its segment file only once the log has had no append
/// for the idle time (before the checkpoint), and then without another append.
#[test]
fn an_idle_logs_segment_file_is_written_behind_the_journal() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, journal(64 << 20)).await;
        let log = s.open_log("idle", LogConfig::default()).await.unwrap();
        let b = batch(1_000, 2, 7);
        log.append(&b, 0).await.unwrap();
        log.flush_for_ack().await.unwrap();
        let (_, body) = batches_of(&b).remove(0);
        let segment = dir.join("idle").join(format!("{:020}.log", 0));
        let on_disk = |body: &[u8]| {
            let bytes = std::fs::read(&segment).unwrap();
            bytes.windows(body.len()).any(|w| w == body)
        };
        // Waits (bounded) until `body` is in the segment file.
        let reaches_file = |body: Vec<u8>, what: &'static str| async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !on_disk(&body) {
                assert!(
                    Instant::now() < deadline,
                    "{what} never reached its segment file"
                );
                glommio::timer::sleep(Duration::from_millis(5)).await;
            }
        };
        let j = s.journal().expect("a journal");
        let now = s.now_ms();
        // Appended just now: not idle, so its bytes wait (well under the write-behind size).
        j.write_behind_idle(now, wal::IDLE_WRITE_BEHIND_MS);
        glommio::timer::sleep(Duration::from_millis(50)).await;
        assert!(!on_disk(&body), "written behind before the log was idle");
        // Idle: written behind, with no further append.
        j.write_behind_idle(now + wal::IDLE_WRITE_BEHIND_MS, wal::IDLE_WRITE_BEHIND_MS);
        reaches_file(body.to_vec(), "an idle log's append").await;
        // Written behind once, it is watched again from its next append on.
        let b2 = batch(1_000, 2, 8);
        log.append(&b2, 0).await.unwrap();
        log.flush_for_ack().await.unwrap();
        let (_, body2) = batches_of(&b2).remove(0);
        let later = s.now_ms();
        j.write_behind_idle(later + wal::IDLE_WRITE_BEHIND_MS, wal::IDLE_WRITE_BEHIND_MS);
        reaches_file(
            body2.to_vec(),
            "the next append of a log written behind before",
        )
        .await;
    });
}

/// Batches over the journal's limit are written and synced in their segment file while
/// the log has no records in the journal; once it has, every append of it is journaled
/// (a replay must not put a journaled change after an append the journal did not see).
/// A log that mixes both loses nothing acknowledged in a crash that drops what was not
/// synced.
#[test]
fn large_batches_bypass_the_journal_and_mixed_appends_survive_a_crash() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let acked = {
        let dir = dir.clone();
        run(move || async move {
            simdisk::enable();
            let limits = StorageLimits {
                journal_batch_max: 2_000,
                ..journal(64 << 20)
            };
            let s = storage(&dir, limits).await;
            let log = s.open_log("m", LogConfig::default()).await.unwrap();
            let mut acked = Vec::new();
            let mut journal_writes = Vec::new();
            for i in 0..20u64 {
                // Six ~4 KB batches (over the limit: direct), then small and large
                // alternate from a small one on (all journaled: the log has records
                // in the journal from the first small one).
                let large = i < 5 || i % 2 == 1;
                let b = batch(1_000, if large { 300 } else { 2 }, i);
                assert_eq!(b.len() > 2_000, large);
                let before = s.journal().unwrap().active_writes();
                let info = log.append(&b, 0).await.unwrap();
                log.flush_for_ack().await.unwrap();
                journal_writes.push(s.journal().unwrap().active_writes() - before);
                acked.push((info.base_offset, batches_of(&b).remove(0).1));
            }
            assert!(
                journal_writes[..6].iter().all(|w| *w == 0)
                    && journal_writes[6..].iter().all(|w| *w > 0),
                "journal writes per append: {journal_writes:?}"
            );
            simdisk::crash(CrashMode::LoseUnsynced).await;
            acked
        })
    };
    let got = recover_all(dir, vec!["m".into()]).remove(0);
    assert_eq!(
        got, acked,
        "the log after a crash, direct and journaled appends"
    );
}
