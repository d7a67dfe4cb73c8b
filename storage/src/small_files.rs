//! Small whole files (indexes, producer snapshots, `partition.clean`) of many logs
//! written without a sync each, and the one file-system sync that then makes all of
//! them durable: the clean stop's rounds ([`crate::Storage::close_logs`], issue 14), and
//! the broker's rounds of leader-epoch checkpoints ([`write_durably`]).
//!
//! Why: a clean close of one log writes up to four small files, each atomically and
//! durably on its own ([`crate::file::write_atomic`]: temp file, fdatasync, trim,
//! fdatasync, rename, directory fsync). At 10,000 partitions a stop was ~50,000 of
//! those syncs and 40-70 s. Here every file of a round goes to a temp file and is
//! renamed over its name (so a reader sees the old or the new contents, never a mix),
//! all of it in one job on the shard's blocking thread (buffered writes to the page
//! cache: no DMA open, no `statfs`, no sync), and one `syncfs(2)` of the data
//! directory's file system afterwards makes every file, rename and trim before it
//! durable (it writes back every dirty page and inode there and commits the journal,
//! with the device cache flush that an fdatasync makes).
//!
//! Nothing here is durable before that sync returns: callers order what depends on
//! these files (a log's `partition.clean`) after it.

use std::path::{Path, PathBuf};

use crate::fault::{self, FaultOp};
use crate::{simdisk, Error};

/// One file to write whole (`Some`) or remove (`None`: empty contents mean an absent
/// file, and an absent file stays absent).
#[derive(Debug)]
pub(crate) struct FileWrite {
    pub path: PathBuf,
    pub bytes: Option<Vec<u8>>,
}

impl FileWrite {
    pub fn write(path: PathBuf, bytes: Vec<u8>) -> FileWrite {
        FileWrite {
            path,
            bytes: Some(bytes),
        }
    }

    pub fn remove(path: PathBuf) -> FileWrite {
        FileWrite { path, bytes: None }
    }
}

/// Writes (or removes) each group's files in order, without syncing, on the shard's
/// blocking thread; a group stops at its first error. Returns one result per group.
/// The injected faults ([`fault`]) are checked here, on the executor, as for every
/// other write of a partition file: a write fault fails the group.
pub(crate) async fn write_unsynced(groups: Vec<Vec<FileWrite>>) -> Vec<Result<(), Error>> {
    let mut results: Vec<Option<Result<(), Error>>> = Vec::with_capacity(groups.len());
    let mut todo = Vec::with_capacity(groups.len());
    for (i, group) in groups.into_iter().enumerate() {
        match check_faults(&group) {
            Ok(()) => {
                results.push(None);
                todo.push((i, group));
            }
            Err(e) => results.push(Some(Err(e))),
        }
    }
    if !todo.is_empty() {
        let done = glommio::executor()
            .spawn_blocking(move || {
                todo.into_iter()
                    .map(|(i, group)| (i, write_group(&group)))
                    .collect::<Vec<_>>()
            })
            .await;
        for (i, res) in done {
            results[i] = Some(res.map_err(|(path, e)| Error::io(&path, e)));
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every group has a result"))
        .collect()
}

fn check_faults(group: &[FileWrite]) -> Result<(), Error> {
    for f in group {
        simdisk::alive().map_err(|e| Error::io(&f.path, e))?;
        fault::check_io(&f.path, FaultOp::Open)?;
        if f.bytes.is_some() {
            fault::check_io(&f.path, FaultOp::Write)?;
        }
    }
    Ok(())
}

/// On the blocking thread: the group's files, in order.
fn write_group(group: &[FileWrite]) -> Result<(), (PathBuf, std::io::Error)> {
    for f in group {
        match &f.bytes {
            Some(bytes) => {
                let mut tmp_name = f.path.file_name().unwrap_or_default().to_os_string();
                tmp_name.push(".tmp");
                let tmp = f.path.with_file_name(tmp_name);
                std::fs::write(&tmp, bytes).map_err(|e| (tmp.clone(), e))?;
                std::fs::rename(&tmp, &f.path).map_err(|e| (f.path.clone(), e))?;
            }
            None => match std::fs::remove_file(&f.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err((f.path.clone(), e)),
            },
        }
    }
    Ok(())
}

/// Writes each of `files` whole (temp file, rename), all in one job on the shard's
/// blocking thread, then makes them durable together with one `syncfs(2)` of the file
/// system holding `dir` (where they all live). One result per file, in order: `Ok`
/// only once the sync returned, so a caller may order what depends on a file after
/// it. A failed sync fails every file. For many small files at once (the replicas'
/// leader-epoch checkpoints of a leadership change or a fetch round that brought
/// thousands of partitions their first batch of an epoch): one sync for all of them
/// instead of a data sync, a rename and a directory sync each.
pub async fn write_durably(dir: &Path, files: Vec<(PathBuf, Vec<u8>)>) -> Vec<Result<(), Error>> {
    let fs = FileSystem::open(dir).await;
    let groups = files
        .into_iter()
        .map(|(path, bytes)| vec![FileWrite::write(path, bytes)])
        .collect();
    let written = write_unsynced(groups).await;
    if written.iter().all(|r| r.is_err()) {
        return written;
    }
    match fs.sync().await {
        Ok(()) => written,
        Err(e) => {
            let cause = e.to_string();
            written
                .into_iter()
                .map(|r| r.and(Err(Error::io(dir, std::io::Error::other(cause.clone())))))
                .collect()
        }
    }
}

/// The file system holding a directory, opened for `syncfs(2)`. Open it before the
/// writes its sync must answer for: since Linux 5.8 `syncfs` reports a write-back error
/// only to descriptors opened before the error happened, so a descriptor opened after
/// a failed background write-back would call the files durable.
pub(crate) struct FileSystem {
    dir: PathBuf,
    /// The open directory, or why it could not be opened (every sync then fails).
    fd: Result<std::sync::Arc<std::fs::File>, String>,
}

impl FileSystem {
    /// Opens `dir` on the shard's blocking thread.
    pub(crate) async fn open(dir: &Path) -> FileSystem {
        let path = dir.to_path_buf();
        let fd = glommio::executor()
            .spawn_blocking(move || std::fs::File::open(&path))
            .await
            .map(std::sync::Arc::new)
            .map_err(|e| e.to_string());
        FileSystem {
            dir: dir.to_path_buf(),
            fd,
        }
    }

    /// Makes durable everything written, renamed, removed or trimmed on the file system
    /// before the call (`syncfs(2)` on the shard's blocking thread). A failure means the
    /// state of any of those files is unknown.
    pub(crate) async fn sync(&self) -> Result<(), Error> {
        let dir = &self.dir;
        simdisk::alive().map_err(|e| Error::io(dir, e))?;
        fault::check_io(dir, FaultOp::Sync)?;
        let fd = self
            .fd
            .clone()
            .map_err(|e| Error::io(dir, std::io::Error::other(e)))?;
        let marks = simdisk::fs_sync_marks();
        let res = glommio::executor()
            .spawn_blocking(move || {
                use std::os::fd::AsRawFd;
                crate::file::syncfs(fd.as_raw_fd())
            })
            .await;
        if res.is_ok() {
            simdisk::fs_synced(marks);
        }
        res.map_err(|e| Error::io(dir, e))
    }
}
