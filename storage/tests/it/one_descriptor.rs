//! Issue 14: an active log holds one descriptor, its active segment's `.log`. The
//! active segment's offset and time indexes live in memory and reach their files whole
//! when the segment is sealed (roll, an idle log's files closed, close, truncation), not
//! at every flush. A crash after appends past the last index write recovers the same
//! log, with the same indexes, as a clean close of the same appends.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::common::*;
use sluice_storage::{LogConfig, PartitionLog, Storage};

/// Open descriptors of this process pointing into `dir`.
fn descriptors_into(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// [`descriptors_into`] once at most `want` are left: a dropped file's descriptor is
/// closed by the executor shortly after (glommio closes dropped files asynchronously),
/// so this polls, up to a deadline.
async fn settled(dir: &Path, want: usize) -> Vec<PathBuf> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let held = descriptors_into(dir);
        if held.len() <= want || std::time::Instant::now() > deadline {
            return held;
        }
        glommio::timer::sleep(std::time::Duration::from_millis(2)).await;
    }
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 1 << 20,
        index_interval_bytes: 128,
        ..LogConfig::default()
    }
}

fn seg_file(dir: &Path, log: &str, base: i64, ext: &str) -> PathBuf {
    dir.join(log).join(format!("{base:020}.{ext}"))
}

fn len_of(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

async fn append_round(log: &PartitionLog, round: u64, n: u64) {
    for i in 0..n {
        let tag = round * 1_000 + i;
        log.append(&batch(1_000 + tag as i64, 3, tag), 0)
            .await
            .unwrap();
    }
    log.flush().await.unwrap();
}

/// The same appends for every log of these tests: a closed segment, then an active one
/// whose indexes were written (the log's files closed to save descriptors), then more
/// appends (and index entries) since. Returns the active segment's base and the
/// `.index`/`.timeindex` lengths of the last index write.
async fn build(s: &Rc<Storage>, dir: &Path, name: &str) -> (Rc<PartitionLog>, i64, u64, u64) {
    let log = s.open_log(name, config()).await.unwrap();
    append_round(&log, 1, 20).await;
    log.roll().await.unwrap();
    let (base, _) = log.active_segment();
    append_round(&log, 2, 20).await;
    assert!(log.deactivate().await.unwrap(), "its files were open");
    let left = settled(&dir.join(name), 0).await;
    assert!(left.is_empty(), "{left:?}");
    let index_len = len_of(&seg_file(dir, name, base, "index"));
    let time_len = len_of(&seg_file(dir, name, base, "timeindex"));
    assert!(index_len > 0 && time_len > 0, "closing wrote the indexes");
    append_round(&log, 3, 30).await;
    (log, base, index_len, time_len)
}

#[test]
fn an_active_appended_log_holds_one_descriptor() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let (log, base, index_len, time_len) = build(&s, &dir, "one").await;
        let held = settled(&dir.join("one"), 1).await;
        assert_eq!(
            held,
            vec![seg_file(&dir, "one", base, "log")],
            "an active log holds its active segment's .log and nothing else"
        );
        // Flushes wrote no index entry: the files are as the last seal left them.
        assert_eq!(len_of(&seg_file(&dir, "one", base, "index")), index_len);
        assert_eq!(len_of(&seg_file(&dir, "one", base, "timeindex")), time_len);
        // A roll writes the indexes whole and opens only the new segment's .log.
        log.roll().await.unwrap();
        assert!(len_of(&seg_file(&dir, "one", base, "index")) > index_len);
        let (next, _) = log.active_segment();
        append_round(&log, 4, 10).await;
        assert_eq!(
            settled(&dir.join("one"), 1).await,
            vec![seg_file(&dir, "one", next, "log")]
        );
        assert_eq!(s.active_logs(), 1);
        // A closed log's file goes with the log.
        log.close().await.unwrap();
        drop(log);
        assert_eq!(settled(&dir.join("one"), 0).await, Vec::<PathBuf>::new());
    });
}

#[test]
fn a_crash_after_appends_past_the_last_index_write_recovers_identically() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    // Phase 1: the same appends to two logs; one is closed cleanly, the other is
    // dropped without a close (a crash after its flushes).
    let (want, end, base, index_len) = {
        let dir = dir.clone();
        run(move || async move {
            let s = storage(&dir, no_cache()).await;
            let (crashed, base, index_len, _) = build(&s, &dir, "crashed").await;
            let (clean, ..) = build(&s, &dir, "clean").await;
            let want = read_all(&crashed).await;
            assert_eq!(read_all(&clean).await, want);
            let end = crashed.log_end_offset();
            clean.close().await.unwrap();
            (want, end, base, index_len)
        })
    };
    // Before recovery the crashed log's index lags what was appended.
    assert_eq!(len_of(&seg_file(&dir, "crashed", base, "index")), index_len);
    assert!(len_of(&seg_file(&dir, "clean", base, "index")) > index_len);
    // Phase 2: recovery scans from the last entry written and rebuilds the rest.
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let (crashed, report) = s.open_log_with_report("crashed", config()).await.unwrap();
        assert_eq!(report.rebuilt_indexes, 0, "{report:?}");
        assert_eq!(report.dropped_index_entries, 0, "{report:?}");
        assert_eq!(report.deleted_segments, 0, "{report:?}");
        let clean = s.open_log("clean", config()).await.unwrap();
        assert_eq!(crashed.log_end_offset(), end);
        assert_eq!(read_all(&crashed).await, want);
        assert_eq!(read_all(&clean).await, want);
        for ext in ["index", "timeindex"] {
            assert_eq!(
                std::fs::read(seg_file(&dir, "crashed", base, ext)).unwrap(),
                std::fs::read(seg_file(&dir, "clean", base, ext)).unwrap(),
                "recovered .{ext} is the one a clean close writes"
            );
        }
        // Round r's batches carry timestamps from (r + 1) * 1,000 up.
        for ts in [0, 2_010, 3_000, 3_015, 4_000, 4_012, 4_029, 4_031, 4_032] {
            assert_eq!(
                crashed.offset_for_timestamp(ts).await.unwrap(),
                clean.offset_for_timestamp(ts).await.unwrap(),
                "offset for timestamp {ts}"
            );
        }
        assert_eq!(crashed.max_timestamp(), clean.max_timestamp());
        // Appending after recovery works.
        crashed.append(&batch(9_000, 2, 9), 0).await.unwrap();
        crashed.flush().await.unwrap();
        assert_eq!(crashed.log_end_offset(), end + 2);
    });
}
