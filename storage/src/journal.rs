//! A small durable journal of typed records, for metadata (the raft log, hard state
//! and snapshots of the metadata quorum) rather than partition data.
//!
//! One file, `journal`, of records `[len u32 LE][crc32c u32 LE][kind u8][payload]`
//! where the CRC covers kind and payload. [`Journal::append`] writes and fdatasyncs
//! before returning. [`Journal::open`] reads records up to the first torn or corrupt
//! one and truncates the file there: a crash mid-append loses only the unsynced tail,
//! which raft never acknowledged. [`Journal::rewrite`] replaces the whole file
//! atomically (temporary file, fsync, rename, fsync of the directory) for compaction.
//!
//! Blocking std I/O, on purpose: metadata writes are few and small, happen on the
//! controller shard only, and must not share the data path's DMA machinery. The time
//! they take is a few fdatasyncs per metadata change.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

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
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        let mut bytes = Vec::new();
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
            file.set_len(pos as u64).map_err(|e| io(&path, e))?;
            file.sync_all().map_err(|e| io(&path, e))?;
        }
        Ok((
            Journal {
                dir: dir.to_path_buf(),
                file,
            },
            records,
        ))
    }

    /// Appends `records` and makes them durable.
    pub fn append(&mut self, records: &[(u8, &[u8])]) -> Result<(), Error> {
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
        self.file.write_all(&buf).map_err(|e| io(&path, e))?;
        self.file.sync_data().map_err(|e| io(&path, e))
    }

    /// Atomically replaces the journal's contents with `records`.
    pub fn rewrite(&mut self, records: &[(u8, &[u8])]) -> Result<(), Error> {
        let tmp = self.dir.join("journal.tmp");
        let path = self.dir.join(FILE);
        let mut buf = Vec::new();
        for (kind, payload) in records {
            frame(&mut buf, *kind, payload);
        }
        {
            let mut f = File::create(&tmp).map_err(|e| io(&tmp, e))?;
            f.write_all(&buf).map_err(|e| io(&tmp, e))?;
            f.sync_all().map_err(|e| io(&tmp, e))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io(&self.dir, e))?;
        self.file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        Ok(())
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
