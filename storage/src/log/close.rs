//! Closing: one log's close (flushed, indexes written, a producer snapshot at the log
//! end, and last `partition.clean`, the record that lets the next open skip
//! recovery), the shard's clean stop closing all its logs in rounds with one
//! file-system sync each ([`Storage::close_logs`]), and the record's removal before the
//! first change after a clean open. `recovery.rs` reads the record.

use std::rc::Rc;
use std::time::Duration;

use crate::file;
use crate::small_files::{self, FileWrite};
use crate::Error;

use super::active::release_file;
use super::{snapshot_file_name, PartitionLog, Storage, CLEAN_FILE, CLEAN_HEADER};

/// Logs one round of a clean stop closes together ([`Storage::close_logs`]): each round
/// ends with one file-system sync, so fewer, larger rounds sync less; the bound keeps
/// the files a round holds in memory (indexes, snapshots) small.
const CLOSE_ROUND_LOGS: usize = 1024;

/// Logs of a round that run their first step ([`PartitionLog::close_begin`]) at once:
/// each may wait on a sync of its `.log` (data not yet durable) and on its trim.
const CLOSE_LANES: usize = 32;

/// What a log's clean close still writes after [`PartitionLog::close_begin`].
struct RoundClose {
    /// Indexes, `.txnindex` and the producer snapshot.
    writes: Vec<FileWrite>,
    /// The snapshot's offset, if one is among `writes`.
    snapshot: Option<i64>,
    /// `partition.clean`, written only once the `writes` are durable.
    marker: FileWrite,
}

/// What [`Storage::close_logs`] did.
#[derive(Debug, Default)]
pub struct CloseReport {
    /// Logs now marked clean (`partition.clean` written and synced).
    pub marked_clean: usize,
    /// Logs that needed nothing: unchanged since a clean open, or closed already.
    pub unchanged: usize,
    /// Logs whose close failed, with the error: they are recovered when next opened.
    pub failed: Vec<(String, Error)>,
    /// File-system syncs made (one per round, and one for the last round's records).
    pub fs_syncs: u32,
    /// Time spent in each step, over all rounds: making the `.log`s durable and trimming
    /// them, writing the indexes and snapshots, the syncs, writing the records.
    pub begin: Duration,
    pub write: Duration,
    pub sync: Duration,
    pub records: Duration,
}

impl Storage {
    /// Closes `logs` for a clean stop (every log of the shard) with one file-system
    /// sync per round of [`CLOSE_ROUND_LOGS`] logs instead of syncs per file: each log's
    /// `.log` is made durable and trimmed, the round's indexes and producer snapshots
    /// are written without syncs ([`crate::small_files`]), one `syncfs` makes them
    /// durable, and only then are the round's `partition.clean` records written; the
    /// next round's sync (or a last one) makes those durable. So a record on disk only
    /// ever describes durable files, as with [`PartitionLog::close`], which closes one
    /// log with a sync per file (a lone close should not write back the whole file
    /// system). A log whose close fails is failed and left without a record: its next
    /// open recovers it.
    pub async fn close_logs(&self, logs: Vec<Rc<PartitionLog>>) -> CloseReport {
        let mut report = CloseReport::default();
        // Opened before the first write its syncs answer for (see `FileSystem`).
        let fs = small_files::FileSystem::open(&self.dir).await;
        let mut unsynced_records = false;
        let mut logs = logs.into_iter().peekable();
        while logs.peek().is_some() {
            let round: Vec<Rc<PartitionLog>> = logs.by_ref().take(CLOSE_ROUND_LOGS).collect();
            let t = std::time::Instant::now();
            let begun = begin_round(round).await;
            report.begin += t.elapsed();
            let mut pending = Vec::with_capacity(begun.len());
            for (log, res) in begun {
                match res {
                    Ok(Some(close)) => pending.push((log, close)),
                    Ok(None) => report.unchanged += 1,
                    Err(e) => report.failed.push((log.name.clone(), e)),
                }
            }
            if pending.is_empty() {
                continue;
            }
            let groups = pending
                .iter_mut()
                .map(|(_, c)| std::mem::take(&mut c.writes))
                .collect();
            let t = std::time::Instant::now();
            let written = small_files::write_unsynced(groups).await;
            report.write += t.elapsed();
            let mut durable = Vec::with_capacity(pending.len());
            for ((log, close), res) in pending.into_iter().zip(written) {
                match res {
                    Ok(()) => durable.push((log, close)),
                    Err(e) => close_failed(&mut report, &log, e),
                }
            }
            // The barrier: the records below describe only files this sync made durable
            // (and it makes the previous round's records durable too).
            report.fs_syncs += 1;
            let t = std::time::Instant::now();
            let synced = fs.sync().await;
            report.sync += t.elapsed();
            if let Err(e) = synced {
                let cause = e.to_string();
                for (log, _) in durable {
                    let e = Error::io(&self.dir, std::io::Error::other(cause.clone()));
                    close_failed(&mut report, &log, e);
                }
                continue;
            }
            unsynced_records = false;
            let (closed, markers): (Vec<_>, Vec<_>) = durable
                .into_iter()
                .map(|(log, c)| ((log, c.snapshot), vec![c.marker]))
                .unzip();
            let t = std::time::Instant::now();
            let written = small_files::write_unsynced(markers).await;
            report.records += t.elapsed();
            for ((log, snapshot), res) in closed.into_iter().zip(written) {
                if let Some(end) = snapshot {
                    log.snapshots.borrow_mut().insert(end);
                }
                match res {
                    Ok(()) => {
                        log.clean_marker.set(true);
                        self.cache.borrow_mut().invalidate(log.id);
                        report.marked_clean += 1;
                        unsynced_records = true;
                    }
                    Err(e) => close_failed(&mut report, &log, e),
                }
            }
        }
        if unsynced_records {
            report.fs_syncs += 1;
            let t = std::time::Instant::now();
            let synced = fs.sync().await;
            report.sync += t.elapsed();
            if let Err(e) = synced {
                // The records' state is unknown: each describes durable files, so one
                // that reached the disk is right and one that did not means recovery.
                tracing::error!(error = %e, "syncing the last clean-close records failed");
                report.failed.push((self.dir.display().to_string(), e));
            }
        }
        report
    }
}

