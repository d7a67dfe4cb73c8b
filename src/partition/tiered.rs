//! Tiered storage on a shard (KIP-405's contract, issue 44): the shard's reader of
//! the object store, what the image says is remote, and reads below the local log
//! start. The task that uploads and expires segments is `crate::cluster::tiering`.
//!
//! - Upload: every `remote.log.manager.task.interval.ms`, for each partition this shard
//!   leads with `remote.storage.enable`, the closed segments past the remote log's end
//!   and wholly below the high watermark and the last stable offset are copied, one
//!   after another, to the object store (log, indexes, transaction index, the producer
//!   snapshot at the segment's end and the leader epochs up to it) under a new id per
//!   attempt; then the quorum records the segment (`Command::AddRemoteSegments`, under
//!   the leader epoch the upload began in, refused from a deposed leader). Only then
//!   may local retention delete it (`PartitionLog::set_remote_end`). A failed attempt's
//!   objects are deleted; the segment is tried again next round.
//! - Unclean elections: a replica agrees with a remote segment whose last batch its
//!   log holds in the same leader epoch (`RemoteSegment::last_epoch`), and by log
//!   matching with every segment before it ([`agreed_end`]). Retention deletes no local
//!   segment past where a replica agrees with the remote log. A leader that agrees with
//!   less than all of it (elected uncleanly, the old leader having uploaded records its
//!   log does not hold) first cuts the remote log there ([`truncation_point`],
//!   `Command::TruncateRemoteSegments`: segments past it go, their objects deleted; one
//!   holding records below the leader's epoch history is cut short instead, as the
//!   store is their only copy); then it uploads its own records from there, so that a
//!   read of those offsets, local or remote, returns its records, never the old
//!   leader's.
//! - Remote retention: the leader forgets (`Command::DeleteRemoteSegments`), then
//!   deletes, the oldest remote segments past `retention.ms` or beyond
//!   `retention.bytes` (remote bytes plus the local bytes not yet remote).
//! - A deleted topic's folder is emptied by the quorum leader's broker
//!   (`Command::RemotePurged` once it is).
//! - Read: a consumer's fetch below the local log start is answered from the remote
//!   segment that holds the offset (`sluice_tiered::Reader`: ranged GETs through a
//!   bounded chunk cache), aborted transactions from the remote transaction indexes;
//!   ListOffsets finds timestamps there too. Replicas never read remote data: a
//!   follower below the leader's local start starts over at it, as before.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use sluice_replication::cluster::{remote_topic_prefix, RemoteLog, RemoteSegment};
use sluice_tiered::{Pool, Reader, SegmentRef, Store, StoreError};

use crate::base::error::ApiError;
use crate::base::metadata::MetadataImage;
use crate::partition::replica::Replica;
use kafka_protocol::error::ResponseError;

/// A shard's tiered storage: the reader (store, its read threads, chunk cache), the
/// threads that upload and delete (apart, so that a consumer's remote read never
/// waits behind a segment's upload), counters, and the sweeps for objects no remote
/// segment names (`crate::cluster::tiering`).
pub struct Tiered {
    pub reader: Reader,
    pub uploads: Pool,
    pub stats: Stats,
    pub sweeps: std::cell::RefCell<std::collections::HashMap<(Arc<str>, i32), Sweep>>,
}

/// A led partition's sweep for orphaned objects (an upload cut short by a kill, a
/// segment DeleteRecords dropped): keys no remote segment names, with when a sweep
/// first saw them so.
pub struct Sweep {
    /// The leader epoch the last sweep ran in (a new leadership sweeps at once).
    pub epoch: i32,
    pub next: std::time::Instant,
    pub suspects: std::collections::HashMap<String, std::time::Instant>,
}

/// What this shard did with the object store (metrics and `sluice cluster describe`).
#[derive(Default)]
pub struct Stats {
    pub uploaded_segments: Cell<u64>,
    pub uploaded_bytes: Cell<u64>,
    pub upload_errors: Cell<u64>,
    pub deleted_segments: Cell<u64>,
    pub remote_reads: Cell<u64>,
    pub remote_read_bytes: Cell<u64>,
    pub remote_read_errors: Cell<u64>,
    /// Closed segments of led partitions not yet remote, at the last round.
    pub upload_lag_segments: Cell<u64>,
    pub upload_lag_bytes: Cell<u64>,
    pub remote_read_micros: Cell<u64>,
    /// The upload backlog is over this shard's share of its budget: appends to tiered
    /// partitions are refused until uploads catch up.
    pub backlog_full: Cell<bool>,
    /// The share of the budget, at the last round (for the refusal's message).
    pub backlog_budget: Cell<u64>,
    /// Appends refused for it.
    pub backlog_refused: Cell<u64>,
}

