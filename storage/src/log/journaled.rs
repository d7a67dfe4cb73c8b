//! A log's side of the shard journal ([`crate::wal`]): what it pushes there besides
//! appends (truncations, resets, deletion), the sync of its segment file a checkpoint
//! asks for, and the replay of the journal into the log — at start-up for the previous
//! run's journals, and when a log that failed is reopened.

use std::cell::Cell;
use std::rc::Rc;

use bytes::Bytes;

use crate::batch::BatchHeader;
use crate::file;
use crate::wal::{self, Op, Pushed};
use crate::{Error, FlushPolicy, LogConfig};

use super::{PartitionLog, Staged, Storage};

/// Logs a start-up replay opens and replays at once, at most the shard's active logs
/// (see [`Storage::replay_logs`]).
const REPLAY_LANES: usize = 64;
/// Bytes of a log's replayed batches staged before their writes are awaited: bounds the
/// copies a replay holds per log (a log can have most of the journal's chunks).
const REPLAY_STAGED_BYTES: usize = 8 << 20;

/// What a replay did to one log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    pub appended: u64,
    pub skipped: u64,
    pub cut: u64,
    /// A batch that would have left a gap was skipped.
    pub gap: bool,
}

impl Replayed {
    fn add(&mut self, r: Replayed) {
        self.appended += r.appended;
        self.skipped += r.skipped;
        self.cut += r.cut;
        self.gap |= r.gap;
    }
}

impl PartitionLog {
    pub(crate) fn id(&self) -> crate::cache::LogId {
        self.id
    }

    pub(crate) fn me(&self) -> std::rc::Weak<PartitionLog> {
        self.me.clone()
    }

    /// Whether this log's appends go to the shard journal now.
    pub(super) fn journaling(&self) -> Option<Rc<wal::Wal>> {
        if self.config.borrow().flush != FlushPolicy::Always {
            return None;
        }
        self.storage.journal()
    }

    /// Pushes `op` (not an append) to the shard journal, if the shard keeps one, and
    /// waits until it is durable: before the change it records touches any file, so a
    /// replay never brings back what it removed.
    pub(super) async fn journal_op(&self, op: Op) -> Result<(), Error> {
        let Some(journal) = self.storage.journal() else {
            return Ok(());
        };
        journal.ready().await?;
        let pushed = journal.push_change(self, &op)?;
        pushed.durable().await
    }

    /// Notes an append's journal record: what [`PartitionLog::flush`] waits for.
    pub(super) fn journaled(&self, pushed: Pushed) {
        *self.last_journaled.borrow_mut() = Some(pushed);
    }

    /// Starts writing the active segment's unwritten bytes behind the journal if the
    /// log had no journaled append for `idle_ms` (see [`crate::wal::Wal::write_behind_idle`]).
    /// False while it is not idle yet (the journal asks again); a closed log's bytes
    /// were written by its close.
    pub(crate) fn write_behind_if_idle(&self, now_ms: i64, idle_ms: i64) -> bool {
        if self.closed.get() {
            return true;
        }
        if now_ms - self.last_journaled_ms.get() < idle_ms {
            return false;
        }
        let file = {
            let st = self.state.borrow();
            st.active().active.as_ref().map(|a| a.log.clone())
        };
        if let Some(f) = file {
            f.write_behind(1);
        }
        true
    }

    /// Writes the active segment's bytes accepted so far to its own file, unsynced (a
    /// journal checkpoint, which then syncs every log's file in one round:
    /// [`crate::file::sync_written_together`]); the sealed segments were synced when
    /// they were sealed. The file written, if the log has an active segment file: a log
    /// being closed still has it until its seal made it durable, and the checkpoint must
    /// not count it done before that.
    pub(crate) async fn write_segment(&self) -> Result<Option<Rc<file::AppendFile>>, Error> {
        self.guarded(async {
            let file = {
                let st = self.state.borrow();
                st.active().active.as_ref().map(|a| a.log.clone())
            };
            if let Some(f) = &file {
                f.wait_written(f.len()).await?;
            }
            Ok(file)
        })
        .await
    }

