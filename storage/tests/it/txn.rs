//! Transactions in the log: end-transaction markers and the first unstable offset, the
//! aborted-transaction index (`.txnindex`) and Kafka's query over it, followers that
//! copy markers, recovery and truncation of the index, compaction of transactional
//! data, and producer expiry.

use crate::common::*;
use sluice_storage::batch::{self, build, BatchHeader};
use sluice_storage::index::TxnIndex;
use sluice_storage::producer::SequenceError;
use sluice_storage::{AbortedTxn, Error, Judged, LogConfig, PartitionLog, StorageLimits, TxnError};

fn appended(j: Judged) -> i64 {
    match j {
        Judged::Appended(info) => info.base_offset,
        other => panic!("expected an append, got {other:?}"),
    }
}

/// Appends a transactional batch of `n` records for `pid` (epoch 0) with sequence `seq`.
async fn txn_data(log: &PartitionLog, pid: i64, seq: i32, n: usize) -> i64 {
    appended(
        log.append_judged(&producer_batch(pid, 0, seq, true, n), 0)
            .await
            .unwrap(),
    )
}

async fn marker(log: &PartitionLog, pid: i64, commit: bool) -> i64 {
    appended(log.append_marker(pid, 0, commit, 0, 0).await.unwrap())
}

fn aborted(pid: i64, first: i64, last: i64, lso: i64) -> AbortedTxn {
    AbortedTxn {
        producer_id: pid,
        first_offset: first,
        last_offset: last,
        last_stable_offset: lso,
    }
}

/// The headers of every batch in the log.
async fn headers(log: &PartitionLog) -> Vec<(BatchHeader, Option<batch::EndTxnMarker>)> {
    let mut out = Vec::new();
    for (_, chunk) in read_chunks(log).await {
        for (h, b) in batch::stored_batches(&chunk) {
            out.push((h, batch::parse_end_txn_marker(b)));
        }
    }
    out
}

#[test]
fn markers_close_transactions_and_move_the_first_unstable_offset() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, StorageLimits::default()).await;
        let log = s.open_log("t", LogConfig::default()).await.unwrap();
        log.append(&batch(1, 1, 0), 0).await.unwrap(); // 0: plain
        assert_eq!(log.first_unstable_offset(), None);
        assert_eq!(txn_data(&log, 1, 0, 2).await, 1); // 1-2: producer 1 opens
        assert_eq!(txn_data(&log, 2, 0, 1).await, 3); // 3: producer 2 opens
        assert_eq!(txn_data(&log, 1, 2, 1).await, 4); // 4: producer 1 again
        assert_eq!(log.first_unstable_offset(), Some(1));
        assert_eq!(marker(&log, 1, true).await, 5);
        assert_eq!(log.first_unstable_offset(), Some(3));
        assert_eq!(marker(&log, 2, false).await, 6);
        assert_eq!(log.first_unstable_offset(), None);
        // The abort is indexed with the LSO as it was: nothing else open, so 7.
        assert_eq!(log.aborted_index(), vec![aborted(2, 3, 6, 7)]);
        // The markers are control batches in Kafka's layout, with no sequence.
        let hs = headers(&log).await;
        let (h, m) = &hs[4];
        assert!(h.is_control() && h.is_transactional());
        assert_eq!((h.base_offset, h.producer_id, h.base_sequence), (5, 1, -1));
        assert_eq!(m.map(|m| m.commit), Some(true));
        assert_eq!(hs[5].1.map(|m| m.commit), Some(false));
        // A retried marker (nothing open) is written and closes nothing.
        assert_eq!(marker(&log, 2, false).await, 7);
        assert_eq!(log.aborted_index().len(), 1);
        // A transaction whose start DeleteRecords removed: the first unstable offset
        // is never below the log start (nothing below it can be read).
        assert_eq!(txn_data(&log, 3, 0, 1).await, 8);
        log.append(&batch(1, 2, 1), 0).await.unwrap(); // 9-10: plain
        assert_eq!(log.first_unstable_offset(), Some(8));
        log.delete_records_before(10).await.unwrap();
        assert_eq!(log.first_unstable_offset(), Some(10));
    });
}

