//! The shard's write-ahead journal: the unit of durable write for partition data.
//!
//! Every append of up to [`JOURNAL_BATCH_MAX`] bytes of a `flush=always` log on a shard
//! (and every append of a log that has records in the journal's live chunks,
//! [`Wal::may_hold`]) is also pushed, as one record, to the shard's journal: one sequential O_DIRECT stream written through (`O_DSYNC`), so
//! one device write makes a whole group-commit round of appends durable, whatever
//! partitions they went to. An append is acknowledged once its journal record is
//! written; the partition's segment file receives the same bytes *behind* it (queued
//! in memory, written when a reader needs them, when a quarter MiB is pending, once the
//! log is idle for [`IDLE_WRITE_BEHIND_MS`], or at the latest by the journal's
//! checkpoint) and is synced lazily. A larger batch is written and synced in its
//! segment file, as without a journal. At 10,000 partitions
//! and a record or two per append this turns one write and one sync per partition
//! into one write per round (issue 40; docs/architecture.md, "The shard journal").
//!
//! ## Files
//!
//! `<data>/wal@<shard>/<seq, 20 digits>.wal`: chunks of records
//! `[len u32 LE][crc32c u32 LE][kind u8][name len u16 LE][name][payload]`, where `len`
//! counts what follows the CRC and the CRC covers it. `name` is the log's directory
//! name; the payload of an append is the batch as stored (offsets assigned), of a
//! truncation or reset the offset (i64 LE), of a deletion nothing. Topic names cannot
//! contain `@`, so no partition directory is ever taken for a journal.
//!
//! ## Checkpoints
//!
//! A chunk that reaches its size ([`chunk_bytes_for`]) is closed and a new one started. A
//! closed chunk's checkpoint then syncs the segment file of every log that appended to
//! it (which covers those appends and everything before them) and deletes the chunk.
//! At most [`CLOSED_CHUNKS_MAX`] chunks wait for their checkpoint; appends wait beyond
//! that, which bounds both the memory the segment files hold unwritten and the replay.
//! A clean stop of the shard closes (syncs) every log and then deletes every chunk.
//!
//! ## Replay
//!
//! [`crate::Storage::open`] replays the journals of the previous run before any log is
//! opened for use: its own shard's, and, on shard 0, those of shards that no longer
//! exist. Each chunk is read up to its first torn or corrupt record. Per log, in order:
//! an append whose batch starts at the recovered log end is appended again, one that
//! ends at or below it is already there; a truncation or reset is done again; a
//! deletion forgets what came before it. A batch that would leave a gap is skipped and
//! logged (no later batch of that log can continue it either). Logs whose directory is
//! gone are skipped. The replayed logs are closed (synced), then the chunks deleted.
//!
//! A log that fails while the broker runs (an I/O error) and is reopened replays what
//! this shard's current chunks hold for it the same way ([`Wal::records_for`]).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};

use bytes::Bytes;
use event_listener::Event;

use crate::cache::LogId;
use crate::file::{self, AppendFile};
use crate::log::PartitionLog;
use crate::Error;

/// Bytes a chunk holds before the journal starts the next one (the default of
/// [`crate::StorageLimits::journal_chunk_bytes`]).
pub const DEFAULT_CHUNK_BYTES: u64 = 128 << 20;

/// The chunk size a shard's journal uses: `configured`, but at most a share of the file
/// system (`fs_bytes`) such that the journals of all `shards`, each up to
/// 1 + [`CLOSED_CHUNKS_MAX`] chunks, take at most a tenth of it (an eighth with their
/// preallocation, see [`chunk_footprint`]), and at least 1 MiB each.
/// A small disk then fills with partition data, not with journal chunks waiting for
/// their checkpoint.
pub fn chunk_bytes_for(configured: u64, fs_bytes: u64, shards: usize) -> u64 {
    let copies = (1 + CLOSED_CHUNKS_MAX as u64) * shards.max(1) as u64;
    let share = (fs_bytes / 10 / copies).max(1 << 20);
    configured.min(share / file::ALIGN * file::ALIGN)
}

