//! A small durable journal of typed records, for metadata (the raft log, hard state
//! and snapshots of the metadata quorum) rather than partition data.
//!
//! One file, `journal`, of records `[len u32 LE][crc32c u32 LE][kind u8][payload]`
//! where the CRC covers kind and payload. [`Journal::append`] writes and fdatasyncs
//! before returning. [`Journal::open`] reads records up to the first torn or corrupt
//! one, truncates the file there (a crash mid-append loses only the unsynced tail,
//! which raft never acknowledged) and syncs what it kept, which a killed process may
//! have written without syncing. [`Journal::rewrite`] replaces the whole file
//! atomically (temporary file, fsync, rename, fsync of the directory) for compaction.
//!
//! After a failed append (a write or fdatasync error, ENOSPC included) the journal is
//! failed: every later append returns [`Error::Failed`], because a partly written
//! record would hide every record appended after it from the next open (which stops
//! at the first torn record), and after a failed fdatasync what is on disk is unknown.
//! Only a successful [`Journal::rewrite`] (which replaces the file) or a reopen clears
//! it. Every I/O passes the fault-injection hook ([`crate::fault`]) first.
//!
//! Blocking std I/O, on purpose: metadata writes are few and small, happen on the
//! controller shard only, and must not share the data path's DMA machinery. The time
//! they take is a few fdatasyncs per metadata change.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::fault::{self, FaultOp};
use crate::Error;

const FILE: &str = "journal";
const HEADER: usize = 9;
/// Largest record accepted (a metadata snapshot of a very large cluster).
pub const RECORD_MAX: usize = 256 << 20;

/// A record as read back: its kind and payload.
pub type JournalRecord = (u8, Vec<u8>);

pub struct Journal {
    dir: PathBuf,
    file: File,
    /// Why an append failed, after which the journal refuses appends.
    failed: Option<String>,
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::io(path, e)
}

fn frame(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, payload);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

