//! `sluice-storage`: the partition log.
//!
//! Owns the on-disk log of every partition: segments of Kafka v2 record batches stored
//! verbatim, their sparse offset and time indexes, crash recovery, roll, retention,
//! compaction, the producer state (idempotence and transactions: sequence checks,
//! markers, the aborted-transaction index, producer snapshots) and a per-shard tail
//! cache of recent batches. Knows nothing of the Kafka protocol beyond the record-batch
//! header, the end-transaction marker record and the old message sets that old clients
//! send and read ([`message_set`]: conversion to and from v2 batches), nothing of raft, nothing of sockets.
//!
//! Every object here lives on exactly one shard (one glommio executor thread): a
//! [`PartitionLog`] is `Rc`-shared and never crosses threads. Nothing here blocks the
//! reactor: file I/O goes through glommio's io_uring (O_DIRECT), and waiting is async.
//!
//! On-disk layout of a partition directory `<data>/<topic>-<partition>/`:
//! - `<base offset, 20 digits>.log` — concatenated v2 batches ([`batch`] documents the
//!   header); while it is the active segment it may end in zeros: padding up to a 4 KiB
//!   page and space preallocated ahead of the writes, in steps that grow from 1 MiB to
//!   [`file::PREALLOCATE_BYTES`] (32 MiB) with the file. Sealing trims both.
//! - `<base>.index`, `<base>.timeindex`, `<base>.txnindex` — see [`index`].
//! - `<offset, 20 digits>.snapshot` — producer state valid below `offset`; format in
//!   [`producer`], when they are written in [`log`].
//! - `partition.meta` — `log_start_offset=N` lines, written atomically; see [`log`].
//!
//! Recovery is described as a table of cases in [`segment`].
//!
//! I/O errors: an error on a partition's file leaves that file's state unknown, so the
//! file ([`file::AppendFile`]) and its log ([`PartitionLog::failure`]) are failed from
//! then on and refuse all work with [`Error::Failed`]; nothing a failed sync covered is
//! acknowledged. The owner drops the log and opens it again (recovery re-reads the
//! files) once the cause is gone. [`fault`] injects such errors per path, for tests.

pub mod batch;
pub mod cache;
pub mod codec;
pub mod compact;
pub mod failure;
pub mod fault;
pub mod file;
pub mod index;
pub mod journal;
pub mod log;
pub mod message_set;
pub mod probe;
pub mod producer;
pub mod segment;
pub mod simdisk;
pub mod small_files;
pub mod stats;
pub mod wal;

use std::path::Path;

pub use batch::{BatchError, BatchHeader};
pub use cache::TailCache;
pub use index::AbortedTxn;
pub use log::{
    AppendInfo, Checked, CloseReport, ClosedSegment, IndexSweep, Judged, PartitionLog, ReadResult,
    Staged, Storage,
};
pub use producer::TxnError;

/// Errors of the storage layer. Mapped to Kafka error codes at the API edge.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid record batch: {0}")]
    Batch(#[from] BatchError),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A previous I/O error left the file in an unknown state; the log refuses work.
    #[error("log failed after an earlier I/O error: {0}")]
    Failed(String),
    #[error("offset {offset} is out of range [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start: i64,
        log_end: i64,
    },
    #[error("invalid storage configuration: {0}")]
    Config(String),
    #[error("corrupt data in {path} at position {position}: {reason}")]
    Corrupt {
        path: String,
        position: u64,
        reason: String,
    },
    #[error("log is closed")]
    Closed,
    /// A leader's append refused when its offsets were due: the log's leader fence
    /// ([`PartitionLog::set_leader_fence`]) says it no longer leads in `epoch`.
    #[error("no longer the leader in epoch {epoch}")]
    NotLeader { epoch: i32 },
    /// An idempotent producer's batch is out of sequence or from a fenced epoch.
    #[error(transparent)]
    Sequence(#[from] producer::SequenceError),
}

impl Error {
    pub fn io(path: &Path, source: impl Into<std::io::Error>) -> Error {
        Error::Io {
            path: path.display().to_string(),
            source: source.into(),
        }
    }
}

/// When appended batches are made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// fdatasync (group-committed) before an append is acknowledged. The default.
    Always,
    /// fdatasync every this many milliseconds, from a background task.
    IntervalMs(u64),
}