/// A log and the outcome of its [`PartitionLog::close_begin`].
type Begun = (Rc<PartitionLog>, Result<Option<RoundClose>, Error>);

/// The first step of a round's closes, [`CLOSE_LANES`] at a time; results in order.
async fn begin_round(round: Vec<Rc<PartitionLog>>) -> Vec<Begun> {
    let n = round.len();
    let mut lanes: Vec<Vec<(usize, Rc<PartitionLog>)>> =
        (0..CLOSE_LANES).map(|_| Vec::new()).collect();
    for (i, log) in round.into_iter().enumerate() {
        lanes[i % CLOSE_LANES].push((i, log));
    }
    let tasks: Vec<_> = lanes
        .into_iter()
        .filter(|l| !l.is_empty())
        .map(|lane| {
            glommio::spawn_local(async move {
                let mut out = Vec::with_capacity(lane.len());
                for (i, log) in lane {
                    let res = log.close_begin().await;
                    out.push((i, log, res));
                }
                out
            })
        })
        .collect();
    let mut done: Vec<Option<Begun>> = (0..n).map(|_| None).collect();
    for t in tasks {
        for (i, log, res) in t.await {
            done[i] = Some((log, res));
        }
    }
    done.into_iter()
        .map(|d| d.expect("every log of the round ran"))
        .collect()
}

/// A log whose clean close failed after its first step: failed (so nothing else uses
/// it), and left without a record.
fn close_failed(report: &mut CloseReport, log: &Rc<PartitionLog>, e: Error) {
    log.note_failure(&e);
    log.storage.cache.borrow_mut().invalidate(log.id);
    report.failed.push((log.name.clone(), e));
}

