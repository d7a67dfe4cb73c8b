//! Review fixes of 675ebcf that had no test of their own: index files are not
//! preallocated, and transactional batches are not compacted.

mod common;

use common::*;
use sluice_storage::batch::{self, build, BatchHeader};
use sluice_storage::{LogConfig, PartitionLog};

/// Index files of the active segment grow with their entries: only `.log` files are
/// preallocated (in 32 MiB steps), so an index never claims megabytes of zeros.
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
        for ext in ["index", "timeindex"] {
            let p = dir.join("idx").join(format!("{:020}.{ext}", 0));
            let len = std::fs::metadata(&p).unwrap().len();
            assert!(len > 0, "{ext} has entries");
            assert!(len < 64 << 10, "{ext} is {len} bytes: preallocated");
        }
    });
}

fn compacted() -> LogConfig {
    LogConfig {
        segment_bytes: 1024,
        cleanup_compact: true,
        cleanup_delete: false,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// A one-record batch `key=value`, flagged transactional (CRC fixed up).
fn transactional(key: &str, value: &str) -> Vec<u8> {
    let mut b = build::batch(1, &[(Some(key.as_bytes()), value.as_bytes())]);
    let attrs = i16::from_be_bytes([b[batch::OFF_ATTRIBUTES], b[batch::OFF_ATTRIBUTES + 1]])
        | batch::ATTR_TRANSACTIONAL;
    b[batch::OFF_ATTRIBUTES..batch::OFF_ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
    let crc = crc32c::crc32c(&b[batch::OFF_ATTRIBUTES..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(batch::validate(&b, true).unwrap().is_transactional());
    b
}

/// Base offset and transactional flag of every batch left in the log.
async fn batch_offsets(log: &PartitionLog) -> Vec<(i64, bool)> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    loop {
        let r = log.read(offset, 1 << 20, None).await.unwrap();
        if r.records.is_empty() {
            break;
        }
        let mut rest = &r.records[..];
        while let Some(total) = batch::peek_total_bytes(rest) {
            let h = BatchHeader::parse(&rest[..total]).unwrap();
            out.push((h.base_offset, h.is_transactional()));
            rest = &rest[total..];
        }
        offset = r.next_offset;
    }
    out
}

/// Transactional batches may belong to aborted or open transactions: compaction keeps
/// them verbatim even when a later record supersedes their key, and does not count
/// their keys (so an older plain record of the same key stays too).
#[test]
fn transactional_batches_are_not_compacted() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("txn", compacted()).await.unwrap();
        let plain = |k: &str, v: &str| build::batch(1, &[(Some(k.as_bytes()), v.as_bytes())]);
        let first = [
            plain("a", "old"),
            transactional("a", "t"),
            transactional("b", "t"),
        ];
        for (offset, b) in first.iter().enumerate() {
            assert_eq!(log.append(b, 0).await.unwrap().base_offset, offset as i64);
        }
        for i in 0..60 {
            log.append(&plain(&format!("k{}", i % 3), &format!("v{i}")), 0)
                .await
                .unwrap();
        }
        // b's latest record is plain and later than its transactional one.
        log.append(&plain("b", "new"), 0).await.unwrap();
        for i in 0..40 {
            log.append(&plain(&format!("k{}", i % 3), &format!("w{i}")), 0)
                .await
                .unwrap();
        }
        assert!(log.segment_count() > 3);
        let stats = log.compact().await.unwrap().expect("a pass ran");
        assert!(stats.records_removed > 30, "compaction ran: {stats:?}");
        let got = batch_offsets(&log).await;
        // a@1 and b@2 are transactional (b@2 superseded by a later plain b); a@0 is
        // plain and only a transactional record of its key follows it.
        let missing: Vec<_> = [(0, false), (1, true), (2, true)]
            .into_iter()
            .filter(|b| !got.contains(b))
            .collect();
        assert!(
            missing.is_empty(),
            "batches compacted away: {missing:?}; left: {got:?}"
        );
    });
}