impl Tiered {
    /// The counters as the metrics publish them.
    pub fn snapshot(&self) -> crate::observe::metrics::TieredStat {
        let s = &self.stats;
        crate::observe::metrics::TieredStat {
            uploaded_segments: s.uploaded_segments.get(),
            uploaded_bytes: s.uploaded_bytes.get(),
            upload_errors: s.upload_errors.get(),
            deleted_segments: s.deleted_segments.get(),
            remote_reads: s.remote_reads.get(),
            remote_read_bytes: s.remote_read_bytes.get(),
            remote_read_errors: s.remote_read_errors.get(),
            remote_read_micros: s.remote_read_micros.get(),
            upload_lag_segments: s.upload_lag_segments.get(),
            upload_lag_bytes: s.upload_lag_bytes.get(),
            backlog_appends_refused: s.backlog_refused.get(),
            cache_bytes: self.reader.cached_bytes(),
        }
    }
}

impl Tiered {
    /// Admits an append to a tiered partition of this shard, or refuses it with
    /// KAFKA_STORAGE_ERROR (retriable) while the segments waiting to upload are over
    /// the shard's share of `--remote-upload-backlog-max-bytes`: with the store down
    /// or slow, tiered topics stop growing the local disk at the budget, before the
    /// free-space minimum would stop every topic.
    pub fn admit(&self) -> Result<(), ApiError> {
        let s = &self.stats;
        if !s.backlog_full.get() {
            return Ok(());
        }
        s.backlog_refused.set(s.backlog_refused.get() + 1);
        Err(ApiError::with(
            ResponseError::KafkaStorageError,
            format!(
                "{} bytes of closed segments are waiting to upload to the remote store, over this shard's upload backlog budget of {}: appends to tiered topics are refused until uploads catch up",
                s.upload_lag_bytes.get(),
                s.backlog_budget.get()
            ),
        ))
    }

    pub fn new(store: Arc<Store>, pools: &Pools, cache_bytes: u64) -> Tiered {
        Tiered {
            reader: Reader::new(store, pools.reads.clone(), cache_bytes),
            uploads: pools.uploads.clone(),
            stats: Stats::default(),
            sweeps: Default::default(),
        }
    }
}

/// The object store's threads, shared by the shards: for reads, and for uploads and
/// deletes.
#[derive(Clone)]
pub struct Pools {
    pub reads: Pool,
    pub uploads: Pool,
}

/// Opens the object store `--remote-storage` names and its threads (`threads` of each
/// kind, shared by the shards; each builds its own [`Tiered`] over them).
pub fn open_store(url: &str, threads: usize) -> Result<(Arc<Store>, Pools), String> {
    let store = Store::open(url)?;
    let pool = |name| Pool::new(threads, name).map_err(|e| format!("remote storage threads: {e}"));
    let pools = Pools {
        reads: pool("sluice-remote-read")?,
        uploads: pool("sluice-remote-upload")?,
    };
    Ok((Arc::new(store), pools))
}

/// A partition's folder in the store: `<topic>-<topic id>/<partition>/`.
pub fn partition_prefix(topic: &str, id: &uuid::Uuid, partition: i32) -> String {
    format!("{}{partition}/", remote_topic_prefix(topic, id.as_bytes()))
}

pub fn segment_ref(prefix: &str, s: &RemoteSegment) -> SegmentRef {
    SegmentRef {
        prefix: prefix.to_string(),
        id: s.id,
        base_offset: s.base_offset,
        last_offset: s.last_offset,
        size: s.size,
    }
}

/// Every file a remote segment has in the store.
pub const EXTS: [&str; 6] = [
    sluice_tiered::remote::LOG,
    sluice_tiered::remote::INDEX,
    sluice_tiered::remote::TIME_INDEX,
    sluice_tiered::remote::TXN_INDEX,
    sluice_tiered::remote::SNAPSHOT,
    sluice_tiered::remote::EPOCHS,
];