/// Which timestamp a topic keeps: the producer's or the broker's append time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// Per-topic log settings (Kafka topic configs of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// `segment.bytes`: roll the active segment when it would grow beyond this.
    pub segment_bytes: u64,
    /// `segment.ms`: roll the active segment when it is older than this.
    pub segment_ms: i64,
    /// `retention.ms`: delete closed segments whose newest record is older. -1: never.
    pub retention_ms: i64,
    /// `retention.bytes`: delete oldest closed segments while the log is larger. -1: never.
    pub retention_bytes: i64,
    /// `index.interval.bytes`: bytes between sparse index entries.
    pub index_interval_bytes: u32,
    /// `max.message.bytes`: largest batch accepted.
    pub max_message_bytes: usize,
    pub timestamp_type: TimestampType,
    pub flush: FlushPolicy,
    /// `cleanup.policy` contains `delete`: retention deletes old segments.
    pub cleanup_delete: bool,
    /// `cleanup.policy` contains `compact`: the cleaner keeps the last record per key.
    pub cleanup_compact: bool,
    /// `delete.retention.ms`: how long tombstones survive compaction.
    pub delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio` in basis points (5000 = 0.5): clean when this share of
    /// the cleanable bytes is dirty. (An integer so configs stay `Eq`.)
    pub min_cleanable_dirty_ratio_bp: u16,
    /// `min.compaction.lag.ms`: records younger than this are never compacted.
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`: on a compacted topic the active segment rolls once this
    /// old (if `segment.ms` is longer), and a dirty segment this old is cleaned whatever
    /// `min.cleanable.dirty.ratio` says.
    pub max_compaction_lag_ms: i64,
    /// `segment.jitter.ms`: each segment rolls up to this much (a per-segment amount
    /// below min(jitter, segment.ms)) before `segment.ms`, so segments of many
    /// partitions do not all roll at once.
    pub segment_jitter_ms: i64,
    /// `producer.id.expiration.ms` (a broker setting in Kafka): a producer with no open
    /// transaction whose last write is this old is forgotten.
    pub producer_id_expiration_ms: i64,
    /// `remote.storage.enable`: closed segments are copied to the object store, and
    /// retention deletes a local segment only once it is there (see
    /// [`log::PartitionLog::set_remote_end`]), by the local window below.
    pub remote_storage: bool,
    /// `local.retention.ms` with -2 resolved (to `retention.ms`): with
    /// `remote_storage`, how long closed segments stay on local disk.
    pub local_retention_ms: i64,
    /// `local.retention.bytes` with -2 resolved: with `remote_storage`, the local size
    /// retention keeps the log under.
    pub local_retention_bytes: i64,
    /// `remote.log.copy.disable`: with `remote_storage`, nothing more is uploaded (the
    /// remote segments stay readable until retention.* expires them) and local
    /// retention follows `retention.*`, uploaded or not (Kafka's KIP-950).
    pub remote_copy_disabled: bool,
}

pub const DAY_MS: i64 = 24 * 60 * 60 * 1000;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * DAY_MS,
            retention_ms: 7 * DAY_MS,
            retention_bytes: 1 << 40,
            index_interval_bytes: 4096,
            // Kafka's default max.message.bytes: 1 MiB plus the batch overhead.
            max_message_bytes: 1_048_588,
            timestamp_type: TimestampType::CreateTime,
            flush: FlushPolicy::Always,
            cleanup_delete: true,
            cleanup_compact: false,
            delete_retention_ms: DAY_MS,
            min_cleanable_dirty_ratio_bp: 5000,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            segment_jitter_ms: 0,
            producer_id_expiration_ms: producer::PRODUCER_ID_EXPIRATION_MS_DEFAULT,
            remote_storage: false,
            local_retention_ms: 7 * DAY_MS,
            local_retention_bytes: 1 << 40,
            remote_copy_disabled: false,
        }
    }
}

impl LogConfig {
    /// The age at which the active segment rolls: `segment.ms`, or on a compacted topic
    /// `max.compaction.lag.ms` when shorter (Kafka's rule), less the segment's jitter.
    pub fn roll_age_ms(&self, base_offset: i64, created_ms: i64) -> i64 {
        let max = if self.cleanup_compact {
            self.segment_ms.min(self.max_compaction_lag_ms)
        } else {
            self.segment_ms
        };
        max - self.segment_jitter(base_offset, created_ms)
    }

