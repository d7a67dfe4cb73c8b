//! Idempotent-producer state in the log (`PartitionLog::append_checked`): retries of a
//! batch already in the log are answered with its offsets and not appended again,
//! gaps and stale epochs are refused, and the state survives a reopen (rebuilt from
//! the log), follows replicated appends and forgets what a truncation removed.

use crate::common::*;
use sluice_storage::batch::build;
use sluice_storage::producer::SequenceError;
use sluice_storage::{Checked, Error, LogConfig, StorageLimits};

/// A batch of `n` records of producer `pid` at `epoch`, first sequence `seq`.
fn idempotent(pid: i64, epoch: i16, seq: i32, n: usize) -> Vec<u8> {
    let mut b = build::simple(1_000, n, 10);
    b[43..51].copy_from_slice(&pid.to_be_bytes());
    b[51..53].copy_from_slice(&epoch.to_be_bytes());
    b[53..57].copy_from_slice(&seq.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

fn appended(c: Checked) -> i64 {
    match c {
        Checked::Appended(info) => info.base_offset,
        Checked::Duplicate(d) => panic!("unexpected duplicate of {d:?}"),
    }
}

#[test]
fn retries_are_answered_with_the_original_offsets_also_after_a_reopen() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let log = s.open_log("p", LogConfig::default()).await.unwrap();
        log.append(&build::simple(1, 2, 5), 0).await.unwrap(); // plain records 0-1
        assert_eq!(
            appended(
                log.append_checked(&idempotent(7, 0, 0, 3), 0)
                    .await
                    .unwrap()
            ),
            2
        );
        assert_eq!(
            appended(
                log.append_checked(&idempotent(7, 0, 3, 1), 0)
                    .await
                    .unwrap()
            ),
            5
        );
        match log
            .append_checked(&idempotent(7, 0, 0, 3), 0)
            .await
            .unwrap()
        {
            Checked::Duplicate(d) => assert_eq!((d.first_offset, d.last_offset), (2, 4)),
            other => panic!("{other:?}"),
        }
        assert_eq!(log.log_end_offset(), 6, "a duplicate appended something");
        log.flush().await.unwrap();
        drop(log);
        // A new incarnation rebuilds the state from the log.
        let log = s.open_log("p", LogConfig::default()).await.unwrap();
        assert!(matches!(
            log.append_checked(&idempotent(7, 0, 3, 1), 0).await.unwrap(),
            Checked::Duplicate(d) if d.first_offset == 5
        ));
        assert!(matches!(
            log.append_checked(&idempotent(7, 0, 9, 1), 0).await,
            Err(Error::Sequence(SequenceError::OutOfOrder {
                first_seq: 9,
                last_seq: 3,
                ..
            }))
        ));
        // A bumped epoch fences the old one.
        assert_eq!(
            appended(
                log.append_checked(&idempotent(7, 1, 0, 1), 0)
                    .await
                    .unwrap()
            ),
            6
        );
        assert!(matches!(
            log.append_checked(&idempotent(7, 0, 4, 1), 0).await,
            Err(Error::Sequence(SequenceError::StaleEpoch { .. }))
        ));
        assert_eq!(log.log_end_offset(), 7);
    });
}

#[test]
fn concurrent_in_order_batches_of_one_producer_all_append_in_order() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let log = s.open_log("c", LogConfig::default()).await.unwrap();
        let tasks: Vec<_> = (0..5)
            .map(|i| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    log.append_checked(&idempotent(3, 0, i * 2, 2), 0).await
                })
            })
            .collect();
        let mut offsets = Vec::new();
        for t in tasks {
            offsets.push(appended(t.await.unwrap()));
        }
        assert_eq!(offsets, vec![0, 2, 4, 6, 8]);
    });
}

#[test]
fn replicated_appends_feed_the_state_and_truncation_forgets_it() {
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let s = storage(&path, StorageLimits::default()).await;
        let log = s.open_log("f", LogConfig::default()).await.unwrap();
        // As a follower: batches arrive with their offsets.
        for (seq, base) in [(0, 0i64), (1, 1)] {
            let mut b = idempotent(5, 0, seq, 1);
            b[0..8].copy_from_slice(&base.to_be_bytes());
            log.append_with_offsets(b.into()).await.unwrap();
        }
        // Promoted to leader: a client's retry of the last batch is a duplicate.
        assert!(matches!(
            log.append_checked(&idempotent(5, 0, 1, 1), 0).await.unwrap(),
            Checked::Duplicate(d) if d.first_offset == 1
        ));
        // Its next batch, appended while the state is built, is recorded too.
        assert_eq!(
            appended(
                log.append_checked(&idempotent(5, 0, 2, 1), 0)
                    .await
                    .unwrap()
            ),
            2
        );
        // Truncated back to offset 2 (the batch of seq 2 is gone): its retry appends.
        log.truncate_to(2).await.unwrap();
        assert_eq!(
            appended(
                log.append_checked(&idempotent(5, 0, 2, 1), 0)
                    .await
                    .unwrap()
            ),
            2
        );
    });
}
