//! The append path: a batch is validated, judged against the producer state and the
//! leader fence in the step that gives it its offsets, and staged into the active
//! segment's file ([`Staged`]: appends arriving while a write is in flight go out
//! together in the next one, group commit); then flushed as the topic's flush policy
//! asks.

use std::rc::Rc;

use bytes::{Bytes, BytesMut};

use crate::batch::{self, BatchError};
use crate::cache::CachedBatch;
use crate::file;
use crate::producer::{BatchMeta, TxnError, Verdict};
use crate::{Error, FlushPolicy, TimestampType};

use super::producers::index_completed;
use super::PartitionLog;

/// The result of an append: the offsets the batch was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: i64,
    pub last_offset: i64,
    /// The broker's timestamp for LogAppendTime topics, -1 for CreateTime.
    pub log_append_time_ms: i64,
    pub record_count: i32,
}

/// The outcome of [`PartitionLog::append_checked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    Appended(AppendInfo),
    /// A retry of a batch already in the log (appended again: nothing).
    Duplicate(BatchMeta),
}

/// Whether this broker still leads the partition in a leader epoch (see
/// [`PartitionLog::set_leader_fence`]).
pub type LeaderFence = Box<dyn Fn(i32) -> bool>;

/// Told whenever what a read of the log answers may have changed (see
/// [`PartitionLog::set_on_change`]).
pub type ChangeHook = Box<dyn Fn()>;

/// An appended batch on its way to the device: [`PartitionLog::written`] waits for
/// (and, if no write is in flight, starts) the write that carries it. Dropped
/// unawaited, the bytes stay accepted and go out with the next write of the log.
#[must_use = "an append is acknowledged only once it is written"]
pub struct Staged {
    file: Rc<file::AppendFile>,
    target: u64,
    journaled: bool,
}

impl Staged {
    /// True if the append went to the shard's journal, whose records are written and
    /// synced in the order they were staged (waiting for a later one covers it);
    /// false if it went to its segment file directly.
    pub fn journaled(&self) -> bool {
        self.journaled
    }

    /// True if there are writes and every one went to the shard's journal: waiting for
    /// a later journal write covers them all.
    pub fn all_journaled<'a>(writes: impl IntoIterator<Item = &'a Staged>) -> bool {
        let mut any = false;
        for w in writes {
            if !w.journaled {
                return false;
            }
            any = true;
        }
        any
    }

    /// The outcome of an append once its write (if it made one) is done.
    async fn settle(appended: (Judged, Option<Staged>)) -> Result<Judged, Error> {
        let (judged, staged) = appended;
        if let Some(s) = staged {
            s.file.wait_written(s.target).await?;
        }
        Ok(judged)
    }
}

/// The outcome of [`PartitionLog::append_judged`] and [`PartitionLog::append_marker`]:
/// [`Checked`] plus refusals by the transaction rules. (A separate type so that
/// callers matching [`Checked`] or [`Error`] exhaustively keep compiling; the broker
/// maps [`TxnError`] to Kafka's codes: `NotTransactional` → INVALID_TXN_STATE,
/// `CoordinatorFenced` → TRANSACTION_COORDINATOR_FENCED.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    Appended(AppendInfo),
    /// A retry of a batch already in the log (appended again: nothing).
    Duplicate(BatchMeta),
    /// Refused by the transaction rules; nothing appended.
    Refused(TxnError),
}

/// How an append is judged against the producer state before it gets offsets.
#[derive(Debug, Clone, Copy)]
enum Judge {
    /// Replicated or replayed data: recorded, not checked (the leader checked).
    Trusted,
    /// A client's batch on the leader: the sequence rules, and with `txn` the
    /// transaction rule too.
    Client { txn: bool },
    /// A batch of the broker's own coordinators (group offsets and metadata, transaction
    /// state): only the producer-epoch rule, as Kafka's coordinator-origin appends. A
    /// transactional offset commit of a producer fenced since (a newer epoch's marker
    /// is in the log) is refused, and cannot reopen a transaction nobody will end.
    Coordinator,
    /// An end-transaction marker written by this leader: the epoch rules.
    Marker {
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
    },
}

