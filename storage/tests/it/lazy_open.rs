//! Opening many logs at start-up (issue 14): a log closed cleanly records its segments in
//! `partition.clean`, and opening it then reads no segment file (its segments are
//! recovered one by one when first read); any other log is recovered at open. No
//! opened log holds a descriptor until its first append.

use std::path::{Path, PathBuf};

use crate::common::*;
use sluice_storage::fault::{self, FaultOp, FaultRule};
use sluice_storage::segment::RecoveryReport;
use sluice_storage::StorageLimits;

fn clean_file(dir: &Path, log: &str) -> PathBuf {
    dir.join(log).join("partition.clean")
}

/// Every open and read of the segment files (`.log`, `.index`, `.timeindex`) of `bases`
/// fails while this lives.
struct SegmentsUnreadable(Vec<String>);

impl SegmentsUnreadable {
    fn new(dir: &Path, log: &str, bases: &[i64]) -> Self {
        let mut paths = Vec::new();
        for b in bases {
            for ext in ["log", "index", "timeindex"] {
                let p = dir
                    .join(log)
                    .join(format!("{b:020}.{ext}"))
                    .display()
                    .to_string();
                for op in [FaultOp::Open, FaultOp::Read] {
                    fault::arm(FaultRule {
                        op,
                        errno: 5,
                        path_contains: p.clone(),
                    });
                }
                paths.push(p);
            }
        }
        SegmentsUnreadable(paths)
    }
}

impl Drop for SegmentsUnreadable {
    fn drop(&mut self) {
        for p in &self.0 {
            fault::disarm(p);
        }
    }
}

#[test]
fn a_cleanly_closed_log_opens_without_reading_its_segments() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let cfg = small_segments(1024);
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("lz", cfg.clone()).await.unwrap();
        for i in 0..40 {
            log.append(&batch(1000 + i, 3, i as u64), 0).await.unwrap();
        }
        log.flush().await.unwrap();
        let before = read_all(&log).await;
        let bases = log.segment_bases();
        let end = log.log_end_offset();
        let max_ts = log.max_timestamp();
        let by_time = log.offset_for_timestamp(1025).await.unwrap();
        assert!(by_time.is_some_and(|(o, _)| o > 0));
        assert!(bases.len() >= 3, "several segments: {bases:?}");
        log.close().await.unwrap();
        drop(log);
        assert!(clean_file(&dir, "lz").exists());

        let s = storage(&dir, no_cache()).await;
        let (log, report) = {
            let _unreadable = SegmentsUnreadable::new(&dir, "lz", &bases);
            s.open_log_with_report("lz", cfg.clone()).await.unwrap()
        };
        let nothing = RecoveryReport {
            producer_snapshot: Some(end),
            ..RecoveryReport::default()
        };
        assert_eq!(
            report, nothing,
            "nothing recovered, the close's snapshot loaded"
        );
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(log.segment_bases(), bases);
        assert_eq!(log.max_timestamp(), max_ts);
        assert_eq!(s.active_logs(), 0, "no files held open after the open");
        // Segments are read on first use.
        assert_eq!(read_all(&log).await, before);
        assert_eq!(log.offset_for_timestamp(1025).await.unwrap(), by_time);
        assert!(clean_file(&dir, "lz").exists(), "reads change nothing");
        // The first change removes the record: a crash after it recovers.
        log.append(&batch(2000, 2, 99), 0).await.unwrap();
        log.flush().await.unwrap();
        assert!(!clean_file(&dir, "lz").exists());
        let want = read_all(&log).await;
        drop(log); // no close: as a crash leaves it
        let s = storage(&dir, no_cache()).await;
        let (log, report) = s.open_log_with_report("lz", cfg.clone()).await.unwrap();
        assert!(
            report.truncated_bytes > 0,
            "the preallocated tail was recovered: {report:?}"
        );
        assert_eq!(read_all(&log).await, want);
        assert_eq!(log.log_end_offset(), end + 2);
    });
}

#[test]
fn an_unclean_log_recovers_and_a_stale_record_is_not_trusted() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let cfg = small_segments(4096);
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("uc", cfg.clone()).await.unwrap();
        for i in 0..10 {
            log.append(&batch(1000 + i, 2, i as u64), 0).await.unwrap();
        }
        log.flush().await.unwrap();
        let want = read_all(&log).await;
        let last = *log.segment_bases().last().unwrap();
        drop(log); // unclean: no record
        assert!(!clean_file(&dir, "uc").exists());
        let s = storage(&dir, no_cache()).await;
        let (log, report) = s.open_log_with_report("uc", cfg.clone()).await.unwrap();
        assert!(report.truncated_bytes > 0, "{report:?}");
        assert_eq!(read_all(&log).await, want);
        log.close().await.unwrap();
        drop(log);
        // The record no longer matches the files (the last `.log` grew after it was
        // written): the open recovers instead of trusting it, and drops it.
        let path = dir.join("uc").join(format!("{last:020}.log"));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[0u8; 4096]);
        std::fs::write(&path, &bytes).unwrap();
        let s = storage(&dir, no_cache()).await;
        let (log, report) = s.open_log_with_report("uc", cfg).await.unwrap();
        assert_eq!(report.truncated_bytes, 4096, "{report:?}");
        assert!(!clean_file(&dir, "uc").exists());
        assert_eq!(read_all(&log).await, want);
    });
}

/// The shard's closed segments' in-memory indexes stay within `index_memory_max`
/// (issue 14: indexes sized per shard, not per partition): a pass over the budget drops
/// some from memory, and reads and time lookups then read them back from their files
/// with the same answers.
#[test]
fn closed_segments_indexes_over_the_budget_leave_memory_and_read_back() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        const BUDGET: u64 = 100;
        let limits = StorageLimits {
            index_memory_max: BUDGET,
            ..no_cache()
        };
        let s = storage(&dir, limits).await;
        let log = s.open_log("ix", small_segments(1024)).await.unwrap();
        for i in 0..60 {
            log.append(&batch(1000 + i, 3, i as u64), 0).await.unwrap();
        }
        log.flush().await.unwrap();
        assert!(log.segment_bases().len() >= 5, "{:?}", log.segment_bases());
        let want = read_all(&log).await;
        let by_time = log.offset_for_timestamp(1030).await.unwrap();
        assert!(by_time.is_some());

        let first = s.limit_index_memory();
        assert!(first.before_bytes > BUDGET, "{first:?}");
        assert!(
            first.after_bytes <= BUDGET && first.unloaded_segments > 0,
            "{first:?}"
        );
        let again = s.limit_index_memory();
        assert_eq!(
            (again.before_bytes, again.unloaded_segments),
            (first.after_bytes, 0)
        );

        assert_eq!(read_all(&log).await, want);
        assert_eq!(log.offset_for_timestamp(1030).await.unwrap(), by_time);
        // Those reads loaded them again; the next pass bounds them again.
        let reloaded = s.limit_index_memory();
        assert!(reloaded.before_bytes > BUDGET, "{reloaded:?}");
        assert!(reloaded.after_bytes <= BUDGET, "{reloaded:?}");
    });
}