#[test]
fn transaction_rules_refuse_plain_batches_stale_and_fenced_markers() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, StorageLimits::default()).await;
        let log = s.open_log("r", LogConfig::default()).await.unwrap();
        let mut b = producer_batch(5, 2, 0, true, 1);
        log.append_judged(&b, 0).await.unwrap();
        // A plain batch of a producer whose transaction is open.
        set_producer(&mut b, 5, 2, 1, false);
        assert_eq!(
            log.append_judged(&b, 0).await.unwrap(),
            Judged::Refused(TxnError::NotTransactional {
                producer_id: 5,
                txn_first_offset: 0
            })
        );
        // Clients may not write control batches.
        let m = batch::end_txn_marker_batch(
            5,
            2,
            batch::EndTxnMarker {
                commit: true,
                coordinator_epoch: 0,
            },
            1,
        );
        assert!(matches!(
            log.append_judged(&m, 0).await,
            Err(Error::Batch(batch::BatchError::ControlBatchFromClient))
        ));
        assert!(log.append_checked(&m, 0).await.is_err());
        // Markers: a stale producer epoch, then a fenced coordinator.
        assert!(matches!(
            log.append_marker(5, 1, true, 0, 0).await,
            Err(Error::Sequence(SequenceError::StaleEpoch {
                epoch: 1,
                current: 2,
                ..
            }))
        ));
        appended(log.append_marker(5, 2, false, 7, 0).await.unwrap());
        assert_eq!(
            log.append_marker(5, 2, true, 6, 0).await.unwrap(),
            Judged::Refused(TxnError::CoordinatorFenced {
                producer_id: 5,
                coordinator_epoch: 6,
                current: 7
            })
        );
        assert_eq!(log.log_end_offset(), 2, "refusals append nothing");
        // With the transaction closed, the plain batch is fine.
        assert!(matches!(
            log.append_judged(&b, 0).await,
            Ok(Judged::Appended(_))
        ));
    });
}

/// The broker's coordinators write transactional offset commits with `append_bounded`:
/// no sequence rules, but the epoch rule, as Kafka's coordinator-origin appends. A
/// producer fenced since (the abort marker of its successor's epoch is in the log)
/// cannot put a late commit in, which would reopen a transaction nobody ends.
#[test]
fn a_coordinators_transactional_batch_of_a_fenced_epoch_is_refused() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, StorageLimits::default()).await;
        let log = s.open_log("c", LogConfig::default()).await.unwrap();
        let late = producer_batch(5, 0, 0, true, 1);
        log.append_bounded(&late, 0, 1 << 20).await.unwrap();
        // The producer's successor fenced it: its transaction aborted at epoch 1.
        appended(log.append_marker(5, 1, false, 0, 0).await.unwrap());
        let end = log.log_end_offset();
        assert!(matches!(
            log.append_bounded(&late, 0, 1 << 20).await,
            Err(Error::Sequence(SequenceError::StaleEpoch {
                epoch: 0,
                current: 1,
                ..
            }))
        ));
        assert_eq!(log.log_end_offset(), end, "the refusal appended nothing");
        assert_eq!(log.first_unstable_offset(), None, "no transaction reopened");
        // The current epoch's commit goes in, and plain coordinator batches are not
        // judged at all.
        log.append_bounded(&producer_batch(5, 1, 0, true, 1), 0, 1 << 20)
            .await
            .unwrap();
        log.append_bounded(&batch(0, 1, 1), 0, 1 << 20)
            .await
            .unwrap();
    });
}

/// Interleaved transactions of four producers across many small segments.
async fn interleaved(log: &PartitionLog) {
    let mut seq = [0i32; 5];
    for round in 0..12u64 {
        for pid in 1..=4i64 {
            let n = 1 + (round as usize + pid as usize) % 3;
            txn_data(log, pid, seq[pid as usize], n).await;
            seq[pid as usize] += n as i32;
            log.append(&batch(1, 2, round), 0).await.unwrap();
        }
        for pid in 1..=4i64 {
            // Each producer ends every other round, aborting one in three.
            if (round + pid as u64).is_multiple_of(2) {
                marker(log, pid, !(round + pid as u64).is_multiple_of(3)).await;
            }
        }
    }
}