    /// The jitter of the segment at `base_offset` created at `created_ms`: in
    /// [0, min(segment.jitter.ms, segment.ms)), fixed for the segment, spread by a hash
    /// (no clock or random source here, so simulations replay it).
    pub fn segment_jitter(&self, base_offset: i64, created_ms: i64) -> i64 {
        let bound = self.segment_jitter_ms.min(self.segment_ms);
        if bound <= 0 {
            return 0;
        }
        let mut h = (base_offset as u64) ^ (created_ms as u64).rotate_left(32);
        // splitmix64's finaliser: neighbouring offsets land far apart.
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        (h % bound as u64) as i64
    }

    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Config(m));
        // Offsets and positions in the index are u32 relative to the segment.
        if self.segment_bytes < 1024 || self.segment_bytes > u32::MAX as u64 {
            return bad(format!(
                "segment.bytes {} must be in [1024, {}]",
                self.segment_bytes,
                u32::MAX
            ));
        }
        if self.segment_ms < 1 {
            return bad(format!("segment.ms {} must be positive", self.segment_ms));
        }
        if self.retention_ms < -1 {
            return bad(format!(
                "retention.ms {} must be -1 or non-negative",
                self.retention_ms
            ));
        }
        if self.retention_bytes < -1 {
            return bad(format!(
                "retention.bytes {} must be -1 or non-negative",
                self.retention_bytes
            ));
        }
        if self.index_interval_bytes == 0 {
            return bad("index.interval.bytes must be positive".into());
        }
        if self.max_message_bytes < batch::HEADER_BYTES {
            return bad(format!(
                "max.message.bytes {} is below a batch header",
                self.max_message_bytes
            ));
        }
        if self.min_cleanable_dirty_ratio_bp > 10_000 {
            return bad(format!(
                "min.cleanable.dirty.ratio {} must be in [0, 1]",
                f64::from(self.min_cleanable_dirty_ratio_bp) / 10_000.0
            ));
        }
        if self.delete_retention_ms < 0 || self.min_compaction_lag_ms < 0 {
            return bad(
                "delete.retention.ms and min.compaction.lag.ms must not be negative".into(),
            );
        }
        if !self.cleanup_delete && !self.cleanup_compact {
            return bad("cleanup.policy must contain delete, compact or both".into());
        }
        if self.remote_storage {
            if self.cleanup_compact {
                return bad("remote.storage.enable is not supported on a compacted topic (cleanup.policy=compact), as in Kafka".into());
            }
            // Kafka's rules: the local window is part of the total.
            for (local, total, what) in [
                (self.local_retention_ms, self.retention_ms, "ms"),
                (self.local_retention_bytes, self.retention_bytes, "bytes"),
            ] {
                if total != -1 && (local == -1 || local > total) {
                    return bad(format!("local.retention.{what} {local} must not be -1 or more than retention.{what} {total}"));
                }
                if local < -1 {
                    return bad(format!(
                        "local.retention.{what} {local} must be -2, -1 or non-negative"
                    ));
                }
            }
        }
        if self.producer_id_expiration_ms < 1 {
            return bad(format!(
                "producer.id.expiration.ms {} must be positive",
                self.producer_id_expiration_ms
            ));
        }
        if let FlushPolicy::IntervalMs(0) = self.flush {
            return bad("flush.ms must be positive".into());
        }
        Ok(())
    }
}

/// Descriptors the shards of one process share beyond their own shares: a shard whose
/// own share of active logs ([`StorageLimits::active_logs_max`]) or of client
/// connections is used up takes one from here, and gives it back when it no longer
/// needs it. So one busy shard (or logs on one broker and connections on another
/// workload) can use what the others leave, while each keeps a share nobody else can
/// take. Taking never waits: with the pool empty a log closes an idle one of its own
/// shard first and a connection waits in the listen backlog.
#[derive(Debug)]
pub struct DescriptorPool {
    capacity: usize,
    taken: std::sync::atomic::AtomicUsize,
}