/// Deletes the objects of one upload attempt (or of a remote segment).
pub async fn delete_objects(t: &Tiered, prefix: &str, base: i64, id: [u8; 16]) {
    let store = t.reader.store().clone();
    let keys: Vec<String> = segment_keys(prefix, base, &id).collect();
    let r = t
        .uploads
        .run(
            move || keys.iter().try_for_each(|k| store.delete(k)),
            || Err(StoreError::Failed("remote storage threads stopped".into())),
        )
        .await;
    if let Err(e) = r {
        tracing::warn!(prefix, base, error = %e, "could not delete remote objects; they stay unreferenced");
    }
}

/// The keys of every file a remote segment has in the store.
pub fn segment_keys<'a>(
    prefix: &'a str,
    base: i64,
    id: &'a [u8; 16],
) -> impl Iterator<Item = String> + 'a {
    EXTS.iter()
        .map(move |ext| sluice_tiered::remote::object_key(prefix, base, id, ext))
}

/// The keys the partition's remote segments in `image` name.
pub fn named_keys(
    image: &MetadataImage,
    topic: &str,
    partition: i32,
    prefix: &str,
) -> std::collections::HashSet<String> {
    remote_log(image, topic, partition)
        .map(|l| {
            l.segments
                .iter()
                .flat_map(|s| segment_keys(prefix, s.base_offset, &s.id))
                .collect()
        })
        .unwrap_or_default()
}

/// The partition's remote log in `image`, if it has one.
pub fn remote_log<'a>(
    image: &'a MetadataImage,
    topic: &str,
    partition: i32,
) -> Option<&'a RemoteLog> {
    image
        .remote
        .get(topic)?
        .get(&partition)
        .map(|l| &**l)
        .filter(|l| !l.segments.is_empty())
}

/// Tells each replica of this shard what the image says is remote: retention may
/// delete what is below the remote end that its log agrees with ([`agreed_end`]), and
/// clients see the remote start. Again every tiering round, as logs grow and truncate.
pub fn adopt(replicas: &[Rc<Replica>], image: &MetadataImage) {
    for r in replicas {
        let remote = remote_log(image, &r.topic, r.partition);
        r.remote_start
            .set(remote.and_then(RemoteLog::start_offset).unwrap_or(i64::MAX));
        r.log
            .set_remote_end(remote.map_or(i64::MIN, |l| agreed_end(l, r)));
    }
}

/// How far `r`'s log agrees with the remote log ([`RemoteLog::agreed_end`], by its
/// leader-epoch history). Below it the remote log holds the very records `r` does;
/// past it (after an unclean election: what the old leader uploaded past where the new
/// one's log parts from it; or what `r` has not fetched yet) it may not, so `r`'s
/// retention keeps its own copies there, and a leader cuts the remote log there (or
/// later: [`truncation_point`]; `crate::cluster::tiering`).
pub fn agreed_end(remote: &RemoteLog, r: &Replica) -> i64 {
    with_history(r, |known_from, epoch_of| {
        remote.agreed_end(known_from, epoch_of)
    })
}

/// Where the leader `r` cuts the remote log before it uploads, if anywhere
/// ([`RemoteLog::truncation_point`]).
pub fn truncation_point(remote: &RemoteLog, r: &Replica) -> Option<i64> {
    with_history(r, |known_from, epoch_of| {
        remote.truncation_point(known_from, epoch_of)
    })
}

/// `f` over `r`'s leader-epoch history: where it begins (below it, its log holds
/// nothing to compare) and the epoch of an offset its log holds.
fn with_history<T>(r: &Replica, f: impl FnOnce(i64, &dyn Fn(i64) -> Option<i32>) -> T) -> T {
    let state = r.state();
    let epochs = state.epochs();
    let log_end = r.log.log_end_offset();
    let known_from = epochs.entries().first().map_or(log_end, |e| e.start_offset);
    f(known_from, &|o| (o < log_end).then(|| epochs.epoch_for(o)))
}