    /// Applies a journal's records for this log, in order (see [`crate::wal`]).
    pub(super) async fn replay(&self, ops: Vec<Op>) -> Result<Replayed, Error> {
        let mut staged = Vec::new();
        let applied = self.replay_ops(ops, &mut staged).await;
        // Whatever happened, an error returns only once no write of the log is in flight.
        let written = self.written_all(&mut staged).await;
        let done = applied?;
        written?;
        Ok(done)
    }

    /// [`Self::replay`]'s records. Appends are staged and their writes awaited together
    /// (before a cut, once [`REPLAY_STAGED_BYTES`] are pending, and at the end): waited
    /// for one by one, each rewrote the segment's tail page, about 200 KB written per
    /// log for 30 small batches.
    async fn replay_ops(&self, ops: Vec<Op>, staged: &mut Vec<Staged>) -> Result<Replayed, Error> {
        let mut done = Replayed::default();
        let ops = without_cut_appends(ops);
        let last = ops.len().saturating_sub(1);
        let mut pending = 0;
        for (i, op) in ops.into_iter().enumerate() {
            let end = self.log_end_offset();
            if !matches!(op, Op::Append(_)) || pending >= REPLAY_STAGED_BYTES {
                self.written_all(staged).await?;
                pending = 0;
            }
            match op {
                Op::Append(batch) => {
                    let h = BatchHeader::parse(&batch)?;
                    if h.last_offset() < end {
                        done.skipped += 1;
                        continue;
                    }
                    if h.base_offset != end {
                        tracing::warn!(log = %self.name, base = h.base_offset, end, "journal replay skips a batch that does not continue the log");
                        done.gap = true;
                        continue;
                    }
                    pending += batch.len();
                    let (_, write) = self.append_with_offsets_staged(batch).await?;
                    staged.extend(write);
                    done.appended += 1;
                }
                // A truncation is durable once done, and the log's appends wait for
                // it: only one that is the log's last record may not have completed.
                // (Redoing an earlier one would cut what compaction or DeleteRecords
                // changed since, and put back the journal's originals.)
                Op::Truncate(offset) => {
                    if i == last && end > offset && offset >= self.log_start_offset() {
                        self.truncate_to(offset).await?;
                        done.cut += 1;
                    }
                }
                Op::Reset(offset) => {
                    if end < offset {
                        self.reset_to(offset).await?;
                        done.cut += 1;
                    }
                }
                Op::Delete => {}
            }
        }
        Ok(done)
    }

    async fn written_all(&self, staged: &mut Vec<Staged>) -> Result<(), Error> {
        for write in staged.drain(..) {
            self.written(write).await?;
        }
        Ok(())
    }
}

/// `ops` without the appends a later truncation or reset of the log removed: the
/// segment files may hold the log as it was after that change, where such a batch
/// would seem to continue the log, and a truncation below the log start is not
/// redone (it completed before the start moved past it).
fn without_cut_appends(ops: Vec<Op>) -> Vec<Op> {
    let mut cut_from = i64::MAX;
    let mut kept: Vec<Op> = Vec::with_capacity(ops.len());
    for op in ops.into_iter().rev() {
        match &op {
            Op::Append(batch) => {
                let last = BatchHeader::parse(batch).map_or(i64::MAX, |h| h.last_offset());
                if last >= cut_from {
                    continue;
                }
            }
            Op::Truncate(offset) => cut_from = cut_from.min(*offset),
            Op::Reset(_) => cut_from = i64::MIN,
            Op::Delete => {}
        }
        kept.push(op);
    }
    kept.reverse();
    kept
}

impl Storage {
    /// After a clean stop closed every log ([`Storage::close_logs`]) without failures:
    /// the journal's chunks hold nothing the segment files lack, so they go, and the
    /// next start replays nothing.
    pub async fn stop_journal(&self) -> Result<(), Error> {
        match self.journal() {
            Some(j) => j.clear().await,
            None => Ok(()),
        }
    }