#[test]
fn aborted_transactions_are_found_across_segments_as_kafka_collects_them() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("q", small_segments(1024)).await.unwrap();
        interleaved(&log).await;
        assert!(log.segment_count() > 5, "{} segments", log.segment_count());
        let index = log.aborted_index();
        assert!(index.len() >= 6, "{index:?}");
        // The index is what a replay of the log computes.
        assert_eq!(replayed(&log).await.1, index);
        // Every range: Kafka's overlap rule (marker at or after the fetch offset, first
        // offset below the bound), which the early stop must not cut short.
        let end = log.log_end_offset();
        for fetch in 0..end {
            for upper in fetch + 1..=end {
                let want: Vec<(i64, i64)> = index
                    .iter()
                    .filter(|t| t.last_offset >= fetch && t.first_offset < upper)
                    .map(|t| (t.producer_id, t.first_offset))
                    .collect();
                assert_eq!(
                    log.aborted_transactions(fetch, upper),
                    want,
                    "[{fetch}, {upper})"
                );
            }
        }
        // Closed segments carry their entries on disk; each entry sits in the segment
        // of its marker.
        let bases = log.segment_bases();
        let mut on_disk = Vec::new();
        for (i, base) in bases.iter().enumerate() {
            let path = dir.join("q").join(format!("{base:020}.txnindex"));
            let next = bases.get(i + 1).copied().unwrap_or(end);
            match std::fs::read(&path) {
                Ok(bytes) => {
                    let (idx, clean) = TxnIndex::decode(&bytes, *base);
                    assert!(clean);
                    assert!(idx
                        .entries()
                        .iter()
                        .all(|e| e.last_offset >= *base && e.last_offset < next));
                    on_disk.extend_from_slice(idx.entries());
                }
                Err(_) => assert!(
                    index
                        .iter()
                        .all(|e| e.last_offset < *base || e.last_offset >= next)
                        || i + 1 == bases.len(),
                    "segment {base} has aborted transactions but no .txnindex"
                ),
            }
        }
        let closed_end = *bases.last().unwrap();
        let closed: Vec<AbortedTxn> = index
            .iter()
            .copied()
            .filter(|e| e.last_offset < closed_end)
            .collect();
        assert_eq!(&on_disk[..closed.len()], &closed[..]);
    });
}

#[test]
fn followers_copying_the_log_build_the_same_state_and_index() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let leader = s.open_log("leader", small_segments(2048)).await.unwrap();
        let follower = s.open_log("follower", small_segments(2048)).await.unwrap();
        interleaved(&leader).await;
        for (_, chunk) in read_chunks(&leader).await {
            for (_, b) in batch::stored_batches(&chunk) {
                follower
                    .append_with_offsets(bytes::Bytes::copy_from_slice(b))
                    .await
                    .unwrap();
            }
        }
        assert_eq!(follower.producer_state(), leader.producer_state());
        assert_eq!(follower.aborted_index(), leader.aborted_index());
        assert_eq!(
            follower.first_unstable_offset(),
            leader.first_unstable_offset()
        );
        assert!(
            leader.first_unstable_offset().is_some(),
            "some transactions stay open"
        );
    });
}