impl PartitionLog {
    /// Validates `batch` (one complete v2 batch), assigns it the next offsets and
    /// `leader_epoch`, and appends it. Returns once the bytes are written to the device
    /// (not yet fdatasync'ed: see [`PartitionLog::flush`]). On error nothing is written.
    pub async fn append(&self, batch: &[u8], leader_epoch: i32) -> Result<AppendInfo, Error> {
        self.check_size(batch)?;
        let header = batch::validate(batch, true)?;
        let batch = Bytes::copy_from_slice(batch);
        self.guarded(self.append_validated(batch, header, leader_epoch, Judge::Trusted))
            .await
    }

    /// [`Self::append`] bounded by `max_bytes` instead of the topic's
    /// `max.message.bytes`: for the broker's own coordinators, whose records grow with
    /// their state (a group's members and assignments), not with what a client sends.
    /// A transactional batch of a producer epoch older than the partition has seen is
    /// refused ([`Error::Sequence`] with `StaleEpoch`); sequences are not checked (the
    /// coordinators' batches carry none).
    pub async fn append_bounded(
        &self,
        batch: &[u8],
        leader_epoch: i32,
        max_bytes: usize,
    ) -> Result<AppendInfo, Error> {
        if batch.len() > max_bytes {
            return Err(BatchError::TooLarge {
                size: batch.len(),
                max: max_bytes,
            }
            .into());
        }
        let header = batch::validate(batch, true)?;
        let batch = Bytes::copy_from_slice(batch);
        self.guarded(self.append_validated(batch, header, leader_epoch, Judge::Coordinator))
            .await
    }

    /// `max.message.bytes`: refuses a batch larger than the topic allows.
    fn check_size(&self, batch: &[u8]) -> Result<(), Error> {
        let max = self.config.borrow().max_message_bytes;
        if batch.len() > max {
            return Err(BatchError::TooLarge {
                size: batch.len(),
                max,
            }
            .into());
        }
        Ok(())
    }

    /// Like [`Self::append`], for a leader taking a batch from a client: a batch of an
    /// idempotent producer is first judged against the producer state
    /// ([`crate::producer`]) in the same step that assigns its offsets, so concurrent
    /// batches of one producer are judged in the order they are appended. A retry of a
    /// batch already in the log appends nothing and answers with that batch's offsets
    /// (durable only as far as the log is: the caller flushes before acknowledging);
    /// an out-of-order or stale-epoch batch is refused with [`Error::Sequence`], a
    /// control batch with [`BatchError::ControlBatchFromClient`].
    ///
    /// The transaction rule (no plain batch while the producer's transaction is open)
    /// is [`Self::append_judged`]'s; this one, which predates it, lets such a batch in.
    pub async fn append_checked(&self, batch: &[u8], leader_epoch: i32) -> Result<Checked, Error> {
        let appended = self.guarded(async {
            let batch = Bytes::copy_from_slice(batch);
            Staged::settle(self.append_client(batch, leader_epoch, false).await?).await
        });
        match appended.await? {
            Judged::Appended(info) => Ok(Checked::Appended(info)),
            Judged::Duplicate(meta) => Ok(Checked::Duplicate(meta)),
            Judged::Refused(e) => unreachable!("the transaction rule is off: {e}"),
        }
    }

    /// [`Self::append_checked`] with Kafka's transaction rule as well: a producer with an
    /// open transaction may only write transactional batches
    /// ([`Judged::Refused`] with [`TxnError::NotTransactional`] otherwise).
    pub async fn append_judged(&self, batch: &[u8], leader_epoch: i32) -> Result<Judged, Error> {
        self.guarded(async {
            let batch = Bytes::copy_from_slice(batch);
            Staged::settle(self.append_client(batch, leader_epoch, true).await?).await
        })
        .await
    }