/// The largest preallocation step of a chunk of `chunk_bytes`: a quarter of it (at
/// most [`file::PREALLOCATE_BYTES`]), so a chunk takes at most [`chunk_footprint`].
fn preallocate_step_max(chunk_bytes: u64) -> u64 {
    (chunk_bytes / 4 / file::ALIGN * file::ALIGN).clamp(file::ALIGN, file::PREALLOCATE_BYTES)
}

/// The most a chunk of `chunk_bytes` takes on the device: filled, with one
/// preallocation step beyond (a write may end past the size, and a chunk is only
/// closed once it is full).
pub fn chunk_footprint(chunk_bytes: u64) -> u64 {
    chunk_bytes + preallocate_step_max(chunk_bytes)
}

/// Closed chunks waiting for their checkpoint before appends wait for one to finish.
pub const CLOSED_CHUNKS_MAX: usize = 2;

/// Logs whose segment files a checkpoint writes at once.
const CHECKPOINT_CONCURRENCY: usize = 32;

/// Batches larger than this are not journaled: they are written to their segment file
/// and synced there, as without a journal. A few records a partition per round (many
/// partitions, small batches) is what the journal is for; a large batch is one
/// efficient write already, and through the journal it would be written twice, every
/// large append of the shard through its one stream (halving 100 B acks=1 throughput
/// and 1 KiB acks=all throughput at 8 partitions in `make bench-ab`; at 16 KiB the
/// 100 B acks=1 batches at 1M records/s still went through it, p99 6.9×). A page: what
/// a partition's own write costs at least anyway.
pub const JOURNAL_BATCH_MAX: usize = 4 << 10;

/// Segment bytes a log keeps unwritten before a write of them starts on its own.
pub const WRITE_BEHIND_BYTES: u64 = 256 << 10;

/// A log with no append for this long has its unwritten segment bytes written behind
/// the journal without waiting for the checkpoint ([`Wal::write_behind_idle`]).
pub const IDLE_WRITE_BEHIND_MS: i64 = 1000;

/// How often the shard looks for such logs.
pub const IDLE_CHECK_MS: u64 = 250;

const HEADER: usize = 8;
const PREFIX: &str = "wal@";
const SUFFIX: &str = ".wal";

/// What a journal record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A batch as stored, offsets assigned.
    Append(Bytes),
    /// The log was truncated to this end.
    Truncate(i64),
    /// The log was emptied and restarted at this offset.
    Reset(i64),
    /// The log was deleted.
    Delete,
}

/// Record kinds on disk.
const APPEND: u8 = 1;
const TRUNCATE: u8 = 2;
const RESET: u8 = 3;
const DELETE: u8 = 4;

