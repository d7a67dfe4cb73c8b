//! The data directory's free space, watched by every shard on its own: below the
//! configured minimum ([`DiskMinimum`]) appends to user partitions are refused at once
//! with KAFKA_STORAGE_ERROR, while everything else keeps working (Metadata, Fetch,
//! groups, admin requests, retention) and the writes that must not fail — the metadata
//! journal, leader-epoch checkpoints, producer snapshots, transaction markers and the
//! internal topics — use the space below the minimum, their reserve. Appends resume by
//! themselves once the free space is back above the minimum (retention, DeleteRecords,
//! a deleted topic, a grown file system).
//!
//! Each shard samples `statvfs` every [`SAMPLE_INTERVAL`] (a syscall of a few µs, no
//! I/O) and counts the bytes it admitted since, so a fast producer cannot write far past
//! the minimum between two samples. Nothing is shared between shards. The usable free
//! space counts what the shard's files hold preallocated but unwritten as free (room
//! for their appends), and what the shard journals may still take of their largest
//! footprint as used ([`journal_margin`]): neither a journal chunk deleted at its
//! checkpoint nor a restart that releases preallocated tails lets appends in that
//! would be refused again a moment later.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kafka_protocol::error::ResponseError;

pub use sluice_storage::file::{space_of, Space};

use crate::base::config::DiskMinimum;
use crate::base::error::ApiError;

/// How often a shard samples the free space.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// One shard's view of the data directory's free space.
pub struct DiskWatch {
    dir: PathBuf,
    minimum: DiskMinimum,
    sample: Cell<Space>,
    /// Bytes this shard admitted since `sample` was taken.
    admitted: Cell<u64>,
    /// Appends are being refused (logged once per change).
    low: Cell<bool>,
    /// Appends refused since start.
    refused: Cell<u64>,
    /// The most the shard journals take ([`journal_margin`]) and the shards whose
    /// journals these are: what they take and give back as chunks come and go is kept
    /// free for them, so appends are not let in by a chunk deleted (or a restart's
    /// replay) only to be refused when the next chunk is written.
    journal_margin: u64,
    shards: usize,
    /// What the journals do not take now of their margin (at the last sample).
    journal_reserve: Cell<u64>,
}

/// The most the shard journals of `shards` shards take on a file system of
/// `total` bytes (their chunks open and waiting for the checkpoint, see
/// `sluice_storage::wal`); 0 without a journal.
pub fn journal_margin(journal_chunk_bytes: u64, total: u64, shards: usize) -> u64 {
    if journal_chunk_bytes == 0 {
        return 0;
    }
    let chunk = sluice_storage::wal::chunk_bytes_for(journal_chunk_bytes, total, shards);
    sluice_storage::wal::chunk_footprint(chunk)
        * (1 + sluice_storage::wal::CLOSED_CHUNKS_MAX as u64)
        * shards as u64
}

impl DiskWatch {
    pub fn new(dir: &Path, minimum: DiskMinimum, journal_margin: u64, shards: usize) -> DiskWatch {
        let w = DiskWatch {
            dir: dir.to_path_buf(),
            minimum,
            sample: Cell::new(Space::default()),
            admitted: Cell::new(0),
            low: Cell::new(false),
            refused: Cell::new(0),
            journal_margin,
            shards,
            journal_reserve: Cell::new(journal_margin),
        };
        w.refresh();
        w
    }

    /// The minimum free bytes of this file system.
    pub fn threshold(&self) -> u64 {
        self.minimum.threshold(self.sample.get().total)
    }

    /// The usable free space: the last sample, less what this shard admitted since and
    /// what the shard journals may still take of their margin.
    pub fn space(&self) -> Space {
        let s = self.sample.get();
        Space {
            free: s
                .free
                .saturating_sub(self.admitted.get())
                .saturating_sub(self.journal_reserve.get()),
            ..s
        }
    }

    /// True while appends are refused.
    pub fn low(&self) -> bool {
        self.low.get()
    }

    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    /// Takes a new sample. A failed `statvfs` keeps the old one (and says so): the
    /// data directory itself failing shows up on the logs' own I/O.
    pub fn refresh(&self) {
        match space_of(&self.dir) {
            Ok(mut s) => {
                // What this shard's files hold preallocated but unwritten is room for
                // their appends, not used space (a restart gives it back).
                s.free += sluice_storage::file::preallocated_unwritten();
                self.sample.set(s);
                self.admitted.set(0);
                if self.journal_margin > 0 {
                    let taken = sluice_storage::wal::allocated_bytes(&self.dir, self.shards);
                    self.journal_reserve
                        .set(self.journal_margin.saturating_sub(taken));
                }
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the data directory's free space")
            }
        }
        if self.low.get() && self.space().free >= self.threshold() {
            self.low.set(false);
            tracing::warn!(
                dir = %self.dir.display(),
                free = self.space().free,
                minimum = self.threshold(),
                refused = self.refused.get(),
                journal_reserve = self.journal_reserve.get(),
                "free space is back above the minimum: appends resume"
            );
        }
    }

