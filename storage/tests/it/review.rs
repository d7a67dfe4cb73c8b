//! Review fixes of 675ebcf that had no test of their own: index files are not
//! preallocated. (Transactional batches were kept out of compaction until the
//! transaction index existed; how compaction treats them now is tested in `txn.rs`.)

use crate::common::*;

/// Index files of the active segment hold their entries only: only `.log` files are
/// preallocated (in steps growing from 1 MiB to 32 MiB), so an index never claims
/// megabytes of zeros. (The active segment's indexes reach their files when it is
/// sealed — here by the close — not at every flush: issue 14.)
#[test]
fn index_files_are_not_preallocated() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("idx", small_segments(8 << 20)).await.unwrap();
        for i in 0..50 {
            log.append(&batch(1 + i as i64, 5, i), 0).await.unwrap();
        }
        log.flush().await.unwrap();
        assert_eq!(log.segment_count(), 1, "one active segment");
        log.close().await.unwrap();
        for ext in ["index", "timeindex"] {
            let p = dir.join("idx").join(format!("{:020}.{ext}", 0));
            let len = std::fs::metadata(&p).unwrap().len();
            assert!(len > 0, "{ext} has entries");
            assert!(len < 64 << 10, "{ext} is {len} bytes: preallocated");
        }
    });
}