impl PartitionLog {
    /// Before the first change to the log's files after a clean open: removes
    /// `partition.clean`, durably, since it no longer describes them.
    pub(super) async fn drop_clean_marker(&self) -> Result<(), Error> {
        if !self.clean_marker.get() {
            return Ok(());
        }
        let path = self.dir.join(CLEAN_FILE);
        match file::remove(&path).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&path, e)),
        }
        file::sync_dir(&self.dir).await?;
        self.clean_marker.set(false);
        Ok(())
    }

    /// The last step of a clean close: records every segment in `partition.clean`.
    async fn write_clean_marker(&self) -> Result<(), Error> {
        let text = self.clean_marker_text();
        file::write_atomic(&self.dir.join(CLEAN_FILE), text.as_bytes()).await?;
        self.clean_marker.set(true);
        Ok(())
    }

    /// What `partition.clean` records: every segment's base, end, size and largest
    /// timestamp.
    fn clean_marker_text(&self) -> String {
        let mut text = format!("{CLEAN_HEADER}\n");
        for s in &self.state.borrow().segments {
            text.push_str(&format!(
                "{} {} {} {}\n",
                s.base_offset, s.next_offset, s.size, s.max_timestamp
            ));
        }
        text
    }

    /// Flushes, writes the indexes in full and stops accepting work.
    ///
    /// A failed log is only marked closed (nothing is written: its files' state is
    /// unknown) and answers [`Error::Failed`]; recovery sorts its files out when it is
    /// opened again.
    pub async fn close(&self) -> Result<(), Error> {
        if self.closed.get() {
            return Ok(());
        }
        if let Some(cause) = self.failure() {
            self.closed.set(true);
            self.storage.cache.borrow_mut().invalidate(self.id);
            return Err(Error::Failed(cause));
        }
        self.guarded(self.close_unguarded()).await
    }

    async fn close_unguarded(&self) -> Result<(), Error> {
        let _guard = self.lock().await;
        self.closed.set(true);
        self.storage.forget_active(self.id);
        if self.clean_marker.get() {
            // Nothing changed since a clean open: the files are as recorded.
            self.storage.cache.borrow_mut().invalidate(self.id);
            return Ok(());
        }
        let files = {
            let st = self.state.borrow();
            st.active().active.as_ref().map(|a| a.log.clone())
        };
        // Closed files (an idle log's, or never opened since recovery) left their
        // indexes complete on disk unless entries were added since.
        self.seal_active(files).await?;
        let end = self.state.borrow().log_end();
        // The next open then loads this and replays nothing.
        if !self.snapshots.borrow().contains(&end) {
            let snapshot = self.producers.borrow().encode_snapshot(end);
            self.write_snapshot(end, &snapshot).await?;
        }
        // Last: the next open reads no segment.
        self.write_clean_marker().await?;
        self.storage.cache.borrow_mut().invalidate(self.id);
        Ok(())
    }

    /// A clean stop's first step for this log ([`Storage::close_logs`]): under the lock,
    /// marks it closed (nothing changes its files after this), makes its `.log` durable
    /// and trims it ([`release_file`]), and returns the files the close still writes,
    /// as [`Self::close`] would but without syncing them: the indexes and `.txnindex`
    /// changed since last written, the producer snapshot at the log end, and last
    /// `partition.clean`. `None`: nothing to write (closed already, or unchanged since a
    /// clean open). A failed log is only marked closed, as by [`Self::close`].
    async fn close_begin(&self) -> Result<Option<RoundClose>, Error> {
        if self.closed.get() {
            return Ok(None);
        }
        if let Some(cause) = self.failure() {
            self.closed.set(true);
            self.storage.cache.borrow_mut().invalidate(self.id);
            return Err(Error::Failed(cause));
        }
        self.guarded(self.close_begin_unguarded()).await
    }

    async fn close_begin_unguarded(&self) -> Result<Option<RoundClose>, Error> {
        let _guard = self.lock().await;
        if self.closed.replace(true) {
            return Ok(None);
        }
        self.storage.forget_active(self.id);
        if self.clean_marker.get() {
            // Nothing changed since a clean open: the files are as recorded.
            self.storage.cache.borrow_mut().invalidate(self.id);
            return Ok(None);
        }
        let file = {
            let st = self.state.borrow();
            st.active().active.as_ref().map(|a| a.log.clone())
        };
        if let Some(f) = &file {
            release_file(f).await?;
        }
        let mut writes = Vec::new();
        let end = {
            let st = self.state.borrow();
            let seg = st.active();
            if seg.indexes_dirty {
                writes.extend(seg.index_files().into_writes());
            }
            if seg.txn_dirty {
                writes.push(seg.txn_index_file().into_write());
            }
            st.log_end()
        };
        let snapshot = (!self.snapshots.borrow().contains(&end)).then_some(end);
        if let Some(end) = snapshot {
            let bytes = self.producers.borrow().encode_snapshot(end);
            writes.push(FileWrite::write(
                self.dir.join(snapshot_file_name(end)),
                bytes,
            ));
        }
        Ok(Some(RoundClose {
            writes,
            snapshot,
            marker: FileWrite::write(
                self.dir.join(CLEAN_FILE),
                self.clean_marker_text().into_bytes(),
            ),
        }))
    }
}