    /// [`Self::append_judged`] up to the moment its offsets are assigned and its bytes
    /// accepted: an appended batch comes with its [`Staged`] write, which the caller
    /// awaits with [`Self::written`]. The next append may be judged and staged
    /// meanwhile, so appends that arrive while a write is in flight go out together in
    /// the next one (group commit): with a write-through log the write is the sync,
    /// and a caller that awaited each write before letting the next batch in would
    /// make one device round trip per batch. A large `batch` is kept as it is (a slice
    /// of the request, say), not copied: only its header is rewritten, beside it.
    pub async fn append_judged_staged(
        &self,
        batch: Bytes,
        leader_epoch: i32,
    ) -> Result<(Judged, Option<Staged>), Error> {
        self.guarded(self.append_client(batch, leader_epoch, true))
            .await
    }

    /// Installs the check that a leader's append (offsets assigned here: client
    /// batches, markers, coordinator writes) makes, synchronously with taking its
    /// offsets: whether this broker still leads in the append's leader epoch. Refused
    /// with [`Error::NotLeader`] otherwise. A follower's copies are not checked.
    pub fn set_leader_fence(&self, leads_in: impl Fn(i32) -> bool + 'static) {
        *self.leader_fence.borrow_mut() = Some(Box::new(leads_in));
    }

    /// Installs the hook told whenever what a read answers may have changed: an append
    /// (as soon as it has its offsets, with [`Self::append_event`]), a failure, a
    /// truncation, and a move of the log start (DeleteRecords, retention). The broker's
    /// change feed uses it, so a fetch session reads only the partitions that changed.
    pub fn set_on_change(&self, hook: impl Fn() + 'static) {
        *self.on_change.borrow_mut() = Some(Box::new(hook));
    }

    /// Tells the change hook, if any.
    pub(crate) fn changed(&self) {
        if let Some(hook) = &*self.on_change.borrow() {
            hook();
        }
    }

    /// Waits until a staged append is written to the device (not yet synced, unless
    /// the log is write-through; see [`Self::flush`]).
    pub async fn written(&self, staged: Staged) -> Result<(), Error> {
        self.guarded(staged.file.wait_written(staged.target)).await
    }

    async fn append_client(
        &self,
        batch: Bytes,
        leader_epoch: i32,
        txn: bool,
    ) -> Result<(Judged, Option<Staged>), Error> {
        self.check_size(&batch)?;
        let header = batch::validate(&batch, true)?;
        if header.is_control() {
            return Err(BatchError::ControlBatchFromClient.into());
        }
        self.append_staged(batch, header, leader_epoch, true, Judge::Client { txn })
            .await
    }