/// Bytes the journals of shards `0..shards` under `data_dir` take on the device now
/// (their chunks' allocated blocks; a chunk is preallocated as it grows).
pub fn allocated_bytes(data_dir: &Path, shards: usize) -> u64 {
    use std::os::unix::fs::MetadataExt;
    (0..shards)
        .filter_map(|shard| std::fs::read_dir(dir_of(data_dir, shard)).ok())
        .flatten()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// The journal directory of `shard` under `data`.
pub fn dir_of(data: &Path, shard: usize) -> PathBuf {
    data.join(format!("{PREFIX}{shard}"))
}

/// The journal directories under `data`, by shard.
pub fn dirs_in(data: &Path) -> Result<Vec<(usize, PathBuf)>, Error> {
    numbered(data, |n| n.strip_prefix(PREFIX))
}

/// The chunk files of a journal directory, oldest first (none if it does not exist).
pub fn chunks_in(dir: &Path) -> Result<Vec<(u64, PathBuf)>, Error> {
    numbered(dir, |n| n.strip_suffix(SUFFIX))
}

/// The entries of `dir` whose name `number` cuts to a number, by that number.
fn numbered<N: std::str::FromStr + Ord>(
    dir: &Path,
    number: impl Fn(&str) -> Option<&str>,
) -> Result<Vec<(N, PathBuf)>, Error> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(dir, e)),
    };
    for e in entries {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name();
        if let Some(n) = name.to_str().and_then(&number).and_then(|n| n.parse().ok()) {
            out.push((n, e.path()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// A record's header, kind, name and `fixed` payload, its CRC and length covering the
/// `pieces` that follow it (an append's batch as stored).
fn encode(name: &str, kind: u8, fixed: &[u8], pieces: &[Bytes]) -> Vec<u8> {
    let mut head = Vec::with_capacity(HEADER + 3 + name.len() + fixed.len());
    head.extend_from_slice(&[0; HEADER]);
    head.push(kind);
    head.extend_from_slice(&(name.len() as u16).to_le_bytes());
    head.extend_from_slice(name.as_bytes());
    head.extend_from_slice(fixed);
    let mut crc = crc32c::crc32c(&head[HEADER..]);
    let mut len = head.len() - HEADER;
    for p in pieces {
        crc = crc32c::crc32c_append(crc, p);
        len += p.len();
    }
    head[..4].copy_from_slice(&(len as u32).to_le_bytes());
    head[4..HEADER].copy_from_slice(&crc.to_le_bytes());
    head
}

/// The records of one chunk's bytes, up to the first torn or corrupt one.
pub fn decode(buf: &Bytes) -> Vec<(String, Op)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + HEADER <= buf.len() {
        let len = u32::from_le_bytes(buf[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(buf[pos + 4..pos + 8].try_into().expect("4 bytes"));
        let start = pos + HEADER;
        if len < 3 || start + len > buf.len() || crc32c::crc32c(&buf[start..start + len]) != crc {
            break;
        }
        let body = buf.slice(start..start + len);
        let kind = body[0];
        let name_len = u16::from_le_bytes([body[1], body[2]]) as usize;
        let Some(name) = body
            .get(3..3 + name_len)
            .and_then(|n| std::str::from_utf8(n).ok())
        else {
            break;
        };
        let rest = body.slice(3 + name_len..);
        let offset = || {
            rest.get(..8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8")))
        };
        let op = match kind {
            APPEND => Op::Append(rest.clone()),
            TRUNCATE => match offset() {
                Some(o) => Op::Truncate(o),
                None => break,
            },
            RESET => match offset() {
                Some(o) => Op::Reset(o),
                None => break,
            },
            DELETE => Op::Delete,
            _ => break,
        };
        out.push((name.to_string(), op));
        pos = start + len;
    }
    out
}

/// What a chunk's bytes say per log, in order, a deletion forgetting what came before
/// it; logs in the order they first appear.
pub fn by_log(records: Vec<(String, Op)>) -> Vec<(String, Vec<Op>)> {
    let mut order: Vec<String> = Vec::new();
    let mut ops: HashMap<String, Vec<Op>> = HashMap::new();
    for (name, op) in records {
        let list = ops.entry(name.clone()).or_insert_with(|| {
            order.push(name.clone());
            Vec::new()
        });
        if op == Op::Delete {
            list.clear();
        } else {
            list.push(op);
        }
    }
    order
        .into_iter()
        .map(|n| {
            let list = ops.remove(&n).unwrap_or_default();
            (n, list)
        })
        .collect()
}

/// A journal record on its way to the device: durable once its chunk's write reaches
/// `target` (the chunk is written through).
#[derive(Clone)]
pub struct Pushed {
    pub(crate) file: Rc<AppendFile>,
    pub(crate) target: u64,
}

impl Pushed {
    pub async fn durable(&self) -> Result<(), Error> {
        self.file.wait_durable(self.target).await
    }
}

struct Chunk {
    seq: u64,
    path: PathBuf,
    file: Rc<AppendFile>,
    /// The logs with records in this chunk.
    logs: HashMap<LogId, Weak<PartitionLog>>,
    /// Names of those logs (a reopened log has a new id).
    names: std::collections::HashSet<String>,
}

/// A shard's journal (see the module documentation).
pub struct Wal {
    dir: PathBuf,
    chunk_bytes: u64,
    write_bytes_max: usize,
    active: RefCell<Option<Chunk>>,
    next_seq: Cell<u64>,
    /// A chunk is being opened: pushes wait.
    opening: Cell<bool>,
    closed: RefCell<VecDeque<Chunk>>,
    /// Chunks kept for the next start's replay (their checkpoint failed, or the chunk
    /// itself did): their files closed, what they held durably recorded.
    kept: RefCell<Vec<Kept>>,
    /// When a chunk last failed: a new one is opened at most once a second after that,
    /// so a full or failing disk does not get a new chunk per refused append.
    failed_at: Cell<Option<std::time::Instant>>,
    checkpointing: Cell<bool>,
    changed: Event,
    stopped: Cell<bool>,
    /// Logs with records here that failed and were not reopened since: a clean stop
    /// keeps the chunks for them.
    failed: RefCell<std::collections::HashSet<String>>,
    /// Logs that journaled an append since their last idle write-behind, each once
    /// (`PartitionLog::idle_watched`): what [`Self::write_behind_idle`] looks at.
    unidle: RefCell<Vec<Weak<PartitionLog>>>,
}

impl Wal {
    /// A journal in `dir` (created empty; the caller has replayed and removed what was
    /// there).
    pub fn new(dir: PathBuf, chunk_bytes: u64, write_bytes_max: usize) -> Result<Rc<Wal>, Error> {
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(Rc::new(Wal {
            dir,
            chunk_bytes: chunk_bytes.max(file::ALIGN),
            write_bytes_max,
            active: RefCell::new(None),
            next_seq: Cell::new(0),
            opening: Cell::new(false),
            closed: RefCell::new(VecDeque::new()),
            kept: RefCell::new(Vec::new()),
            failed_at: Cell::new(None),
            checkpointing: Cell::new(false),
            changed: Event::new(),
            stopped: Cell::new(false),
            failed: RefCell::new(Default::default()),
            unidle: RefCell::new(Vec::new()),
        }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `name` may have records in a chunk not yet deleted (conservatively also
    /// while a checkpoint runs or a chunk is kept). Such a log journals every append,
    /// whatever its size: a replay must never put a journaled change (a truncation,
    /// redone when it is a log's last record) after an append the journal did not see.
    pub fn may_hold(&self, name: &str) -> bool {
        self.checkpointing.get()
            || !self.kept.borrow().is_empty()
            || self
                .active
                .borrow()
                .as_ref()
                .is_some_and(|c| c.names.contains(name))
            || self.closed.borrow().iter().any(|c| c.names.contains(name))
    }

    /// Starts writing the unwritten segment bytes of every log that journaled an append
    /// since its last such write and then had none for `idle_ms`. A log appended to
    /// steadily keeps its bytes for one write at the checkpoint (a write per round would
    /// rewrite its tail block each time); one whose producers paused has its file show
    /// what it acknowledged within about `idle_ms`, for whatever reads the files
    /// directly (tools, tests), and holds no memory for it until the checkpoint. Only
    /// the logs that appended since are looked at: a pass over every log of the open
    /// chunk, four times a second, was a tenth of an idle broker's CPU at 10,000
    /// partitions.
    pub fn write_behind_idle(&self, now_ms: i64, idle_ms: i64) {
        let watched = std::mem::take(&mut *self.unidle.borrow_mut());
        let mut still = Vec::with_capacity(watched.len());
        for w in watched {
            let Some(log) = w.upgrade() else { continue };
            match log.write_behind_if_idle(now_ms, idle_ms) {
                true => log.idle_watched.set(false),
                false => still.push(w),
            }
        }
        self.unidle.borrow_mut().extend(still);
    }

    /// Device writes of the chunk being written (each carries every record pushed
    /// while the previous one was in flight: a group-commit round).
    pub fn active_writes(&self) -> u64 {
        self.active.borrow().as_ref().map_or(0, |c| c.file.writes())
    }

    /// Waits until a push can go to an open chunk: opens the first (or, after a failure
    /// or once the active one is full, the next) and waits while too many closed chunks
    /// wait for their checkpoint. Call before a push, with no await between this and it.
    pub async fn ready(self: &Rc<Self>) -> Result<(), Error> {
        // A listener only once it must wait (then the state is looked at again before
        // the wait): every journaled append comes here, and a listener allocates.
        let mut listener = None;
        loop {
            if self.stopped.get() {
                return Err(Error::Config("the shard's journal is stopped".into()));
            }
            if !self.opening.get() {
                let (full, failed) = match &*self.active.borrow() {
                    Some(c) => (c.file.len() >= self.chunk_bytes, c.file.failure().is_some()),
                    None => (true, false),
                };
                if !full && !failed {
                    return Ok(());
                }
                if failed {
                    let recent = self
                        .failed_at
                        .get()
                        .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1));
                    if recent {
                        return Err(Error::Failed(
                            "the shard journal's last chunk failed less than a second ago".into(),
                        ));
                    }
                }
                if self.closed.borrow().len() < CLOSED_CHUNKS_MAX {
                    // Boxed: rare, and its future would make every journaled append's
                    // future (and each copy of it) larger.
                    Box::pin(self.open_next(failed)).await?;
                    continue;
                }
            }
            // Another task opens the next chunk, or too many wait for a checkpoint.
            match listener.take() {
                Some(l) => l.await,
                None => listener = Some(self.changed.listen()),
            }
        }
    }

    async fn open_next(self: &Rc<Self>, failed: bool) -> Result<(), Error> {
        self.opening.set(true);
        let _opening = Opening(self);
        // Everything of the full chunk is durable before anything of the next one is
        // written: a replay reads each chunk up to its first torn record and goes on
        // with the next, which must not hold records whose predecessors were torn.
        let full = self.active.borrow().as_ref().map(|c| c.file.clone());
        if let (Some(f), false) = (full, failed) {
            f.sync_all().await?;
        }
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        let path = self.dir.join(format!("{seq:020}{SUFFIX}"));
        let file = AppendFile::open_journal(
            &path,
            self.write_bytes_max,
            preallocate_step_max(self.chunk_bytes),
        )
        .await?;
        file::sync_dir(&self.dir).await?;
        let old = self.active.replace(Some(Chunk {
            seq,
            path,
            file,
            logs: HashMap::new(),
            names: Default::default(),
        }));
        if let Some(old) = old {
            if failed {
                // Its records up to the failure may be all a log has: kept for replay.
                self.failed_at.set(Some(std::time::Instant::now()));
                self.kept.borrow_mut().push(Kept::of(old));
            } else {
                self.closed.borrow_mut().push_back(old);
                self.start_checkpoints();
            }
        }
        Ok(())
    }

    /// Pushes an append of `log` (its batch as stored, in pieces) to the open chunk
    /// (see [`Self::ready`]); never awaits.
    pub fn push_append(&self, log: &PartitionLog, batch: &[Bytes]) -> Result<Pushed, Error> {
        self.push(log, APPEND, &[], batch)
    }

    /// Pushes a change of `log` other than an append (see [`Self::ready`]).
    pub fn push_change(&self, log: &PartitionLog, op: &Op) -> Result<Pushed, Error> {
        match op {
            Op::Truncate(o) => self.push(log, TRUNCATE, &o.to_le_bytes(), &[]),
            Op::Reset(o) => self.push(log, RESET, &o.to_le_bytes(), &[]),
            Op::Delete => self.push(log, DELETE, &[], &[]),
            Op::Append(_) => Err(Error::Config(
                "an append goes to the journal through push_append".into(),
            )),
        }
    }

    fn push(
        &self,
        log: &PartitionLog,
        kind: u8,
        fixed: &[u8],
        pieces: &[Bytes],
    ) -> Result<Pushed, Error> {
        let mut active = self.active.borrow_mut();
        let Some(chunk) = active.as_mut() else {
            return Err(Error::Config(
                "the shard's journal has no open chunk".into(),
            ));
        };
        let head = encode(log.name(), kind, fixed, pieces);
        let mut target = chunk.file.push_bytes(Bytes::from(head))?;
        for p in pieces {
            target = chunk.file.push_bytes(p.clone())?;
        }
        if let std::collections::hash_map::Entry::Vacant(v) = chunk.logs.entry(log.id()) {
            v.insert(log.me());
            chunk.names.insert(log.name().to_string());
        }
        if kind == APPEND && !log.idle_watched.replace(true) {
            self.unidle.borrow_mut().push(log.me());
        }
        Ok(Pushed {
            file: chunk.file.clone(),
            target,
        })
    }

    fn start_checkpoints(self: &Rc<Self>) {
        if self.checkpointing.replace(true) {
            return;
        }
        let me = Rc::downgrade(self);
        glommio::spawn_local(async move {
            loop {
                let Some(wal) = me.upgrade() else { return };
                let Some(chunk) = wal.closed.borrow_mut().pop_front() else {
                    wal.checkpointing.set(false);
                    return;
                };
                // Once a chunk is kept, every later one is too: a replay must find
                // what follows its records.
                let kept = !wal.kept.borrow().is_empty() || checkpoint(&chunk).await;
                if kept {
                    wal.kept.borrow_mut().push(Kept::of(chunk));
                }
                wal.changed.notify(usize::MAX);
            }
        })
        .detach();
    }

    /// Every record for `name` in this shard's current chunks (closed, kept and active,
    /// each up to what is durable), in order: what a log reopened after a failure
    /// replays.
    pub async fn records_for(&self, name: &str) -> Result<Vec<Op>, Error> {
        // (sequence, file, bytes durable in it)
        let mut files: Vec<(u64, PathBuf, u64)> = Vec::new();
        for k in self.kept.borrow().iter() {
            if k.names.contains(name) {
                files.push((k.seq, k.path.clone(), k.durable));
            }
        }
        for c in self
            .closed
            .borrow()
            .iter()
            .chain(self.active.borrow().iter())
        {
            if c.names.contains(name) {
                files.push((c.seq, c.path.clone(), c.file.durable_len()));
            }
        }
        files.sort_by_key(|f| f.0);
        let mut records = Vec::new();
        for (_, path, durable) in files {
            let mut buf = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
            buf.truncate(durable as usize);
            records.extend(
                decode(&Bytes::from(buf))
                    .into_iter()
                    .filter(|(n, _)| n == name),
            );
        }
        Ok(by_log(records)
            .into_iter()
            .flat_map(|(_, ops)| ops)
            .collect())
    }

    /// A log with records here failed (its segment files may lack what they hold).
    pub fn note_failed(&self, name: &str) {
        self.failed.borrow_mut().insert(name.to_string());
    }

    /// A log of that name was reopened and replayed what is here for it.
    pub fn forget_failed(&self, name: &str) {
        self.failed.borrow_mut().remove(name);
    }

    /// After a clean stop closed (synced) every log: deletes every chunk, unless a log
    /// that failed was not reopened since (its records wait for the next start's
    /// replay). Appends are refused from now on.
    pub async fn clear(&self) -> Result<(), Error> {
        self.stopped.set(true);
        self.changed.notify(usize::MAX);
        if !self.failed.borrow().is_empty() {
            tracing::warn!(logs = self.failed.borrow().len(), "the shard journal is kept for the next start: logs with records in it failed and were not reopened");
            return Ok(());
        }
        let mut paths: Vec<PathBuf> = Vec::new();
        if let Some(c) = self.active.borrow_mut().take() {
            paths.push(c.path);
        }
        paths.extend(self.closed.borrow_mut().drain(..).map(|c| c.path));
        paths.extend(self.kept.borrow_mut().drain(..).map(|c| c.path));
        for p in paths {
            file::remove(&p).await.map_err(|e| Error::io(&p, e))?;
        }
        self.changed.notify(usize::MAX);
        file::sync_dir(&self.dir).await
    }
}

/// A chunk kept for the next start's replay, its file closed.
struct Kept {
    seq: u64,
    path: PathBuf,
    names: std::collections::HashSet<String>,
    durable: u64,
}

impl Kept {
    fn of(chunk: Chunk) -> Kept {
        Kept {
            seq: chunk.seq,
            durable: chunk.file.durable_len(),
            path: chunk.path,
            names: chunk.names,
        }
    }
}

struct Opening<'a>(&'a Wal);

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.0.opening.set(false);
        self.0.changed.notify(usize::MAX);
    }
}

/// Makes a closed chunk's records durable in their segment files, then deletes it.
/// True if it must be kept (a log's segment could not be synced).
async fn checkpoint(chunk: &Chunk) -> bool {
    if let Err(e) = chunk.file.seal().await {
        tracing::error!(chunk = %chunk.path.display(), error = %e, "the shard journal's closed chunk could not be sealed; kept for the next start's replay");
        return true;
    }
    let logs: Vec<Rc<PartitionLog>> = chunk.logs.values().filter_map(Weak::upgrade).collect();
    // Every log's segment bytes written (a bounded number at once), then made durable
    // together: one shared `syncfs` round instead of an `fdatasync` per file.
    let mut files = Vec::with_capacity(logs.len());
    // Logs whose write or sync was refused: their file refuses work while a truncation
    // or a close runs (until the cut or the seal is durable), or it failed.
    let mut again = Vec::new();
    for group in logs.chunks(CHECKPOINT_CONCURRENCY) {
        let tasks: Vec<_> = group
            .iter()
            .map(|log| {
                let log = log.clone();
                glommio::spawn_local(async move { (log.write_segment().await, log) }).detach()
            })
            .collect();
        for (t, log) in tasks.into_iter().zip(group) {
            match t.await {
                Some((Ok(f), log)) => files.extend(f.map(|f| (log, f))),
                Some((Err(_), log)) => again.push(log),
                None => again.push(log.clone()),
            }
        }
    }
    let only: Vec<_> = files.iter().map(|(_, f)| f.clone()).collect();
    for ((log, _), r) in files.iter().zip(file::sync_written_together(&only).await) {
        if r.is_err() {
            again.push(log.clone());
        }
    }
    let mut kept = false;
    for log in again {
        if let Err(e) = settle(&log).await {
            tracing::warn!(chunk = %chunk.path.display(), log = %log.name(), error = %e, "a log of the shard journal's chunk could not be made durable in its segment file; the chunk is kept for the next start's replay");
            kept = true;
        }
    }
    if kept {
        return true;
    }
    if let Err(e) = file::remove(&chunk.path).await {
        tracing::warn!(chunk = %chunk.path.display(), error = %e, "could not delete a checkpointed journal chunk");
    }
    false
}

/// Tries of [`settle`], [`SETTLE_PAUSE`] apart.
const SETTLE_TRIES: u32 = 40;
const SETTLE_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Makes `log`'s segment bytes durable on its own, once a truncation or close that
/// refused the checkpoint's write or round has ended (its own cut or seal makes
/// durable what it keeps); an error once the log reports a failure of its own, or
/// after [`SETTLE_TRIES`]. Without this, a truncation that happened to run during a
/// checkpoint kept its chunk, and so every later chunk, until the next start.
async fn settle(log: &PartitionLog) -> Result<(), Error> {
    let mut last = None;
    for _ in 0..SETTLE_TRIES {
        if let Some(cause) = log.failure() {
            return Err(Error::Failed(cause));
        }
        match log.write_segment().await {
            Ok(None) => return Ok(()),
            Ok(Some(f)) => match f.sync_all().await {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            },
            Err(e) => last = Some(e),
        }
        glommio::timer::sleep(SETTLE_PAUSE).await;
    }
    Err(last.unwrap_or_else(|| Error::Failed("not settled".into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_take_at_most_a_tenth_of_a_small_file_system() {
        const MIB: u64 = 1 << 20;
        // A large disk: the configured size.
        assert_eq!(chunk_bytes_for(128 * MIB, 1 << 40, 2), 128 * MIB);
        // 128 MiB, one shard: three chunks within 12.8 MiB, aligned.
        let c = chunk_bytes_for(128 * MIB, 128 * MIB, 1);
        assert!(
            c * 3 <= 128 * MIB / 10 && c.is_multiple_of(file::ALIGN) && c > 4 * MIB - file::ALIGN,
            "{c}"
        );
        // Never below 1 MiB, and never above what is configured.
        assert_eq!(chunk_bytes_for(128 * MIB, 8 * MIB, 4), MIB);
        assert_eq!(chunk_bytes_for(64 << 10, 128 * MIB, 1), 64 << 10);
    }
}