    /// Opens each log and replays its records, [`REPLAY_LANES`] logs at a time (at most
    /// the shard's active logs): one after the other, each open and append waited for
    /// on its own, 10,000 logs took 90 s to replay 310,000 records. Logs are independent
    /// of each other here. After a failure the lanes start no other log; each failure is
    /// logged with its log's name and one is returned.
    async fn replay_logs(
        self: &Rc<Self>,
        work: Vec<(String, Vec<Op>)>,
    ) -> Result<(Replayed, Vec<Rc<PartitionLog>>), Error> {
        let lanes = REPLAY_LANES.min(self.limits.active_logs_max).max(1);
        let mut shares: Vec<Vec<(String, Vec<Op>)>> = (0..lanes).map(|_| Vec::new()).collect();
        for (i, w) in work.into_iter().enumerate() {
            shares[i % lanes].push(w);
        }
        let failed = Rc::new(Cell::new(false));
        let tasks: Vec<_> = shares
            .into_iter()
            .filter(|l| !l.is_empty())
            .map(|share| {
                let (me, failed) = (self.clone(), failed.clone());
                glommio::spawn_local(async move {
                    let mut replayed = Replayed::default();
                    let mut logs = Vec::with_capacity(share.len());
                    for (name, ops) in share {
                        if failed.get() {
                            break;
                        }
                        let config = LogConfig {
                            max_message_bytes: u32::MAX as usize,
                            ..LogConfig::default()
                        };
                        let res = match me.open_log(&name, config).await {
                            Ok(log) => {
                                let r = log.replay(ops).await;
                                logs.push(log);
                                r
                            }
                            Err(e) => Err(e),
                        };
                        match res {
                            Ok(r) => replayed.add(r),
                            Err(e) => {
                                tracing::error!(log = %name, error = %e, "journal replay into the log failed");
                                failed.set(true);
                                return (replayed, logs, Err(e));
                            }
                        }
                    }
                    (replayed, logs, Ok(()))
                })
            })
            .collect();
        let mut total = Replayed::default();
        let mut all = Vec::new();
        let mut first_error = None;
        for t in tasks {
            let (r, logs, res) = t.await;
            total.add(r);
            all.extend(logs);
            if let Err(e) = res {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok((total, all)),
        }
    }

    /// Replays the previous run's journals (see [`crate::wal`]): this shard's, and on
    /// shard 0 those of shards beyond the current count. Then deletes them.
    pub(super) async fn replay_journals(self: &Rc<Self>) -> Result<(), Error> {
        let (shard, shards) = (self.limits.shard, self.limits.shards);
        let dirs: Vec<_> = wal::dirs_in(&self.dir)?
            .into_iter()
            .filter(|(s, _)| *s == shard || (shard == 0 && *s >= shards))
            .collect();
        for (_, dir) in dirs {
            let chunks = wal::chunks_in(&dir)?;
            let mut records = Vec::new();
            for (_, path) in &chunks {
                let buf = std::fs::read(path).map_err(|e| Error::io(path, e))?;
                records.extend(wal::decode(&Bytes::from(buf)));
            }
            let count = records.len();
            // A log whose directory is gone was deleted (its deletion's record may not
            // have been written before the directory went).
            let work: Vec<(String, Vec<Op>)> = wal::by_log(records)
                .into_iter()
                .filter(|(name, ops)| !ops.is_empty() && self.dir.join(name).is_dir())
                .collect();
            let t = std::time::Instant::now();
            let (replayed, logs) = self.replay_logs(work).await?;
            let replay_ms = t.elapsed().as_millis() as u64;
            let opened = logs.len();
            let t = std::time::Instant::now();
            let report = self.close_logs(logs).await;
            let close_ms = t.elapsed().as_millis() as u64;
            if let Some((name, e)) = report.failed.into_iter().next() {
                return Err(Error::Config(format!(
                    "replaying the journal {} into {name} failed: {e}",
                    dir.display()
                )));
            }
            for (_, path) in &chunks {
                file::remove(path).await.map_err(|e| Error::io(path, e))?;
            }
            std::fs::remove_dir(&dir).map_err(|e| Error::io(&dir, e))?;
            file::sync_dir(&self.dir).await?;
            tracing::info!(journal = %dir.display(), records = count, logs = opened, appended = replayed.appended, already_there = replayed.skipped, cuts = replayed.cut, replay_ms, close_ms, "replayed the previous run's journal");
        }
        Ok(())
    }
}
