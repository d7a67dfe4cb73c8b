//! `file::keep_free_when_preallocating` is process-wide, so this test has its binary
//! to itself: with a floor above the file system's free space no step is preallocated
//! (the file holds only what was written); with the floor off the first step is.

#[path = "it/common/mod.rs"]
mod common;

use std::os::unix::fs::MetadataExt;

use common::*;
use sluice_storage::file::{self, AppendFile, PREALLOCATE_BYTES, PREALLOCATE_FIRST_BYTES};

#[test]
fn preallocation_keeps_the_free_space_floor() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    run(move || async move {
        let free = file::space_of(&dir).unwrap().free;
        let allocated = |name: &str, floor: u64| {
            let path = dir.join(name);
            async move {
                file::keep_free_when_preallocating(floor);
                let f = AppendFile::open(&path, 0, 1 << 16, PREALLOCATE_BYTES)
                    .await
                    .unwrap();
                f.push(&[0x42; 4096]).unwrap();
                f.sync_all().await.unwrap();
                std::fs::metadata(&path).unwrap().blocks() * 512
            }
        };
        let kept = allocated("floor.log", free + (1 << 30)).await;
        assert!(
            kept < PREALLOCATE_FIRST_BYTES,
            "preallocated {kept} bytes past the floor"
        );
        let off = allocated("no-floor.log", 0).await;
        assert!(
            off >= PREALLOCATE_FIRST_BYTES,
            "the first step was not preallocated: {off}"
        );
    });
}