impl DescriptorPool {
    pub fn new(capacity: usize) -> std::sync::Arc<DescriptorPool> {
        std::sync::Arc::new(DescriptorPool {
            capacity,
            taken: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Takes one descriptor if any is left.
    pub fn try_take(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.taken
            .fetch_update(Relaxed, Relaxed, |t| (t < self.capacity).then_some(t + 1))
            .is_ok()
    }

    /// Gives back one descriptor taken with [`Self::try_take`].
    pub fn give_back(&self) {
        let before = self
            .taken
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        assert!(before > 0, "a descriptor given back that was never taken");
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Descriptors taken now, by every shard.
    pub fn taken(&self) -> usize {
        self.taken.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Per-shard limits, sized at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageLimits {
    /// Bytes of recent batches the shard keeps in memory for fetches.
    pub tail_cache_bytes: usize,
    /// Read handles of closed segments kept open at once (LRU beyond that).
    pub open_segment_files_max: usize,
    /// Logs whose active segment's `.log` is open at once on this shard's own share
    /// (one descriptor each: the active segment's indexes are held in memory and
    /// written whole when it is sealed, not kept open). Beyond it a shard takes from
    /// the process's [`DescriptorPool`] if it has one ([`log::Storage::share_descriptors`]);
    /// when that is empty too, opening one more first closes the least recently
    /// appended idle log of the shard (sealed: synced, preallocation trimmed, indexes
    /// written); its next append reopens it.
    pub active_logs_max: usize,
    /// Largest single write handed to the device; more pending bytes wait their turn.
    pub write_bytes_max: usize,
    /// Largest read a single `read` call issues (bounds memory per fetch).
    pub read_bytes_max: usize,
    /// Memory the cleaner's key map may use per compaction pass.
    pub cleaner_map_bytes_max: usize,
    /// Disk the shard's segment files may hold preallocated ahead of their writes, all
    /// together (see [`file::set_preallocated_max`]): each active segment preallocates
    /// 1 MiB first and more as it grows, so thousands of active partitions would
    /// otherwise hold gigabytes of zeros.
    pub preallocated_bytes_max: u64,
    /// Syncs a shard's files want at once before further ones share `syncfs` rounds
    /// (0: never; see [`file::set_shared_sync_min`]).
    pub shared_sync_min: u64,
    /// Segment logs a shard opens write-through (`O_DSYNC`) before further ones are
    /// synced by `fdatasync` (0: none; see [`file::set_dsync_logs_max`]).
    pub dsync_logs_max: u64,
    /// Small files written at once (checkpoints, snapshots; one descriptor each; see
    /// [`file::set_atomic_writes_max`]).
    pub atomic_writes_max: u64,
    /// Memory the shard's closed segments' offset and time indexes may hold, over all
    /// its logs ([`log::Storage::limit_index_memory`]): beyond it the least recently
    /// read are dropped from memory and read back from their files on next use. The
    /// active segments' indexes are not counted (they are written only when sealed).
    pub index_memory_max: u64,
    /// Bytes of a chunk of the shard's journal ([`wal`]) before the next one starts;
    /// 0 turns the journal off (every `flush=always` append then syncs its own
    /// segment file, as before issue 40).
    pub journal_chunk_bytes: u64,
    /// Batches larger than this bypass the journal (written and synced in their segment
    /// file): [`wal::JOURNAL_BATCH_MAX`] by default.
    pub journal_batch_max: usize,
    /// This shard's index and the process's shard count: which journal is this
    /// shard's, and (on shard 0) which left-over journals of a run with more shards
    /// it replays.
    pub shard: usize,
    pub shards: usize,
}

/// The default of [`StorageLimits::index_memory_max`]: 128 MiB per shard holds the
/// indexes of about 25 GiB of log at the default `index.interval.bytes` (4 KiB, 20
/// bytes of index per interval); reads beyond that reload a segment's index files.
pub const DEFAULT_INDEX_MEMORY_MAX: u64 = 128 << 20;

impl Default for StorageLimits {
    fn default() -> Self {
        StorageLimits {
            tail_cache_bytes: 256 << 20,
            open_segment_files_max: 1024,
            active_logs_max: 4096,
            write_bytes_max: 8 << 20,
            read_bytes_max: 64 << 20,
            cleaner_map_bytes_max: 64 << 20,
            preallocated_bytes_max: file::DEFAULT_PREALLOCATED_MAX,
            shared_sync_min: file::DEFAULT_SHARED_SYNC_MIN,
            dsync_logs_max: file::DEFAULT_DSYNC_LOGS_MAX,
            atomic_writes_max: file::DEFAULT_ATOMIC_WRITES_MAX,
            index_memory_max: DEFAULT_INDEX_MEMORY_MAX,
            // Off unless asked for (the broker asks, `--journal-chunk-bytes`): the
            // storage crate's own tests exercise segment files' durability by default.
            journal_chunk_bytes: 0,
            journal_batch_max: wal::JOURNAL_BATCH_MAX,
            shard: 0,
            shards: 1,
        }
    }
}

impl StorageLimits {
    pub fn validate(&self) -> Result<(), Error> {
        if self.active_logs_max == 0 {
            return Err(Error::Config("active_logs_max must be at least 1".into()));
        }
        if self.open_segment_files_max == 0 {
            return Err(Error::Config(
                "open_segment_files_max must be at least 1".into(),
            ));
        }
        if self.write_bytes_max < file::ALIGN as usize {
            return Err(Error::Config(format!(
                "write_bytes_max {} must be at least one page ({})",
                self.write_bytes_max,
                file::ALIGN
            )));
        }
        if self.cleaner_map_bytes_max < 4096 {
            return Err(Error::Config(
                "cleaner_map_bytes_max must be at least 4096".into(),
            ));
        }
        if self.read_bytes_max < 4096 {
            return Err(Error::Config("read_bytes_max must be at least 4096".into()));
        }
        Ok(())
    }
}

/// Wall-clock milliseconds, behind a trait so tests drive time.
pub trait Clock {
    fn now_ms(&self) -> i64;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(pub std::cell::Cell<i64>);

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.get()
    }
}