    /// Admits an append of `bytes` to a user partition, or refuses it with
    /// KAFKA_STORAGE_ERROR while the free space is below the minimum. (An append
    /// admitted just above the minimum may end below it: the minimum is a threshold,
    /// and the reserve under it is far larger than one request.)
    pub fn admit(&self, bytes: usize) -> Result<(), ApiError> {
        let minimum = self.threshold();
        let free = self.space().free;
        if free < minimum {
            self.refused.set(self.refused.get() + 1);
            if !self.low.replace(true) {
                tracing::error!(
                    dir = %self.dir.display(),
                    free,
                    minimum,
                    "data directory below its free-space minimum: appends are refused until space is freed"
                );
            }
            return Err(ApiError::with(
                ResponseError::KafkaStorageError,
                format!(
                    "the data directory has {free} bytes free, below its minimum of {minimum}: appends are refused until space is freed (retention, DeleteRecords, deleting topics)"
                ),
            ));
        }
        self.admitted.set(self.admitted.get() + bytes as u64);
        Ok(())
    }

    /// Samples every [`SAMPLE_INTERVAL`] until the watch is dropped.
    pub async fn run(watch: std::rc::Weak<DiskWatch>) {
        loop {
            glommio::timer::sleep(SAMPLE_INTERVAL).await;
            let Some(w) = watch.upgrade() else { return };
            w.refresh();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_until_the_minimum_counting_what_it_admitted_and_resumes_on_refresh() {
        let dir = tempfile::tempdir().unwrap();
        let free = space_of(dir.path()).unwrap().free;
        const MIB: u64 = 1 << 20;
        assert!(free > 128 * MIB, "the test needs some free space");
        // A minimum 64 MiB below the free space: appends are admitted until the free
        // space (less what was admitted) is below it.
        // (Wide margins: other tests write to this disk meanwhile.)
        let total = space_of(dir.path()).unwrap().total;
        let minimum = DiskMinimum {
            bytes: free - 64 * MIB,
            percent: 100,
        };
        assert_eq!(minimum.threshold(total), free - 64 * MIB);
        let w = DiskWatch::new(dir.path(), minimum, 0, 1);
        w.admit(40 << 20).unwrap();
        w.admit(16 << 20).unwrap();
        // 8 MiB above the minimum: admitted, and then the space is below it.
        w.admit(16 << 20).unwrap();
        assert!(!w.low());
        let e = w.admit(1).unwrap_err();
        assert_eq!(e.code, ResponseError::KafkaStorageError);
        assert!(
            e.message
                .as_deref()
                .unwrap_or("")
                .contains("below its minimum"),
            "{e:?}"
        );
        assert!(w.low());
        assert_eq!(w.refused(), 1);
        // Nothing was written, so a new sample frees the admitted bytes again.
        w.refresh();
        assert!(!w.low());
        w.admit(16 << 20).unwrap();
        // No minimum: everything is admitted.
        let off = DiskWatch::new(
            dir.path(),
            DiskMinimum {
                bytes: 0,
                percent: 5,
            },
            1 << 40,
            1,
        );
        off.admit(usize::MAX / 2).unwrap();
    }

    /// The journals' margin counts against the free space, less what they take: a
    /// journal chunk deleted does not let appends in.
    #[test]
    fn the_space_the_journals_may_still_take_is_kept_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let free = space_of(dir.path()).unwrap().free;
        const MIB: u64 = 1 << 20;
        assert!(free > 128 * MIB, "the test needs some free space");
        let minimum = DiskMinimum {
            bytes: free - 64 * MIB,
            percent: 100,
        };
        // A 32 MiB margin, no journal file yet: 32 MiB of the 64 above the minimum
        // are the journals'.
        let w = DiskWatch::new(dir.path(), minimum, 32 * MIB, 1);
        w.admit(24 << 20).unwrap();
        w.admit(16 << 20).unwrap();
        assert!(w.admit(1).is_err() && w.low());
        // A journal chunk of 8 MiB appears: it takes from the margin, not from the free
        // space for appends (the sample sees both).
        let journal = sluice_storage::wal::dir_of(dir.path(), 0);
        std::fs::create_dir_all(&journal).unwrap();
        let f = std::fs::File::create(journal.join(format!("{:020}.wal", 0))).unwrap();
        f.set_len(8 * MIB).unwrap();
        // (set_len allocates nothing on most file systems: write it.)
        std::io::Write::write_all(&mut &f, &vec![1u8; (8 * MIB) as usize]).unwrap();
        f.sync_all().unwrap();
        w.refresh();
        assert_eq!(w.journal_reserve.get(), 24 * MIB);
        drop(f);
    }

    #[test]
    fn the_journal_margin_is_every_shards_chunks() {
        const MIB: u64 = 1 << 20;
        assert_eq!(journal_margin(0, 1 << 40, 4), 0);
        // A chunk and one preallocation step (a quarter of it, at most 32 MiB), three
        // chunks a shard.
        assert_eq!(
            journal_margin(128 * MIB, 1 << 40, 2),
            (128 + 32) * MIB * 3 * 2
        );
        // A small file system: smaller chunks, within an eighth of it.
        assert!(journal_margin(128 * MIB, 128 * MIB, 1) <= 128 * MIB / 8);
    }
}