/// A consumer's read of `offset` below the local log start from the remote segment
/// holding it: (records, next offset, aborted transactions if `read_committed`).
pub async fn read(
    t: &Tiered,
    image: Arc<MetadataImage>,
    r: &Replica,
    offset: i64,
    max_bytes: usize,
    upper: i64,
    read_committed: bool,
) -> Result<(bytes::Bytes, Vec<(i64, i64)>), ApiError> {
    let (Some(remote), Some(meta)) = (
        remote_log(&image, &r.topic, r.partition),
        image.topics.get(&*r.topic),
    ) else {
        return Err(ApiError::new(ResponseError::OffsetOutOfRange));
    };
    let prefix = partition_prefix(&r.topic, &meta.id, r.partition);
    let Some(i) = remote
        .segments
        .iter()
        .position(|s| s.last_offset >= offset)
        .filter(|_| offset >= remote.start_offset().unwrap_or(i64::MAX))
    else {
        return Err(ApiError::new(ResponseError::OffsetOutOfRange));
    };
    let segs: Vec<SegmentRef> = remote.segments[i..]
        .iter()
        .map(|s| segment_ref(&prefix, s))
        .collect();
    drop(image);
    let began = std::time::Instant::now();
    let result = async {
        let got = t.reader.read(&segs[0], offset, max_bytes, upper).await?;
        let aborted = if read_committed && !got.records.is_empty() {
            let (mut found, complete) = t.reader.aborted(&segs, offset, got.next_offset).await?;
            if !complete {
                found.extend(r.log.aborted_transactions(offset, got.next_offset));
            }
            found
        } else {
            Vec::new()
        };
        Ok::<_, StoreError>((got.records, aborted))
    }
    .await;
    t.stats
        .remote_read_micros
        .set(t.stats.remote_read_micros.get() + began.elapsed().as_micros() as u64);
    match result {
        Ok((records, aborted)) => {
            t.stats.remote_reads.set(t.stats.remote_reads.get() + 1);
            t.stats
                .remote_read_bytes
                .set(t.stats.remote_read_bytes.get() + records.len() as u64);
            Ok((records, aborted))
        }
        Err(e) => {
            t.stats
                .remote_read_errors
                .set(t.stats.remote_read_errors.get() + 1);
            tracing::warn!(topic = %r.topic, partition = r.partition, offset, error = %e, "remote read failed");
            // Retriable: the client tries again (the store may be back by then).
            Err(ApiError::with(
                ResponseError::KafkaStorageError,
                e.to_string(),
            ))
        }
    }
}

/// ListOffsets by timestamp in the remote segments below the local log start: the
/// first batch holding a record at or after `ts` (its base offset, max timestamp).
pub async fn offset_for_timestamp(
    t: &Tiered,
    image: Arc<MetadataImage>,
    r: &Replica,
    ts: i64,
) -> Result<Option<(i64, i64)>, ApiError> {
    let (Some(remote), Some(meta)) = (
        remote_log(&image, &r.topic, r.partition),
        image.topics.get(&*r.topic),
    ) else {
        return Ok(None);
    };
    let local_start = r.log.log_start_offset();
    let start = remote.start_offset().unwrap_or(i64::MAX);
    let prefix = partition_prefix(&r.topic, &meta.id, r.partition);
    let candidates: Vec<SegmentRef> = remote
        .segments
        .iter()
        .filter(|s| {
            s.base_offset < local_start
                && s.last_offset >= start
                && (s.max_timestamp >= ts || s.max_timestamp < 0)
        })
        .map(|s| segment_ref(&prefix, s))
        .collect();
    drop(image);
    let failed = |e: StoreError| ApiError::with(ResponseError::KafkaStorageError, e.to_string());
    for seg in candidates {
        let Some((base, max_ts)) = t
            .reader
            .offset_for_timestamp(&seg, ts, start)
            .await
            .map_err(failed)?
        else {
            continue;
        };
        // The first record of that batch at or after `ts`, as a local lookup answers.
        let batch = t
            .reader
            .read(&seg, base, 1, i64::MAX)
            .await
            .map_err(failed)?;
        let total = sluice_storage::batch::peek_total_bytes(&batch.records).unwrap_or(0);
        let hit = sluice_storage::batch::record_timestamps(
            &batch.records[..total.min(batch.records.len())],
        )
        .and_then(|recs| recs.into_iter().find(|&(o, t)| t >= ts && o >= start))
        .unwrap_or((base.max(start), max_ts));
        return Ok(Some(hit));
    }
    Ok(None)
}