    /// Writes an end-transaction marker for `producer_id` at `producer_epoch` (a
    /// leader, for the transaction coordinator's WriteTxnMarkers): COMMIT or ABORT,
    /// stamped with `coordinator_epoch`. Kafka's checks, in the step that assigns the
    /// offset: a producer epoch below the producer's current one is refused with
    /// [`Error::Sequence`] (INVALID_PRODUCER_EPOCH), a coordinator epoch below the last
    /// marker's with [`Judged::Refused`] ([`TxnError::CoordinatorFenced`]). A marker for
    /// a producer with no open transaction (a retry) is written, and closes nothing.
    /// Closing an aborted transaction adds it to the segment's `.txnindex`. Followers
    /// copy markers with [`Self::append_with_offsets`], which updates the same state.
    pub async fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        leader_epoch: i32,
    ) -> Result<Judged, Error> {
        let marker = batch::EndTxnMarker {
            commit,
            coordinator_epoch,
        };
        let bytes =
            batch::end_txn_marker_batch(producer_id, producer_epoch, marker, self.storage.now_ms());
        let header = batch::validate(&bytes, true)?;
        let judge = Judge::Marker {
            producer_id,
            epoch: producer_epoch,
            coordinator_epoch,
        };
        self.guarded(self.append_inner(bytes.into(), header, leader_epoch, true, judge))
            .await
    }

    /// Appends a batch that already carries its offsets (a follower copying its leader,
    /// or a compacted batch): validated, but offsets are kept, only required to follow
    /// the log end. Its producer state (markers included) is recorded unchecked.
    pub async fn append_with_offsets(&self, batch: Bytes) -> Result<AppendInfo, Error> {
        let (info, staged) = self.append_with_offsets_staged(batch).await?;
        if let Some(staged) = staged {
            self.written(staged).await?;
        }
        Ok(info)
    }

    /// [`Self::append_with_offsets`] up to the moment the batch's bytes are accepted:
    /// the caller awaits its write with [`Self::written`]. A follower copying the
    /// batches of one fetch stages them all, then awaits them: written together, not
    /// one device round trip per batch.
    pub async fn append_with_offsets_staged(
        &self,
        batch: Bytes,
    ) -> Result<(AppendInfo, Option<Staged>), Error> {
        let header = batch::validate(&batch, false)?;
        let staged = self.append_staged(batch, header, header.leader_epoch, false, Judge::Trusted);
        match self.guarded(staged).await? {
            (Judged::Appended(info), staged) => Ok((info, staged)),
            (other, _) => unreachable!("an unjudged append was judged: {other:?}"),
        }
    }

    async fn append_validated(
        &self,
        batch: Bytes,
        header: batch::BatchHeader,
        leader_epoch: i32,
        judge: Judge,
    ) -> Result<AppendInfo, Error> {
        match self
            .append_inner(batch, header, leader_epoch, true, judge)
            .await?
        {
            Judged::Appended(info) => Ok(info),
            other => unreachable!("an unjudged append was judged: {other:?}"),
        }
    }

    /// Judges a batch against the producer state before it is appended: `Some` is the
    /// answer instead of appending.
    fn judge(&self, header: &batch::BatchHeader, judge: Judge) -> Result<Option<Judged>, Error> {
        let table = self.producers.borrow();
        match judge {
            Judge::Trusted => {}
            Judge::Coordinator => {
                if header.is_transactional() {
                    table.check_marker_epoch(header.producer_id, header.producer_epoch)?;
                }
            }
            Judge::Client { txn } => {
                if let Verdict::Duplicate(meta) = table.check(header)? {
                    return Ok(Some(Judged::Duplicate(meta)));
                }
                if txn {
                    if let Err(e) = table.check_txn(header) {
                        return Ok(Some(Judged::Refused(e)));
                    }
                }
            }
            Judge::Marker {
                producer_id,
                epoch,
                coordinator_epoch,
            } => {
                table.check_marker_epoch(producer_id, epoch)?;
                if let Err(e) = table.check_marker_coordinator(producer_id, coordinator_epoch) {
                    return Ok(Some(Judged::Refused(e)));
                }
            }
        }
        Ok(None)
    }

    /// Appends one validated batch; judges it against the producer state first (in the
    /// same synchronous step that assigns its offsets). Returns once it is written.
    async fn append_inner(
        &self,
        batch: Bytes,
        header: batch::BatchHeader,
        leader_epoch: i32,
        assign_offsets: bool,
        judge: Judge,
    ) -> Result<Judged, Error> {
        Staged::settle(
            self.append_staged(batch, header, leader_epoch, assign_offsets, judge)
                .await?,
        )
        .await
    }

    /// [`Self::append_inner`] without waiting for the write: an appended batch comes
    /// with its [`Staged`] write.
    async fn append_staged(
        &self,
        batch: Bytes,
        header: batch::BatchHeader,
        leader_epoch: i32,
        assign_offsets: bool,
        judge: Judge,
    ) -> Result<(Judged, Option<Staged>), Error> {
        self.check_open()?;
        let span = if assign_offsets {
            i64::from(header.last_offset_delta)
        } else {
            header.last_offset() - self.log_end_offset()
        };
        // The journal's chunk is open before the critical section (a push never awaits).
        let journal = self.journaling();
        let batch_len = batch.len();
        if let Some(j) = &journal {
            j.ready().await?;
        }
        self.maybe_roll(batch.len() as u64, span).await?;
        // No await from here to the push: the files stay open for it.
        self.ensure_active().await?;
        self.check_open()?;
        // A leader's append is fenced here, in the step that gives it its offsets: the
        // caller checked its leadership before awaiting (a sequence gap, the log lock
        // a truncation holds, a roll), and a deposed leader's late append stamped with
        // its old epoch, after records of a newer one, would hide from the truncation
        // by epochs that must remove it.
        if assign_offsets {
            if let Some(leads_in) = &*self.leader_fence.borrow() {
                if !leads_in(leader_epoch) {
                    return Err(Error::NotLeader {
                        epoch: leader_epoch,
                    });
                }
            }
        }
        let config = self.config.borrow().clone();
        let now = self.storage.now_ms();
        let (info, log_file, target, pushed) = {
            if let Some(answer) = self.judge(&header, judge)? {
                return Ok((answer, None));
            }
            let mut st = self.state.borrow_mut();
            let base = if assign_offsets {
                st.log_end()
            } else {
                let too_far = header.last_offset() - st.active().base_offset > i64::from(i32::MAX);
                if header.base_offset < st.log_end() || too_far {
                    return Err(Error::OffsetOutOfRange {
                        offset: header.base_offset,
                        log_start: st.log_start,
                        log_end: st.log_end(),
                    });
                }
                header.base_offset
            };
            let append_time =
                (config.timestamp_type == TimestampType::LogAppendTime).then_some(now);
            let (head, body) = stored_form(
                batch,
                &header,
                assign_offsets,
                base,
                leader_epoch,
                append_time,
            );
            let h = batch::BatchHeader::parse(if head.is_empty() { &body } else { &head })?;
            let seg = st.active_mut();
            let files = seg.active.as_ref().expect("active segment has files");
            let log_file = files.log.clone();
            // A failed file refuses the push: refuse before the segment counts the batch.
            log_file.check_failed()?;
            let position = seg.size;
            let len = (head.len() + body.len()) as u64;
            seg.track_batch(&h, position, len, config.index_interval_bytes);
            // A large batch is written to its segment file directly (the journal would
            // write it twice, through the shard's one stream, and one write of it is
            // efficient already), unless the log has records in the journal's chunks:
            // decided here, with no await before the push.
            let journal = journal.filter(|j| {
                batch_len <= self.storage.limits.journal_batch_max || j.may_hold(&self.name)
            });
            // Two pushes with no await between them: nothing else lands in between.
            // The journal first: a refused push leaves the segment as it was.
            let pushed = match &journal {
                Some(j) => Some(j.push_append(self, &[head.clone(), body.clone()])?),
                None => None,
            };
            log_file.push_bytes(head.clone())?;
            let target = log_file.push_bytes(body.clone())?;
            assert_eq!(target, seg.size, "appended position is the segment size");
            // A control batch is never split (see `stored_form`): the marker reads whole.
            if let Some(done) = self.producers.borrow_mut().apply(&h, &body) {
                index_completed(seg, &done);
            }
            self.storage.cache.borrow_mut().insert(
                self.id,
                CachedBatch {
                    base_offset: h.base_offset,
                    last_offset: h.last_offset(),
                    head,
                    body,
                },
            );
            let info = AppendInfo {
                base_offset: h.base_offset,
                last_offset: h.last_offset(),
                log_append_time_ms: append_time.unwrap_or(-1),
                record_count: h.record_count,
            };
            (info, log_file, target, pushed)
        };
        self.append_event.notify(usize::MAX);
        self.changed();
        // Journaled: acknowledged once the journal's record is written (write-through),
        // the segment file written behind it. Otherwise once the segment file's is.
        let staged = match pushed {
            Some(p) => {
                log_file.write_behind(crate::wal::WRITE_BEHIND_BYTES);
                let staged = Staged {
                    file: p.file.clone(),
                    target: p.target,
                    journaled: true,
                };
                self.journaled(p);
                self.last_journaled_ms.set(now);
                staged
            }
            None => {
                self.unjournaled.set(self.unjournaled.get() + 1);
                Staged {
                    file: log_file,
                    target,
                    journaled: false,
                }
            }
        };
        Ok((Judged::Appended(info), Some(staged)))
    }

    /// Makes everything appended so far durable (group-committed fdatasync). The
    /// active segment's indexes stay in memory (written when it is sealed, see
    /// [`crate::segment`]).
    pub async fn flush(&self) -> Result<(), Error> {
        self.guarded(self.flush_unguarded()).await
    }

    async fn flush_unguarded(&self) -> Result<(), Error> {
        // Journaled appends are durable with their journal record; the segment file
        // is synced here only for appends that bypassed the journal.
        let pushed = self.last_journaled.borrow().clone();
        if let Some(p) = pushed {
            p.durable().await?;
        }
        let unjournaled = self.unjournaled.get();
        if self.storage.journal().is_none() || unjournaled > self.unjournaled_synced.get() {
            let file = {
                let st = self.state.borrow();
                st.active().active.as_ref().map(|a| a.log.clone())
            };
            if let Some(f) = file {
                // Covers every byte pushed before it (sealed segments were synced when
                // sealed). Concurrent flushes each wait for a sync that covers theirs.
                f.sync_all().await?;
            }
            self.unjournaled_synced
                .set(self.unjournaled_synced.get().max(unjournaled));
        }
        self.last_flush_ms.set(self.storage.now_ms());
        Ok(())
    }

    /// Waits until appends so far are as durable as the topic's flush policy asks
    /// before acknowledging: synced for `always`, nothing more for an interval.
    pub async fn flush_for_ack(&self) -> Result<(), Error> {
        self.guarded(self.flush_for_ack_unguarded()).await
    }

    async fn flush_for_ack_unguarded(&self) -> Result<(), Error> {
        match self.config.borrow().flush {
            FlushPolicy::Always => {}
            FlushPolicy::IntervalMs(_) => return Ok(()),
        }
        // Already guarded by the caller: one failure check per acknowledgement.
        self.flush_unguarded().await
    }
}