#[test]
fn recovery_rebuilds_the_txnindex_after_a_torn_tail() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let (before, fuo, last_marker) = {
            let s = storage(&dir, no_cache()).await;
            let log = s.open_log("torn", small_segments(4096)).await.unwrap();
            interleaved(&log).await;
            txn_data(&log, 9, 0, 2).await;
            let last = marker(&log, 9, false).await;
            log.flush().await.unwrap();
            // Dropped without closing: the active segment's .txnindex was never written.
            (log.aborted_index(), log.first_unstable_offset(), last)
        };
        assert_eq!(before.last().map(|e| e.last_offset), Some(last_marker));
        let active_base = *std::fs::read_dir(dir.join("torn"))
            .unwrap()
            .filter_map(|e| {
                sluice_storage::segment::parse_log_name(&e.unwrap().file_name().to_string_lossy())
            })
            .collect::<Vec<_>>()
            .iter()
            .max()
            .unwrap();
        assert!(!dir
            .join("torn")
            .join(format!("{active_base:020}.txnindex"))
            .exists());
        // Tear the last batch (producer 9's ABORT marker) in half.
        let path = dir.join("torn").join(format!("{active_base:020}.log"));
        let data = std::fs::read(&path).unwrap();
        let mut pos = 0;
        let mut last_start = 0;
        while let Some(total) = batch::peek_total_bytes(&data[pos..]) {
            last_start = pos;
            pos += total;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len((last_start + (pos - last_start) / 2) as u64)
            .unwrap();
        let s = storage(&dir, no_cache()).await;
        let (log, report) = s
            .open_log_with_report("torn", small_segments(4096))
            .await
            .unwrap();
        assert_eq!(report.producer_snapshot, Some(active_base));
        // The index holds every abort but the torn one, and producer 9 is open again.
        assert_eq!(log.aborted_index(), before[..before.len() - 1].to_vec());
        assert_eq!(log.aborted_index(), replayed(&log).await.1);
        assert_eq!(log.producer_state(), replayed(&log).await.0);
        let reopened = log
            .producer_state()
            .get(9)
            .unwrap()
            .txn_first_offset
            .unwrap();
        assert_eq!(
            log.first_unstable_offset(),
            Some(fuo.map_or(reopened, |f| f.min(reopened)))
        );
        // Writing the marker again closes it and indexes it again.
        marker(&log, 9, false).await;
        assert_eq!(log.aborted_index().len(), before.len());
    });
}

#[test]
fn truncation_drops_aborted_entries_and_reopens_transactions() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("tr", small_segments(1024)).await.unwrap();
        interleaved(&log).await;
        let index = log.aborted_index();
        let cut = index[index.len() / 2];
        // Cut at the middle abort's marker: it and everything after go.
        log.truncate_to(cut.last_offset).await.unwrap();
        assert_eq!(log.log_end_offset(), cut.last_offset);
        assert_eq!(log.aborted_index(), index[..index.len() / 2].to_vec());
        assert!(log.snapshot_offsets().iter().all(|o| *o <= cut.last_offset));
        let state = log.producer_state();
        assert_eq!(state, replayed(&log).await.0);
        assert_eq!(
            state.get(cut.producer_id).unwrap().txn_first_offset,
            Some(cut.first_offset),
            "the transaction whose marker went is open again"
        );
        assert!(log.first_unstable_offset().unwrap() <= cut.first_offset);
        // This time it commits: no entry.
        marker(&log, cut.producer_id, true).await;
        assert_eq!(log.aborted_index(), index[..index.len() / 2].to_vec());
        // The same after a restart.
        let before = (log.producer_state(), log.aborted_index());
        log.close().await.unwrap();
        drop(log);
        let log = s.open_log("tr", small_segments(1024)).await.unwrap();
        assert_eq!((log.producer_state(), log.aborted_index()), before);
    });
}

fn compacted(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        cleanup_compact: true,
        cleanup_delete: false,
        index_interval_bytes: 256,
        min_cleanable_dirty_ratio_bp: 0,
        ..LogConfig::default()
    }
}

/// A one-record batch `key=value` of producer `pid` (transactional when `txn`).
fn kv(pid: i64, seq: i32, txn: bool, key: &str, value: &str) -> Vec<u8> {
    let mut b = build::batch(1_000, &[(Some(key.as_bytes()), value.as_bytes())]);
    if pid >= 0 {
        set_producer(&mut b, pid, 0, seq, txn);
    }
    b
}

/// Every record left, as (offset, key, value).
async fn key_values(log: &PartitionLog) -> Vec<(i64, String, String)> {
    let mut out = Vec::new();
    for (_, chunk) in read_chunks(log).await {
        for (_, b) in batch::stored_batches(&chunk) {
            if let Some((_, recs)) = sluice_storage::compact::records(b) {
                for r in recs {
                    let raw = r.raw;
                    // value: after the key in the raw record (length-prefixed varints)
                    let mut rest = raw;
                    batch::get_varint(&mut rest); // length
                    rest = &rest[1..];
                    batch::get_varint(&mut rest);
                    batch::get_varint(&mut rest);
                    let kl = batch::get_varint(&mut rest).unwrap() as usize;
                    let key = String::from_utf8(rest[..kl].to_vec()).unwrap();
                    rest = &rest[kl..];
                    let vl = batch::get_varint(&mut rest).unwrap() as usize;
                    let value = String::from_utf8(rest[..vl].to_vec()).unwrap();
                    out.push((r.offset, key, value));
                }
            }
        }
    }
    out
}