impl Journal {
    /// Opens (creating) the journal in `dir` and returns its intact records in order.
    pub fn open(dir: &Path) -> Result<(Journal, Vec<JournalRecord>), Error> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let path = dir.join(FILE);
        fault::check_io(&path, FaultOp::Open)?;
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        let mut bytes = Vec::new();
        fault::check_io(&path, FaultOp::Read)?;
        file.read_to_end(&mut bytes).map_err(|e| io(&path, e))?;
        let mut records = Vec::new();
        let mut pos = 0;
        while bytes.len() - pos >= HEADER {
            let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap());
            if len > RECORD_MAX || bytes.len() - pos - HEADER < len {
                break;
            }
            let kind = bytes[pos + 8];
            let payload = &bytes[pos + HEADER..pos + HEADER + len];
            if crc32c::crc32c_append(crc32c::crc32c(&[kind]), payload) != crc {
                break;
            }
            records.push((kind, payload.to_vec()));
            pos += HEADER + len;
        }
        if pos < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                valid = pos,
                dropped = bytes.len() - pos,
                "journal: dropping a torn or corrupt tail"
            );
            fault::check_io(&path, FaultOp::Write)?;
            file.set_len(pos as u64).map_err(|e| io(&path, e))?;
        }
        // The records read are raft's stable storage from here on (votes, acknowledged
        // entries), but a process that died between a write and its fdatasync left that
        // write in the page cache, where this read found it and a power loss would
        // drop it: sync what was read (and any cut) before trusting it.
        if !bytes.is_empty() {
            fault::check_io(&path, FaultOp::Sync)?;
            file.sync_all().map_err(|e| io(&path, e))?;
        }
        Ok((
            Journal {
                dir: dir.to_path_buf(),
                file,
                failed: None,
            },
            records,
        ))
    }

    /// Why the journal refuses appends, if it does (see the module docs).
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Appends `records` and makes them durable. An I/O error fails the journal.
    pub fn append(&mut self, records: &[(u8, &[u8])]) -> Result<(), Error> {
        if let Some(why) = &self.failed {
            return Err(Error::Failed(format!(
                "{}: {why}",
                self.dir.join(FILE).display()
            )));
        }
        if records.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for (kind, payload) in records {
            if payload.len() > RECORD_MAX {
                return Err(Error::Config(format!(
                    "journal record of {} bytes exceeds {RECORD_MAX}",
                    payload.len()
                )));
            }
            frame(&mut buf, *kind, payload);
        }
        let path = self.dir.join(FILE);
        let res = fault::check(&path, FaultOp::Write)
            .and_then(|()| self.file.write_all(&buf))
            .and_then(|()| fault::check(&path, FaultOp::Sync))
            .and_then(|()| self.file.sync_data());
        res.map_err(|e| {
            let err = io(&path, e);
            self.failed = Some(err.to_string());
            err
        })
    }

    /// Atomically replaces the journal's contents with `records`. A failure before the
    /// rename leaves the old file in place (and a failed journal failed); one after it
    /// fails the journal.
    pub fn rewrite(&mut self, records: &[(u8, &[u8])]) -> Result<(), Error> {
        let tmp = self.dir.join("journal.tmp");
        let path = self.dir.join(FILE);
        let mut buf = Vec::new();
        for (kind, payload) in records {
            frame(&mut buf, *kind, payload);
        }
        {
            fault::check_io(&tmp, FaultOp::Open)?;
            let mut f = File::create(&tmp).map_err(|e| io(&tmp, e))?;
            fault::check_io(&tmp, FaultOp::Write)?;
            f.write_all(&buf).map_err(|e| io(&tmp, e))?;
            fault::check_io(&tmp, FaultOp::Sync)?;
            f.sync_all().map_err(|e| io(&tmp, e))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        // From here on `self.file` is the replaced file: appends to it would be lost,
        // so an error fails the journal.
        let reopened = fault::check_io(&self.dir, FaultOp::Sync)
            .and_then(|()| {
                File::open(&self.dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| io(&self.dir, e))
            })
            .and_then(|()| {
                OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .map_err(|e| io(&path, e))
            });
        match reopened {
            Ok(file) => {
                self.file = file;
                // The file holds exactly `records`: whatever a failed append left is gone.
                self.failed = None;
                Ok(())
            }
            Err(e) => {
                self.failed = Some(e.to_string());
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopen_and_a_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, recs) = Journal::open(dir.path()).unwrap();
            assert!(recs.is_empty());
            j.append(&[(1, b"one"), (2, b"")]).unwrap();
            j.append(&[(3, b"three")]).unwrap();
        }
        // A crash mid-append: half a record at the end, then a flipped bit in another.
        let path = dir.path().join(FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let good = bytes.len();
        bytes.extend_from_slice(&[9, 0, 0, 0, 1, 2]);
        std::fs::write(&path, &bytes).unwrap();
        {
            let (mut j, recs) = Journal::open(dir.path()).unwrap();
            assert_eq!(
                recs,
                vec![(1, b"one".to_vec()), (2, vec![]), (3, b"three".to_vec())]
            );
            assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, good);
            j.append(&[(4, b"four")]).unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let (_, recs) = Journal::open(dir.path()).unwrap();
        assert_eq!(
            recs.len(),
            3,
            "the corrupt record and anything after is gone"
        );
    }

    /// Arms `ops` for paths under `dir` (unique per test: rules are process-global and
    /// tests run in parallel), disarmed on drop.
    struct Armed(String);

    impl Armed {
        fn new(dir: &Path, ops: &[FaultOp]) -> Armed {
            let marker = dir.display().to_string();
            for &op in ops {
                fault::arm(fault::FaultRule {
                    op,
                    errno: 28,
                    path_contains: marker.clone(),
                });
            }
            Armed(marker)
        }
    }

    impl Drop for Armed {
        fn drop(&mut self) {
            fault::disarm(&self.0);
        }
    }

    #[test]
    fn a_failed_append_fails_the_journal_until_a_rewrite() {
        for op in [FaultOp::Write, FaultOp::Sync] {
            let dir = tempfile::tempdir().unwrap();
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            j.append(&[(1, b"kept")]).unwrap();
            let armed = Armed::new(dir.path(), &[op]);
            let err = j.append(&[(2, b"lost")]).unwrap_err();
            assert!(err.to_string().contains("os error 28"), "{op:?}: {err}");
            drop(armed);
            // The fault is gone; the journal still refuses (a torn record would hide
            // every later one from the next open).
            assert!(matches!(j.append(&[(3, b"x")]), Err(Error::Failed(_))));
            assert!(j.failure().is_some());
            let (_, recs) = Journal::open(dir.path()).unwrap();
            assert_eq!(recs[0], (1, b"kept".to_vec()), "{op:?}");
            // A rewrite replaces the file, and the journal works again.
            j.rewrite(&[(5, b"snap")]).unwrap();
            assert_eq!(j.failure(), None);
            j.append(&[(6, b"after")]).unwrap();
            drop(j);
            let (_, recs) = Journal::open(dir.path()).unwrap();
            assert_eq!(recs, vec![(5, b"snap".to_vec()), (6, b"after".to_vec())]);
        }
    }

    #[test]
    fn open_and_rewrite_faults_fail_and_leave_the_journal_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        j.append(&[(1, b"a")]).unwrap();
        {
            let _armed = Armed::new(dir.path(), &[FaultOp::Open]);
            assert!(matches!(Journal::open(dir.path()), Err(Error::Io { .. })));
        }
        {
            let _armed = Armed::new(dir.path(), &[FaultOp::Read]);
            assert!(matches!(Journal::open(dir.path()), Err(Error::Io { .. })));
        }
        {
            // Open syncs the records it read before raft counts them as stable (a
            // killed process may have written them without a sync), so a sync that
            // fails fails the open.
            let _armed = Armed::new(dir.path(), &[FaultOp::Sync]);
            assert!(matches!(Journal::open(dir.path()), Err(Error::Io { .. })));
        }
        {
            let _armed = Armed::new(dir.path(), &[FaultOp::Write]);
            assert!(j.rewrite(&[(9, b"z")]).is_err());
        }
        // A rewrite that failed before its rename leaves the old file and a usable
        // journal.
        assert_eq!(j.failure(), None);
        j.append(&[(2, b"b")]).unwrap();
        drop(j);
        let (_, recs) = Journal::open(dir.path()).unwrap();
        assert_eq!(recs, vec![(1, b"a".to_vec()), (2, b"b".to_vec())]);
    }

    #[test]
    fn rewrite_replaces_everything() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        j.append(&[(1, b"a"), (1, b"b")]).unwrap();
        j.rewrite(&[(5, b"snap")]).unwrap();
        j.append(&[(1, b"c")]).unwrap();
        drop(j);
        let (_, recs) = Journal::open(dir.path()).unwrap();
        assert_eq!(recs, vec![(5, b"snap".to_vec()), (1, b"c".to_vec())]);
        assert!(!dir.path().join("journal.tmp").exists());
    }
}