/// Client batches at least this large are stored without a copy ([`stored_form`]);
/// smaller ones are copied whole. A kept slice keeps its whole Produce frame allocated
/// until the tail cache frees or joins the batch, and small batches kept so made a 100 B
/// soak's RSS creep (+8.9 MiB over its last 75 s against +2.7 with copies;
/// docs/benchmarks.md, "Appends without the second copy"), while their copy costs
/// little: the copy's cost is per byte, and large batches are where it showed.
pub const UNCOPIED_BATCH_BYTES_MIN: usize = 16 << 10;

/// The bytes a batch is stored as, in two pieces written one after the other: a
/// rewritten header and the rest of the batch as given, or (empty, the whole batch).
///
/// A client's batch (offsets to assign) of [`UNCOPIED_BATCH_BYTES_MIN`] or more keeps
/// the client's bytes, a slice of its Produce frame: only the header is copied and
/// rewritten. A whole copy per batch cost 16-28% of the broker's CPU per record at
/// 1 KiB acks=all in 64 KiB and 1 MiB batches (docs/benchmarks.md). The tail cache
/// holds the two pieces until the batch is first read, when it joins them (see
/// [`crate::cache::TailCache::read`]); its budget counts the batch, not the frame.
/// Everything else is copied whole, as one piece: smaller batches; control batches
/// (markers, which the producer state reads in one piece); and a follower's batches,
/// whose slices would keep the leader's whole Fetch response (up to 32 MiB) allocated
/// for as long as the follower's cache holds any of them, which, unread, is until
/// eviction. A `batch` the caller does not share is taken over without a copy.
fn stored_form(
    batch: Bytes,
    header: &batch::BatchHeader,
    assign_offsets: bool,
    base: i64,
    leader_epoch: i32,
    append_time: Option<i64>,
) -> (Bytes, Bytes) {
    if assign_offsets && batch.len() >= UNCOPIED_BATCH_BYTES_MIN && !header.is_control() {
        return batch::assign_header(&batch, base, leader_epoch, append_time);
    }
    let mut whole = BytesMut::from(batch);
    if assign_offsets {
        batch::assign(&mut whole, base, leader_epoch, append_time);
    }
    (Bytes::new(), whole.freeze())
}