#[test]
fn compaction_drops_aborted_data_keeps_markers_and_stops_at_open_transactions() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let (s, clock) = storage_at(&dir, no_cache(), 10_000).await;
        let log = s.open_log("c", compacted(1024)).await.unwrap();
        let plain = |k: &str, v: &str| kv(-1, 0, false, k, v);
        log.append(&plain("a", "a0"), 0).await.unwrap(); // 0
                                                         // Producer 1 commits a1, producer 2 aborts a2 (which must not hide a1).
        log.append_judged(&kv(1, 0, true, "a", "a1"), 0)
            .await
            .unwrap(); // 1
        log.append_judged(&kv(2, 0, true, "a", "a2"), 0)
            .await
            .unwrap(); // 2
        log.append_judged(&kv(2, 1, true, "b", "b2"), 0)
            .await
            .unwrap(); // 3
        marker(&log, 1, true).await; // 4
        marker(&log, 2, false).await; // 5
        log.roll().await.unwrap();
        // Producer 3 opens a transaction here and keeps it open for a while.
        log.append_judged(&kv(3, 0, true, "c", "c3"), 0)
            .await
            .unwrap(); // 6
        for i in 0..60 {
            log.append(&plain(&format!("k{}", i % 3), &format!("v{i}")), 0)
                .await
                .unwrap();
        }
        log.roll().await.unwrap();
        assert_eq!(log.first_unstable_offset(), Some(6));
        log.compact().await.unwrap();
        // Nothing at or after offset 6 was touched: all 60 plain records are there.
        let kvs = key_values(&log).await;
        assert_eq!(kvs.iter().filter(|(o, _, _)| *o >= 7).count(), 60);
        // Below it: a0 went (a1 is later, committed), aborted a2 and b2 went and did
        // not hide a1; the markers stay.
        let low: Vec<_> = kvs.iter().filter(|(o, _, _)| *o < 6).cloned().collect();
        assert_eq!(low, vec![(1, "a".into(), "a1".into())]);
        let hs = headers(&log).await;
        assert!(hs.iter().any(|(h, m)| h.base_offset == 4 && m.is_some()));
        assert!(hs.iter().any(|(h, m)| h.base_offset == 5 && m.is_some()));
        // Producer 2's aborted batches are remembered by its state: they stay, empty.
        let empty: Vec<i64> = hs
            .iter()
            .filter(|(h, _)| h.record_count == 0)
            .map(|(h, _)| h.base_offset)
            .collect();
        assert_eq!(empty, vec![2, 3]);
        assert_eq!(log.aborted_transactions(0, 6), vec![(2, 2)]);
        assert_eq!(log.producer_state(), replayed(&log).await.0);

        // Producer 3 commits; a later pass cleans its range, keeping the latest "c".
        marker(&log, 3, true).await;
        for i in 0..30 {
            log.append(&plain(&format!("k{}", i % 3), &format!("w{i}")), 0)
                .await
                .unwrap();
        }
        log.roll().await.unwrap();
        log.compact().await.unwrap();
        let kvs = key_values(&log).await;
        assert!(kvs.contains(&(6, "c".into(), "c3".into())));
        assert!(kvs.iter().filter(|(_, k, _)| k == "k0").count() <= 2);

        // A day later, with producer 2 expired, its emptied batches go; then its ABORT
        // marker has nothing left to cover and goes too, with its .txnindex entry.
        clock.0.set(10_000 + 2 * sluice_storage::DAY_MS);
        assert!(s.expire_producers() >= 1);
        log.append(&plain("z", "z"), 0).await.unwrap();
        log.roll().await.unwrap();
        log.compact().await.unwrap();
        log.append(&plain("z", "z2"), 0).await.unwrap();
        log.roll().await.unwrap();
        log.compact().await.unwrap();
        let hs = headers(&log).await;
        assert!(
            !hs.iter().any(|(h, _)| h.producer_id == 2),
            "{:?}",
            hs.iter()
                .map(|(h, _)| (h.base_offset, h.producer_id))
                .collect::<Vec<_>>()
        );
        assert!(log.aborted_index().is_empty());
        assert!(log.aborted_transactions(0, log.log_end_offset()).is_empty());
        // Producer 1's commit marker and batch are gone the same way; a1 stays as the
        // latest "a".
        let kvs = key_values(&log).await;
        assert!(kvs.contains(&(1, "a".into(), "a1".into())));
    });
}

