//! The shard's cap on preallocated-but-unwritten bytes (`StorageLimits::
//! preallocated_bytes_max`): many active logs each start preallocating 1 MiB, but all
//! together they stay under the cap; appends beyond it extend their files instead and
//! never fail.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::common::*;
use sluice_storage::StorageLimits;

fn allocated_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        total += if m.is_dir() {
            allocated_bytes(&e.path())
        } else {
            m.blocks() * 512
        };
    }
    total
}

#[test]
fn preallocation_over_many_logs_stays_under_the_shard_cap() {
    const LOGS: usize = 24;
    const CAP: u64 = 4 << 20;
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let limits = StorageLimits {
            preallocated_bytes_max: CAP,
            ..no_cache()
        };
        let s = storage(&dir, limits).await;
        let mut logs = Vec::new();
        for i in 0..LOGS {
            let log = s
                .open_log(&format!("p-{i}"), small_segments(64 << 20))
                .await
                .unwrap();
            log.append(&batch(1000, 2, i as u64), 0).await.unwrap();
            log.flush().await.unwrap();
            logs.push(log);
            assert!(
                s.preallocated_unwritten_bytes() <= CAP,
                "{} bytes preallocated",
                s.preallocated_unwritten_bytes()
            );
        }
        // A few logs got their 1 MiB step; the rest write without one.
        assert!(s.preallocated_unwritten_bytes() >= 1 << 20);
        let on_disk = allocated_bytes(&dir);
        assert!(
            on_disk <= CAP + LOGS as u64 * (64 << 10),
            "{on_disk} bytes allocated for {LOGS} logs of one batch"
        );
        for (i, log) in logs.iter().enumerate() {
            log.append(&batch(2000, 2, 100 + i as u64), 0)
                .await
                .unwrap();
            log.flush().await.unwrap();
            assert_eq!(read_all(log).await.len(), 2, "both batches read back");
        }
        // Sealing gives the space back.
        for log in &logs {
            log.close().await.unwrap();
        }
        assert_eq!(s.preallocated_unwritten_bytes(), 0);
    });
}
