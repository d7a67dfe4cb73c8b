//! The append futures stay small: a broker's Produce builds one per partition of a
//! request and moves it a few times (into its caller's future, into a box), so at
//! 10,000 partitions their size is copied a few hundred thousand times a second. The
//! rare slow paths (a roll, reopening a closed segment, opening the journal's next
//! chunk) are boxed to keep it so; inline, they made an append's future 6.4 KB, and
//! moving it was 7% of a one-broker 10,000-partition load's CPU (issue 40).

use crate::common::*;
use sluice_storage::LogConfig;

fn size<F>(_: &F) -> usize {
    std::mem::size_of::<F>()
}

#[test]
fn an_append_future_stays_within_two_kib() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("t-0", LogConfig::default()).await.unwrap();
        let b = bytes::Bytes::from(batch(1, 1, 1));
        let staged = log.append_judged_staged(b.clone(), 0);
        assert!(
            size(&staged) <= 2048,
            "append_judged_staged: {} bytes",
            size(&staged)
        );
        drop(staged);
        let plain = log.append(&b, 0);
        assert!(size(&plain) <= 2048, "append: {} bytes", size(&plain));
    });
}