#[test]
fn idle_producers_expire_but_open_transactions_do_not() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let (s, clock) = storage_at(&dir, StorageLimits::default(), 1_000).await;
        let config = LogConfig {
            producer_id_expiration_ms: 5_000,
            ..LogConfig::default()
        };
        assert_eq!(
            LogConfig::default().producer_id_expiration_ms,
            86_400_000,
            "Kafka's default"
        );
        let log = s.open_log("e", config).await.unwrap();
        // Batch timestamps are 1000 + record index (the client's CreateTime).
        log.append_checked(&producer_batch(1, 0, 0, false, 1), 0)
            .await
            .unwrap();
        log.append_judged(&producer_batch(2, 0, 0, true, 1), 0)
            .await
            .unwrap();
        clock.0.set(5_999);
        assert_eq!(s.expire_producers(), 0);
        clock.0.set(6_000);
        assert_eq!(s.expire_producers(), 1);
        let state = log.producer_state();
        assert!(state.get(1).is_none() && state.get(2).is_some());
        // Expired: any sequence is accepted again (Kafka's unknown producer).
        log.append_checked(&producer_batch(1, 0, 7, false, 1), 0)
            .await
            .unwrap();
        // Snapshots do not bring expired producers back: reopen after a close.
        log.close().await.unwrap();
        drop(log);
        clock.0.set(60_000);
        let log = s
            .open_log(
                "e",
                LogConfig {
                    producer_id_expiration_ms: 5_000,
                    ..LogConfig::default()
                },
            )
            .await
            .unwrap();
        let ids: Vec<i64> = log.producer_state().iter().map(|(p, _)| p).collect();
        assert_eq!(ids, vec![2], "only the open transaction survives");
        assert_eq!(log.first_unstable_offset(), Some(1));
        assert!(LogConfig {
            producer_id_expiration_ms: 0,
            ..LogConfig::default()
        }
        .validate()
        .is_err());
    });
}

#[test]
fn retention_deletes_txnindexes_and_snapshots_with_segments() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let config = LogConfig {
            retention_bytes: 4096,
            retention_ms: -1,
            ..small_segments(1024)
        };
        let log = s.open_log("ret", config).await.unwrap();
        interleaved(&log).await;
        let snaps = log.snapshot_offsets();
        assert_eq!(snaps, log.segment_bases()[1..].to_vec(), "one per roll");
        let txn_files = |dir: &std::path::Path| {
            std::fs::read_dir(dir.join("ret"))
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".txnindex")
                })
                .count()
        };
        let before = txn_files(&dir);
        assert!(before > 0);
        assert!(log.enforce_retention().await.unwrap() > 0);
        let start = log.log_start_offset();
        let first = log.segment_bases()[0];
        assert_eq!(start, first);
        // Snapshots below the start are gone except the newest at or below it.
        let snaps = log.snapshot_offsets();
        assert_eq!(
            snaps.iter().filter(|o| **o <= start).count(),
            1,
            "{snaps:?}"
        );
        assert!(snaps.iter().all(|o| *o >= start));
        assert!(txn_files(&dir) < before);
        assert!(log.aborted_index().iter().all(|e| e.last_offset >= first));
        // The producer state keeps what the deleted segments held (Kafka does too).
        let state = log.producer_state();
        log.close().await.unwrap();
        drop(log);
        let log = s
            .open_log(
                "ret",
                LogConfig {
                    retention_bytes: 4096,
                    retention_ms: -1,
                    ..small_segments(1024)
                },
            )
            .await
            .unwrap();
        assert_eq!(log.producer_state(), state);
    });
}
