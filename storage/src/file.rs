//! An append-only O_DIRECT file: bytes are accepted synchronously into a pending
//! buffer, written in whole aligned pages (the partially filled tail page is rewritten
//! as it fills) and made durable by group-committed `fdatasync` (or, when many of a
//! shard's files want one at once, a shared `syncfs` round; see [`DEFAULT_SHARED_SYNC_MIN`]).
//!
//! One write is in flight per file at a time, so writes that rewrite the same tail page
//! can never land out of order; every write carries everything that was pending when
//! it was prepared (up to `write_bytes_max`). While a write is in flight the next one
//! is already prepared (copied into its aligned buffer, starting with the tail page as
//! the in-flight write leaves it), so the copy overlaps the device's work and the next
//! write is submitted the moment the previous one completes. Likewise one `fdatasync` is
//! in flight at a time, and it covers every byte written before it started: callers
//! that arrive while it runs are covered by the next one. A segment log opened
//! write-through (`O_DSYNC`, see [`DEFAULT_DSYNC_LOGS_MAX`]) needs no `fdatasync`: each
//! write is durable when it completes, and the writes themselves group-commit what
//! arrived meanwhile. A shard keeps at most [`DEVICE_OPS_MAX`] writes and syncs in the
//! kernel at once, over all its files. All of this lives on one shard; nothing here is
//! `Send`.
//!
//! After an I/O error the file is failed: every later call returns the error, because
//! what is on disk is no longer known (after a failed `fdatasync` the kernel may have
//! dropped the dirty state, so a later sync that succeeds proves nothing). Only a
//! reopen, which re-reads the file (recovery), trusts it again. [`AppendFile::failure`]
//! tells whether and why.
//!
//! Segment `.log` files are preallocated in growing steps (see [`PREALLOCATE_BYTES`]).
//! Every I/O here first passes the fault-injection hook ([`crate::fault::check`]), next
//! to the crash simulation's ([`crate::simdisk`]).

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::VecDeque;

use bytes::Bytes;
use event_listener::Event;
use glommio::io::{DmaFile, OpenOptions};

use crate::failure;
use crate::fault::{self, FaultOp};
use crate::simdisk;
use crate::Error;

/// Pending bytes worth copying into the next write's buffer while a write is in
/// flight ([`AppendFile::wait_written`]). Below this the copy is cheap next to the
/// device's work, and preparing early would close the next write to appends that
/// arrive later during the one in flight, sending them in a write of their own.
const PREPARE_AHEAD_MIN: usize = 64 << 10;

/// Direct-I/O alignment used for every write position and size.
pub const ALIGN: u64 = 4096;

fn align_down(v: u64) -> u64 {
    v & !(ALIGN - 1)
}

fn align_up(v: u64) -> u64 {
    (v + ALIGN - 1) & !(ALIGN - 1)
}

struct State {
    /// Logical length: every byte accepted so far.
    len: u64,
    /// Accepted bytes not yet copied into a write buffer, starting at `staged`: the
    /// callers' own buffers, copied once, into the aligned write buffer.
    pending: VecDeque<Bytes>,
    pending_len: usize,
    /// Bytes `[align_down(staged), staged)`: the tail page as the last prepared write
    /// leaves it.
    tail: Vec<u8>,
    /// End of the bytes copied into prepared or submitted writes.
    staged: u64,
    /// The next write, ready to submit (at most one, bounding memory).
    prepared: Option<Prepared>,
    written: u64,
    durable: u64,
    writing: bool,
    syncing: bool,
    failed: failure::Slot,
    /// File size reserved with fallocate (zero-filled beyond `len`).
    allocated: u64,
    /// Whether to keep preallocating: cleared when a fallocate fails (for ENOSPC the
    /// space is not there; a file system without fallocate never will have it). The
    /// next segment, a new file, tries again.
    preallocating: bool,
    /// A truncation is under way: `failed` is set only to refuse work meanwhile, and
    /// [`AppendFile::failure`] does not report it (see [`AppendFile::truncate`]).
    truncating: bool,
    /// Bumped by truncation: a write or sync that started before it claims nothing.
    epoch: u64,
    /// Writes started so far.
    writes: u64,
}

/// A write ready to submit: an aligned buffer for position `pos` ending the file's
/// data at `end`.
struct Prepared {
    buf: glommio::io::DmaBuffer,
    pos: u64,
    end: u64,
}

/// The largest step a segment `.log` file is preallocated by (fallocate ahead of the
/// writes), so that O_DIRECT writes overwrite allocated blocks instead of extending the
/// file: ext4 serialises extending writes (an extending direct write updates the inode
/// size and waits for it), while overwrites of allocated blocks proceed in parallel.
///
/// The step grows with the file: [`PREALLOCATE_FIRST_BYTES`] first, then the size
/// allocated so far, up to this much ([`preallocate_step`]): a new or idle partition
/// costs 1 MiB of disk ahead, not 32, and a busy one soon preallocates in 32 MiB steps.
/// A failed fallocate (ENOSPC on a nearly full disk) is not retried for that file:
/// the writes then extend it, as on a file system without fallocate. Sealing a segment
/// trims what was preallocated beyond its end. Small files (indexes, metadata) pass 0.
pub const PREALLOCATE_BYTES: u64 = 32 << 20;

/// The first preallocation step of a file (see [`PREALLOCATE_BYTES`]).
pub const PREALLOCATE_FIRST_BYTES: u64 = 1 << 20;

/// The free bytes preallocation leaves on the file system (0: no floor); see
/// [`keep_free_when_preallocating`].
static PREALLOCATE_KEEP_FREE: AtomicU64 = AtomicU64::new(0);

/// Preallocation never takes the file system's free space below `bytes` (process-wide;
/// the broker passes its free-space minimum). A step that would is skipped — the write
/// extends the file by what it writes instead — and the next step tries again, so space
/// reserved ahead of one busy segment cannot eat the reserve kept for metadata and the
/// internal topics.
pub fn keep_free_when_preallocating(bytes: u64) {
    PREALLOCATE_KEEP_FREE.store(bytes, Ordering::Relaxed);
}

thread_local! {
    /// Bytes preallocated ahead of the writes and not yet written, over every
    /// [`AppendFile`] of this thread (a shard), and the most there may be.
    static UNWRITTEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static UNWRITTEN_MAX: std::cell::Cell<u64> = const { std::cell::Cell::new(DEFAULT_PREALLOCATED_MAX) };
}

/// The default of [`set_preallocated_max`]: 512 MiB per shard.
pub const DEFAULT_PREALLOCATED_MAX: u64 = 512 << 20;

/// Caps the bytes this thread's (shard's) files hold preallocated but not yet written:
/// with thousands of partitions appending, each preallocation step is cut to what is
/// left under the cap, and at the cap writes extend their files instead (slower on
/// ext4, never refused). Sealing, truncating or dropping a file gives its share back.
pub fn set_preallocated_max(bytes: u64) {
    UNWRITTEN_MAX.with(|m| m.set(bytes));
}

/// Bytes this thread's files hold preallocated but not yet written.
pub fn preallocated_unwritten() -> u64 {
    UNWRITTEN.with(|u| u.get())
}

/// Accounts a file's change of preallocated-unwritten bytes from `before` to `after`.
fn account_unwritten(before: u64, after: u64) {
    UNWRITTEN.with(|u| u.set((u.get() + after).saturating_sub(before)));
}

fn unwritten_of(st: &State) -> u64 {
    st.allocated.saturating_sub(st.len)
}

/// A file system's size and the bytes an unprivileged writer may still use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Space {
    pub free: u64,
    pub total: u64,
}

/// The space of the file system holding `path` (`statvfs`: no I/O).
pub fn space_of(path: &Path) -> std::io::Result<Space> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a NUL-terminated path and `st` a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok(Space {
        free: st.f_bavail as u64 * unit,
        total: st.f_blocks as u64 * unit,
    })
}

/// How far to preallocate beyond `allocated` bytes for a file whose steps go up to
/// `max_step` (0: never): doubling from [`PREALLOCATE_FIRST_BYTES`] up to `max_step`.
pub fn preallocate_step(allocated: u64, max_step: u64) -> u64 {
    allocated
        .max(PREALLOCATE_FIRST_BYTES.min(max_step))
        .min(max_step)
}

pub struct AppendFile {
    /// Opened `O_DSYNC`: a completed write is durable (see [`DEFAULT_DSYNC_LOGS_MAX`]).
    dsync: bool,
    file: Rc<DmaFile>,
    path: PathBuf,
    write_bytes_max: usize,
    /// The largest preallocation step (0: never preallocate); see [`preallocate_step`].
    preallocate_bytes: u64,
    state: RefCell<State>,
    written_event: Event,
    synced_event: Event,
    /// The crash simulation's record of this file, in tests that enable it.
    sim: Option<simdisk::Handle>,
}

impl AppendFile {
    /// Opens (creating if needed) `path` for appending after its first `valid_len`
    /// bytes; anything beyond is cut off (durably), so bytes recovery did not validate
    /// are gone. `preallocate_bytes`: preallocate in growing steps of at most this size
    /// (0: don't; see [`PREALLOCATE_BYTES`]).
    pub async fn open(
        path: &Path,
        valid_len: u64,
        write_bytes_max: usize,
        preallocate_bytes: u64,
    ) -> Result<Rc<AppendFile>, Error> {
        Self::open_with(path, valid_len, write_bytes_max, preallocate_bytes, false).await
    }

    /// [`Self::open`] for a segment's `.log`: write-through (`O_DSYNC`) if `wanted` and
    /// fewer than this shard's [`set_dsync_logs_max`] are open, else synced by
    /// `fdatasync`.
    pub async fn open_log(
        path: &Path,
        valid_len: u64,
        write_bytes_max: usize,
        preallocate_bytes: u64,
        wanted: bool,
    ) -> Result<Rc<AppendFile>, Error> {
        // Taken before the open suspends, so that logs opening at once cannot all
        // take the last place; the file gives it back when dropped.
        let dsync = wanted
            && DSYNC_LOGS.with(|n| {
                let room = n.get() < DSYNC_LOGS_MAX.with(|m| m.get());
                if room {
                    n.set(n.get() + 1);
                }
                room
            });
        let res = Self::open_with(path, valid_len, write_bytes_max, preallocate_bytes, dsync).await;
        if dsync && res.is_err() {
            DSYNC_LOGS.with(|n| n.set(n.get() - 1));
        }
        res
    }

    /// [`Self::open`] written through (`O_DSYNC`), for the shard journal's chunks
    /// ([`crate::wal`]): a completed write is durable. Not counted against the shard's
    /// write-through segment logs, though it gives a place back when dropped like one.
    pub(crate) async fn open_journal(
        path: &Path,
        write_bytes_max: usize,
        preallocate_bytes: u64,
    ) -> Result<Rc<AppendFile>, Error> {
        DSYNC_LOGS.with(|n| n.set(n.get() + 1));
        let res = Self::open_with(path, 0, write_bytes_max, preallocate_bytes, true).await;
        if res.is_err() {
            DSYNC_LOGS.with(|n| n.set(n.get() - 1));
        }
        res
    }

    async fn open_with(
        path: &Path,
        valid_len: u64,
        write_bytes_max: usize,
        preallocate_bytes: u64,
        dsync: bool,
    ) -> Result<Rc<AppendFile>, Error> {
        simdisk::alive().map_err(|e| Error::io(path, e))?;
        fault::check_io(path, FaultOp::Open)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .custom_flags(if dsync { libc::O_DSYNC } else { 0 })
            .dma_open(path)
            .await
            .map_err(|e| Error::io(path, e))?;
        let size = file.file_size().await.map_err(|e| Error::io(path, e))?;
        if size != valid_len {
            fault::check_io(path, FaultOp::Sync)?;
            file.truncate(valid_len)
                .await
                .map_err(|e| Error::io(path, e))?;
            file.fdatasync().await.map_err(|e| Error::io(path, e))?;
            simdisk::cut(path, valid_len);
        }
        let tail_start = align_down(valid_len);
        let tail = if valid_len > tail_start {
            fault::check_io(path, FaultOp::Read)?;
            let r = file
                .read_at_aligned(tail_start, ALIGN as usize)
                .await
                .map_err(|e| Error::io(path, e))?;
            r[..(valid_len - tail_start) as usize].to_vec()
        } else {
            Vec::new()
        };
        Ok(Rc::new(AppendFile {
            dsync,
            file: Rc::new(file),
            path: path.to_path_buf(),
            write_bytes_max: write_bytes_max.max(ALIGN as usize),
            preallocate_bytes,
            state: RefCell::new(State {
                len: valid_len,
                pending: VecDeque::new(),
                pending_len: 0,
                tail,
                staged: valid_len,
                prepared: None,
                written: valid_len,
                durable: valid_len,
                writing: false,
                syncing: false,
                failed: failure::Slot::default(),
                allocated: valid_len,
                preallocating: preallocate_bytes > 0,
                truncating: false,
                epoch: 0,
                writes: 0,
            }),
            written_event: Event::new(),
            synced_event: Event::new(),
            sim: simdisk::register(path),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn dma_file(&self) -> &Rc<DmaFile> {
        &self.file
    }

    /// Logical length including bytes not yet written.
    pub fn len(&self) -> u64 {
        self.state.borrow().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn written_len(&self) -> u64 {
        self.state.borrow().written
    }

    /// Starts a write of everything accepted so far if at least `min` bytes are
    /// unwritten and no write is in flight (the shard journal's segment files are
    /// written behind it: nothing waits for this write).
    pub fn write_behind(self: &Rc<Self>, min: u64) {
        let target = {
            let st = self.state.borrow();
            if st.writing || st.failed.is_some() || st.len - st.written < min {
                return;
            }
            st.len
        };
        let this = self.clone();
        glommio::spawn_local(async move {
            // An error fails the file; its log reports it at its next operation.
            let _ = this.wait_written(target).await;
        })
        .detach();
    }

    /// Device writes started so far.
    pub fn writes(&self) -> u64 {
        self.state.borrow().writes
    }

    pub fn durable_len(&self) -> u64 {
        self.state.borrow().durable
    }

    /// Why the file is failed (an I/O error left its state unknown), if it is. A
    /// truncation under way is not reported (it refuses work only while it runs);
    /// one that was interrupted is.
    pub fn failure(&self) -> Option<String> {
        if !failure::any() {
            return None;
        }
        let st = self.state.borrow();
        match st.failed.get() {
            Some(msg) if !st.truncating => Some(format!("{}: {msg}", self.path.display())),
            _ => None,
        }
    }

    /// Fails the file for `cause` (unless it is failed already): no write or sync
    /// starts from now on and every waiter gets the error. For a log that failed
    /// elsewhere, so that this file stops changing before recovery re-reads it.
    pub fn fail(&self, cause: &str) {
        {
            let mut st = self.state.borrow_mut();
            if st.failed.is_some() {
                return;
            }
            st.failed.set(format!("failed with its log: {cause}"));
        }
        self.written_event.notify(usize::MAX);
        self.synced_event.notify(usize::MAX);
    }

    /// A truncation is under way (work is refused meanwhile; see [`Self::failure`]).
    pub fn truncating(&self) -> bool {
        self.state.borrow().truncating
    }

    pub(crate) fn check_failed(&self) -> Result<(), Error> {
        match self.state.borrow().failed.get() {
            Some(msg) => Err(Error::Failed(format!("{}: {msg}", self.path.display()))),
            None => Ok(()),
        }
    }

    /// Accepts bytes; returns the logical length after them. Never blocks.
    pub fn push(&self, data: &[u8]) -> Result<u64, Error> {
        self.push_bytes(Bytes::copy_from_slice(data))
    }

    /// Accepts bytes without copying them; returns the logical length after them.
    pub fn push_bytes(&self, data: Bytes) -> Result<u64, Error> {
        self.check_failed()?;
        let mut st = self.state.borrow_mut();
        let before = unwritten_of(&st);
        st.len += data.len() as u64;
        account_unwritten(before, unwritten_of(&st));
        if !data.is_empty() {
            st.pending_len += data.len();
            st.pending.push_back(data);
        }
        Ok(st.len)
    }

    /// Waits until every byte below `target` (clamped to the length) has been written
    /// to the device.
    ///
    /// Cancel-safe: the writes themselves run in detached tasks that own their state
    /// updates, so dropping this future never leaves a write half-accounted.
    pub async fn wait_written(self: &Rc<Self>, target: u64) -> Result<(), Error> {
        loop {
            self.check_failed()?;
            let listener = {
                let mut st = self.state.borrow_mut();
                let target = target.min(st.len);
                if st.written >= target {
                    return Ok(());
                }
                if st.writing {
                    // Use the wait: copy the next write's bytes now, if there are enough
                    // for the copy to matter. Small appends wait: what arrives until the
                    // write in flight completes goes out with them in the next one.
                    if st.prepared.is_none() && st.pending_len >= PREPARE_AHEAD_MIN {
                        st.prepared = self.prepare(&mut st);
                    }
                } else {
                    self.start_write(&mut st);
                }
                self.written_event.listen()
            };
            {
                let st = self.state.borrow();
                if st.written >= target.min(st.len) || st.failed.is_some() {
                    continue;
                }
            }
            listener.await;
        }
    }

    /// Copies pending bytes (up to `write_bytes_max`) into an aligned buffer that
    /// starts with the current tail page.
    fn prepare(&self, st: &mut State) -> Option<Prepared> {
        let take = st.pending_len.min(self.write_bytes_max);
        if take == 0 {
            return None;
        }
        let pos = align_down(st.staged);
        let tail_len = st.tail.len();
        let data_len = tail_len + take;
        let mut buf = self
            .file
            .alloc_dma_buffer(align_up(data_len as u64) as usize);
        let bytes = buf.as_bytes_mut();
        bytes[..tail_len].copy_from_slice(&st.tail);
        let mut at = tail_len;
        while at < data_len {
            let front = st.pending.front_mut().expect("pending covers take");
            let n = front.len().min(data_len - at);
            bytes[at..at + n].copy_from_slice(&front[..n]);
            if n == front.len() {
                st.pending.pop_front();
            } else {
                let _ = front.split_to(n);
            }
            at += n;
        }
        st.pending_len -= take;
        bytes[data_len..].fill(0);
        let end = st.staged + take as u64;
        let tail_start = (align_down(end) - pos) as usize;
        st.tail = bytes[tail_start..data_len].to_vec();
        st.staged = end;
        Some(Prepared { buf, pos, end })
    }

    /// Starts the next write (the prepared one, or one prepared now) in a detached
    /// task, if there is anything to write and no write is in flight.
    fn start_write(self: &Rc<Self>, st: &mut State) {
        if st.writing || st.failed.is_some() {
            return;
        }
        let next = match st.prepared.take() {
            Some(p) => p,
            None => match self.prepare(st) {
                Some(p) => p,
                None => return,
            },
        };
        st.writing = true;
        st.writes += 1;
        let write_end = next.pos + next.buf.len() as u64;
        let grow_to = (st.preallocating && write_end > st.allocated)
            .then(|| {
                // Within the shard's cap on preallocated-unwritten bytes.
                let room = UNWRITTEN_MAX
                    .with(|m| m.get())
                    .saturating_sub(preallocated_unwritten());
                let step = preallocate_step(st.allocated, self.preallocate_bytes).min(room);
                // Rounded to whole pages, never past the cap.
                let size = align_up(write_end.max(st.allocated + step))
                    .min(align_down(st.allocated + room));
                (size > write_end.max(st.allocated) + ALIGN).then(|| (size, size - st.allocated))
            })
            .flatten();
        // The step counts against the cap from now: the write may wait its turn
        // (`DEVICE_OPS_MAX`) before it preallocates, and other files' steps decided
        // meanwhile must see it. `preallocate` settles it.
        if let Some((_, grow)) = grow_to {
            account_unwritten(0, grow);
        }
        let epoch = st.epoch;
        let this = self.clone();
        glommio::spawn_local(async move { this.run_write(next, grow_to, epoch).await }).detach();
    }

    /// `grow_to`: preallocate up to this size first, growing the file by that much.
    async fn run_write(self: Rc<Self>, next: Prepared, grow_to: Option<(u64, u64)>, epoch: u64) {
        if let Err(e) = self.sim_gate().await {
            if let Some((_, grow)) = grow_to {
                account_unwritten(grow, 0);
            }
            {
                let mut st = self.state.borrow_mut();
                st.writing = false;
                st.failed.set(e.to_string());
            }
            self.written_event.notify(usize::MAX);
            return;
        }
        let permit = device_op().await;
        if let Some((size, grow)) = grow_to {
            self.preallocate(size, grow).await;
        }
        let Prepared { buf, pos, end } = next;
        let expected = buf.len();
        let sim_copy = self.sim.as_ref().map(|_| buf.as_bytes().to_vec());
        // A write-through write is also the sync: a sync fault fails it.
        let injected = match self.injected(FaultOp::Write).await {
            Ok(()) if self.dsync => self.injected(FaultOp::Sync).await,
            r => r,
        };
        let started = std::time::Instant::now();
        let res = match injected {
            Ok(()) => self.file.write_at(buf, pos).await.map_err(Into::into),
            Err(e) => Err(e),
        };
        if self.dsync {
            // It made its group durable, as an fdatasync does for other files.
            crate::stats::FSYNC.record(started.elapsed());
        }
        drop(permit);
        if let Some(h) = &self.sim {
            match (&res, &sim_copy) {
                (Ok(n), Some(data)) if *n == expected && self.dsync => {
                    simdisk::wrote_through(h, pos, data)
                }
                (Ok(n), Some(data)) if *n == expected => simdisk::wrote(h, pos, data),
                _ => simdisk::failed(h),
            }
        }
        let mut st = self.state.borrow_mut();
        st.writing = false;
        match res {
            Ok(n) if n == expected => {
                if st.epoch == epoch {
                    st.written = st.written.max(end);
                    if self.dsync {
                        // O_DSYNC: the write completed once its data (and the metadata
                        // to read it back) were durable; earlier writes were too.
                        st.durable = st.durable.max(end.min(st.len));
                    }
                }
                // Keep the pipeline going even if every waiter went away.
                if st.prepared.is_some() || st.pending_len > 0 {
                    self.start_write(&mut st);
                }
            }
            Ok(n) => {
                st.failed
                    .set(format!("short write: {n} of {expected} bytes at {pos}"));
            }
            Err(e) => st.failed.set(Error::io(&self.path, e).to_string()),
        }
        drop(st);
        self.written_event.notify(usize::MAX);
    }

    /// Best effort: reserves the file up to `size` bytes (`grow` more than now). On
    /// failure (ENOSPC, or a file system without fallocate) the writes extend the file
    /// instead, and this file stops trying; a step that would pass the free-space floor
    /// is skipped. (The state is not borrowed here: this may run inline in the spawner,
    /// which holds it.)
    /// `grow` was counted against the shard's cap when the step was decided; this
    /// replaces it with what the file really gained.
    async fn preallocate(&self, size: u64, grow: u64) {
        let floor = PREALLOCATE_KEEP_FREE.load(Ordering::Relaxed);
        if floor > 0 {
            match space_of(&self.path) {
                Ok(s) if s.free >= floor.saturating_add(grow) => {}
                _ => {
                    account_unwritten(grow, 0);
                    return;
                }
            }
        }
        let res = match self.injected(FaultOp::Write).await {
            Ok(()) => self
                .file
                .pre_allocate(size, false)
                .await
                .map_err(std::io::Error::from),
            Err(e) => Err(e),
        };
        let mut st = self.state.borrow_mut();
        match res {
            Ok(()) => {
                let before = unwritten_of(&st);
                st.allocated = st.allocated.max(size);
                account_unwritten(before + grow, unwritten_of(&st));
            }
            Err(e) => {
                account_unwritten(grow, 0);
                st.preallocating = false;
                tracing::debug!(path = %self.path.display(), size, error = %e, "preallocation failed; the file grows by its writes");
            }
        }
    }

    /// The fault-injection check for the detached write and sync tasks: like
    /// [`Self::sim_gate`], an injected failure yields once before it is recorded, as a
    /// real I/O's would (the spawner may still hold the state borrow).
    async fn injected(&self, op: FaultOp) -> std::io::Result<()> {
        let res = fault::check(&self.path, op);
        if res.is_err() {
            futures_lite::future::yield_now().await;
        }
        res
    }

    /// Waits until every byte below `target` (clamped to the length) is durable
    /// (written and fdatasync'ed). Concurrent callers share syncs: one sync covers
    /// every byte written before it started. Cancel-safe like [`Self::wait_written`].
    pub async fn wait_durable(self: &Rc<Self>, target: u64) -> Result<(), Error> {
        loop {
            self.check_failed()?;
            {
                let st = self.state.borrow();
                if st.durable >= target.min(st.len) {
                    return Ok(());
                }
            }
            self.wait_written(target).await?;
            let listener = {
                let mut st = self.state.borrow_mut();
                let target = target.min(st.len);
                if st.durable >= target {
                    return Ok(());
                }
                if !st.syncing {
                    st.syncing = true;
                    let covered = st.written;
                    let epoch = st.epoch;
                    let this = self.clone();
                    glommio::spawn_local(async move { this.run_sync(covered, epoch).await })
                        .detach();
                }
                self.synced_event.listen()
            };
            {
                let st = self.state.borrow();
                if st.durable >= target.min(st.len) || st.failed.is_some() || !st.syncing {
                    continue;
                }
            }
            listener.await;
        }
    }

    /// `covered`, `epoch`: the spawner's mark. (Until its first suspension this may run
    /// inline in the spawner, which holds the state mutably borrowed.)
    async fn run_sync(self: Rc<Self>, mut covered: u64, mut epoch: u64) {
        let _wanted = SyncWanted::new();
        if self.sim.is_none() && SYNCS_WANTED.with(|w| w.get()) >= SHARED_SYNC_MIN.with(|m| m.get())
        {
            let res = match self.injected(FaultOp::Sync).await {
                // The round starts after this point, so it covers the spawner's mark.
                Ok(()) => {
                    crate::stats::FS_SYNC_FILES.fetch_add(1, Ordering::Relaxed);
                    sync_file_system(&self.file).await
                }
                Err(e) => Err(e),
            };
            self.synced(res, covered, epoch);
            return;
        }
        let permit = device_op().await;
        // If it waited its turn, it covers what was written meanwhile too. (Still inline
        // in the spawner, the state is borrowed and the spawner's mark is current.)
        if let Ok(st) = self.state.try_borrow() {
            (covered, epoch) = (st.written, st.epoch);
        }
        let res = match self.sim_gate().await {
            Ok(()) => {
                let mark = self.sim.as_ref().map(simdisk::sync_mark);
                let res = match self.injected(FaultOp::Sync).await {
                    Ok(()) => {
                        let started = std::time::Instant::now();
                        let r = self.file.fdatasync().await.map_err(Into::into);
                        crate::stats::FSYNC.record(started.elapsed());
                        r
                    }
                    Err(e) => Err(e),
                };
                self.sim_end(&res, |h| simdisk::synced(h, mark.unwrap_or(0)));
                res
            }
            Err(e) => Err(e),
        };
        drop(permit);
        self.synced(res, covered, epoch);
    }

    /// Ends a sync that covered `covered` bytes as of `epoch`.
    fn synced(&self, res: std::io::Result<()>, covered: u64, epoch: u64) {
        let mut st = self.state.borrow_mut();
        st.syncing = false;
        match res {
            // A truncation meanwhile (new epoch) voids what this sync covered.
            Ok(()) if st.epoch == epoch => st.durable = st.durable.max(covered.min(st.len)),
            Ok(()) => {}
            Err(e) => st.failed.set(Error::io(&self.path, e).to_string()),
        }
        drop(st);
        self.synced_event.notify(usize::MAX);
    }

    /// Records a shared round that covered this file's writes up to `covered` as of
    /// `epoch` (see [`sync_written_together`]); unlike [`Self::synced`], no sync of
    /// this file's own was running for it.
    fn covered_by_round(&self, res: &Result<(), i32>, covered: u64, epoch: u64) {
        let mut st = self.state.borrow_mut();
        match res {
            Ok(()) if st.epoch == epoch => st.durable = st.durable.max(covered.min(st.len)),
            Ok(()) => {}
            Err(e) => {
                let e = std::io::Error::from_raw_os_error(*e);
                if !st.failed.is_some() {
                    st.failed.set(Error::io(&self.path, e).to_string());
                }
            }
        }
        drop(st);
        self.synced_event.notify(usize::MAX);
    }

    /// Writes and syncs everything accepted so far.
    pub async fn sync_all(self: &Rc<Self>) -> Result<(), Error> {
        let len = self.len();
        self.wait_durable(len).await
    }

    async fn wait_no_sync(&self) {
        while self.state.borrow().syncing {
            let l = self.synced_event.listen();
            if !self.state.borrow().syncing {
                break;
            }
            l.await;
        }
    }

    /// Cuts the file to `new_len` bytes (≤ len), durably. Waits for in-flight writes
    /// and syncs first. If this future is dropped midway the file is left failed
    /// (refusing work) rather than inconsistent; while it runs, `failed` is set only to
    /// refuse work, which [`Self::failure`] does not report.
    pub async fn truncate(self: &Rc<Self>, new_len: u64) -> Result<(), Error> {
        let len = self.len();
        assert!(new_len <= len, "truncate beyond end: {new_len} > {len}");
        self.wait_written(len).await?;
        self.wait_no_sync().await;
        // A sync that failed meanwhile fails the truncation: its error must not be
        // overwritten below, and the cut's own sync (the kernel reports a failed
        // writeback once) would vouch for what it lost.
        self.check_failed()?;
        {
            let mut st = self.state.borrow_mut();
            st.epoch += 1;
            st.failed.set("truncation interrupted".into());
            st.truncating = true;
        }
        let _truncating = Truncating(&self.state);
        let res = self.truncate_file(new_len).await;
        let mut st = self.state.borrow_mut();
        match res {
            Ok(tail) => {
                account_unwritten(unwritten_of(&st), 0);
                st.failed.clear();
                st.len = new_len;
                st.pending.clear();
                st.pending_len = 0;
                st.prepared = None;
                st.staged = new_len;
                st.written = new_len;
                st.durable = new_len;
                st.allocated = new_len;
                st.tail = tail;
                Ok(())
            }
            Err(e) => {
                st.failed.set(e.to_string());
                Err(e)
            }
        }
    }

    /// Reads the new tail page, cuts the file and syncs the cut.
    async fn truncate_file(&self, new_len: u64) -> Result<Vec<u8>, Error> {
        let tail_start = align_down(new_len);
        let tail = if new_len > tail_start {
            fault::check_io(&self.path, FaultOp::Read)?;
            let r = self
                .file
                .read_at_aligned(tail_start, ALIGN as usize)
                .await
                .map_err(|e| Error::io(&self.path, e))?;
            r[..(new_len - tail_start) as usize].to_vec()
        } else {
            Vec::new()
        };
        self.cut_durably(new_len).await?;
        Ok(tail)
    }

    /// Cuts the file to `len` bytes and syncs the cut (and everything written before).
    async fn cut_durably(&self, len: u64) -> Result<(), Error> {
        self.sim_begin().map_err(|e| Error::io(&self.path, e))?;
        let res = async {
            fault::check(&self.path, FaultOp::Sync)?;
            self.file.truncate(len).await?;
            self.file.fdatasync().await?;
            Ok::<(), std::io::Error>(())
        }
        .await;
        self.sim_end(&res, |h| simdisk::truncated(h, len));
        res.map_err(|e| Error::io(&self.path, e))
    }

    /// [`Self::sim_begin`] for the detached write and sync tasks. glommio may poll a
    /// task inline when it is spawned, while the spawner still holds the state borrow;
    /// on failure the task yields once so that borrow is gone before it records the
    /// failure.
    async fn sim_gate(&self) -> std::io::Result<()> {
        let res = self.sim_begin();
        if res.is_err() {
            futures_lite::future::yield_now().await;
        }
        res
    }

    fn sim_begin(&self) -> std::io::Result<()> {
        match &self.sim {
            Some(h) => simdisk::begin(h),
            None => Ok(()),
        }
    }

    /// Reports an I/O's outcome to the crash simulation: `done` on success.
    fn sim_end<T, E>(&self, res: &Result<T, E>, done: impl FnOnce(&simdisk::Handle)) {
        if let Some(h) = &self.sim {
            match res {
                Ok(_) => done(h),
                Err(_) => simdisk::failed(h),
            }
        }
    }

    /// Writes, syncs, and trims the file to its logical length (drops page padding
    /// and preallocated space).
    pub async fn seal(self: &Rc<Self>) -> Result<(), Error> {
        self.sync_all().await?;
        self.wait_no_sync().await;
        self.check_failed()?;
        let len = self.len();
        let res = self.cut_durably(len).await;
        let mut st = self.state.borrow_mut();
        match res {
            Ok(()) => {
                account_unwritten(unwritten_of(&st), 0);
                st.allocated = len;
                Ok(())
            }
            Err(e) => {
                st.failed.set(e.to_string());
                Err(e)
            }
        }
    }
}

impl Drop for AppendFile {
    fn drop(&mut self) {
        // Its preallocated space is the file's now, no longer the shard's to bound.
        account_unwritten(unwritten_of(&self.state.borrow()), 0);
        if self.dsync {
            DSYNC_LOGS.with(|n| n.set(n.get() - 1));
        }
    }
}

/// Clears [`State::truncating`] when a truncation ends, also when its future is dropped
/// (the file then stays failed, and reports it).
struct Truncating<'a>(&'a RefCell<State>);

impl Drop for Truncating<'_> {
    fn drop(&mut self) {
        self.0.borrow_mut().truncating = false;
    }
}

/// Segment writes and `fdatasync`s a shard has in the kernel at once, over all its
/// files. Most of them block in the file system (extending or unwritten-extent writes,
/// syncs), so io_uring hands them to its worker pool, which runs a few at a time and
/// queues the rest; and glommio cancels its preemption timer on every turn of its
/// loop, which makes the kernel walk that queue. With 10,000 busy partitions the walk
/// took a fifth of the shard's CPU; a few dozen queued lose nothing, since the workers
/// only run a handful anyway. A sync that waits here also covers what was written
/// meanwhile (it takes its mark after the wait).
const DEVICE_OPS_MAX: u64 = 64;

thread_local! {
    static DEVICE_OPS: Rc<glommio::sync::Semaphore> =
        Rc::new(glommio::sync::Semaphore::new(DEVICE_OPS_MAX));
}

/// One of the shard's [`DEVICE_OPS_MAX`] places, held while a write or sync runs.
async fn device_op() -> Option<glommio::sync::StaticPermit> {
    DEVICE_OPS
        .with(|s| s.clone())
        .acquire_static_permit(1)
        .await
        .ok()
}

/// The default of [`set_shared_sync_min`]: once this many of a shard's files want an
/// `fdatasync` at once, each further one joins
/// a shared round instead: one `syncfs(2)` of the file system, on the shard's blocking
/// thread, covers every file on it (every write completed before the round started,
/// with the journal commit and device cache flush an `fdatasync` makes), and the files
/// that arrive while a round runs wait for the next one. With 10,000 partitions taking
/// one record each, per-file syncs cost one kernel round trip, journal commit and
/// device flush per partition (and [`DEVICE_OPS_MAX`] queued at once); a round costs
/// one for all of them. Below this, syncs stay per file: `syncfs` also writes back
/// whatever else on that file system is dirty (other programs' files), which a few
/// busy partitions should not wait for. Files under the crash simulation always sync
/// on their own, since it tracks each file's syncs. A failed round fails every file that
/// joined it: `syncfs` reports the file system's write-back error without saying whose.
pub const DEFAULT_SHARED_SYNC_MIN: u64 = 32;

/// The default of [`set_dsync_logs_max`]: a shard opens up to this many segment logs
/// write-through (`O_DSYNC`), the rest synced by `fdatasync` or shared rounds (see
/// [`DEFAULT_SHARED_SYNC_MIN`]).
///
/// Why: an `fdatasync` after each write is a second trip through io_uring's worker
/// threads and a second completion to wake the shard for, per append. With `O_DSYNC`
/// the write itself returns once its data, and the metadata needed to read it back
/// (extent conversion of the preallocated space), are durable: one operation. On this
/// project's 2-core VM (ext4 without a journal) A/B runs showed less broker CPU per
/// record and more throughput (docs/benchmarks.md, "Write-through segment logs").
/// With many busy partitions the opposite holds: each write-through write flushes the
/// device cache on its own, while shared `syncfs` rounds flush once for dozens of
/// files, so beyond this many open logs, new ones are not write-through.
pub const DEFAULT_DSYNC_LOGS_MAX: u64 = 32;

/// Sets how many of this thread's (shard's) segment logs are opened write-through
/// (0: none; see [`DEFAULT_DSYNC_LOGS_MAX`]). Logs open already keep their mode.
pub fn set_dsync_logs_max(n: u64) {
    DSYNC_LOGS_MAX.with(|m| m.set(n));
}

/// Sets how many of this thread's (shard's) files may want an `fdatasync` at once
/// before further ones share `syncfs` rounds (0: never; see [`DEFAULT_SHARED_SYNC_MIN`]).
pub fn set_shared_sync_min(n: u64) {
    SHARED_SYNC_MIN.with(|m| m.set(if n == 0 { u64::MAX } else { n }));
}

thread_local! {
    static DSYNC_LOGS_MAX: std::cell::Cell<u64> = const { std::cell::Cell::new(DEFAULT_DSYNC_LOGS_MAX) };
    /// Write-through logs open on this shard.
    static DSYNC_LOGS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static SHARED_SYNC_MIN: std::cell::Cell<u64> = const { std::cell::Cell::new(DEFAULT_SHARED_SYNC_MIN) };
    /// Syncs of this shard's files waiting or running.
    static SYNCS_WANTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Shared sync rounds, per file system (device) this shard's files live on.
    static FS_ROUNDS: RefCell<Vec<FsRounds>> = const { RefCell::new(Vec::new()) };
}

/// Counts a sync in [`SYNCS_WANTED`] while it lives.
struct SyncWanted;

impl SyncWanted {
    fn new() -> SyncWanted {
        SYNCS_WANTED.with(|w| w.set(w.get() + 1));
        SyncWanted
    }
}

impl Drop for SyncWanted {
    fn drop(&mut self) {
        SYNCS_WANTED.with(|w| w.set(w.get() - 1));
    }
}

/// The shared sync rounds of one file system: the next round (which files join until it
/// starts) and whether a task is running rounds.
struct FsRounds {
    dev: (u32, u32),
    next: Option<Rc<FsRound>>,
    running: bool,
}

/// One `syncfs` for the files that joined it. `file`: a joiner's file, whose descriptor
/// names the file system (kept open until the round ran).
struct FsRound {
    file: Rc<DmaFile>,
    /// `None` until it ran; then `Ok` or the errno.
    result: std::cell::Cell<Option<Result<(), i32>>>,
    done: Event,
}

/// Makes durable every write to `file`'s file system completed before the call, in a
/// round shared with the shard's other files there (see [`DEFAULT_SHARED_SYNC_MIN`]).
async fn sync_file_system(file: &Rc<DmaFile>) -> std::io::Result<()> {
    let dev = (file.dev_major(), file.dev_minor());
    let (round, start) = FS_ROUNDS.with(|rounds| {
        let mut rounds = rounds.borrow_mut();
        let i = match rounds.iter().position(|r| r.dev == dev) {
            Some(i) => i,
            None => {
                rounds.push(FsRounds {
                    dev,
                    next: None,
                    running: false,
                });
                rounds.len() - 1
            }
        };
        let fs = &mut rounds[i];
        let round = fs
            .next
            .get_or_insert_with(|| {
                Rc::new(FsRound {
                    file: file.clone(),
                    result: std::cell::Cell::new(None),
                    done: Event::new(),
                })
            })
            .clone();
        let start = !std::mem::replace(&mut fs.running, true);
        (round, start)
    });
    if start {
        glommio::spawn_local(run_fs_rounds(dev)).detach();
    }
    loop {
        if let Some(res) = round.result.get() {
            return res.map_err(std::io::Error::from_raw_os_error);
        }
        let listener = round.done.listen();
        if round.result.get().is_none() {
            listener.await;
        }
    }
}

/// Makes what `files` have written durable (each up to its written end when called)
/// with one shared `syncfs` round per file system instead of an `fdatasync` each: a
/// shard journal's checkpoint makes thousands of segment files durable at once, and
/// per-file syncs cost each a journal commit and a trip through io_uring's workers
/// (a quarter of a broker's CPU at 10,000 partitions with 32 MiB chunks). Files under
/// the crash simulation, which tracks each file's syncs, sync on their own
/// ([`AppendFile::sync_all`]). Bytes accepted but not yet written are not covered:
/// call it once the writes completed ([`AppendFile::wait_written`]). A failed round
/// fails every file it covered (as a shared round does); a fault injected on a file's
/// sync fails that file. One result per file, in order.
pub async fn sync_written_together(files: &[Rc<AppendFile>]) -> Vec<Result<(), Error>> {
    let mut out: Vec<Option<Result<(), Error>>> = Vec::with_capacity(files.len());
    // Per file system (device numbers): the files a round covers, as (index, written
    // end, epoch).
    type Members = Vec<(usize, u64, u64)>;
    let mut rounds: Vec<((u32, u32), Members)> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        if let Err(e) = f.check_failed() {
            out.push(Some(Err(e)));
            continue;
        }
        if f.sim.is_some() {
            out.push(Some(f.sync_all().await));
            continue;
        }
        if let Err(e) = f.injected(FaultOp::Sync).await {
            f.covered_by_round(&Err(e.raw_os_error().unwrap_or(libc::EIO)), 0, 0);
            out.push(Some(f.check_failed()));
            continue;
        }
        let (covered, epoch) = {
            let st = f.state.borrow();
            (st.written, st.epoch)
        };
        out.push(None);
        let dev = (f.file.dev_major(), f.file.dev_minor());
        match rounds.iter_mut().find(|(d, _)| *d == dev) {
            Some((_, v)) => v.push((i, covered, epoch)),
            None => rounds.push((dev, vec![(i, covered, epoch)])),
        }
    }
    for (_, members) in rounds {
        let first = &files[members[0].0];
        crate::stats::FS_SYNC_FILES.fetch_add(members.len() as u64, Ordering::Relaxed);
        let res = sync_file_system(&first.file)
            .await
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO));
        for (i, covered, epoch) in members {
            let f = &files[i];
            f.covered_by_round(&res, covered, epoch);
            out[i] = Some(match res {
                // A truncation meanwhile voided the round for this file: its own sync.
                Ok(()) => f.wait_durable(covered).await,
                Err(e) => Err(Error::io(&f.path, std::io::Error::from_raw_os_error(e))),
            });
        }
    }
    out.into_iter()
        .map(|r| r.expect("every file answered"))
        .collect()
}

/// Runs the rounds of file system `dev` one after the other while files join them.
async fn run_fs_rounds(dev: (u32, u32)) {
    loop {
        let round = FS_ROUNDS.with(|rounds| {
            let mut rounds = rounds.borrow_mut();
            let fs = rounds.iter_mut().find(|r| r.dev == dev)?;
            let round = fs.next.take();
            fs.running = round.is_some();
            round
        });
        let Some(round) = round else { return };
        let fd = round.file.as_raw_fd();
        let started = std::time::Instant::now();
        // `fd` stays open: the round holds its file until this returns.
        let res = glommio::executor()
            .spawn_blocking(move || syncfs(fd).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO)))
            .await;
        crate::stats::FSYNC.record(started.elapsed());
        crate::stats::FS_SYNC_ROUNDS.fetch_add(1, Ordering::Relaxed);
        round.result.set(Some(res));
        round.done.notify(usize::MAX);
    }
}

/// `syncfs(2)` of the file system holding the open descriptor `fd` (blocks: call it on
/// a blocking thread).
pub(crate) fn syncfs(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: syncfs only reads the descriptor, which the caller keeps open.
    match unsafe { libc::syncfs(fd) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The default of [`set_atomic_writes_max`]: small files (checkpoints, snapshots,
/// `partition.meta`) a shard writes at once. Each holds one descriptor while it is
/// written (its temp file, then its directory), and a leadership change of thousands
/// of partitions would otherwise open thousands together.
pub const DEFAULT_ATOMIC_WRITES_MAX: u64 = 64;

thread_local! {
    static ATOMIC_WRITES: RefCell<Rc<glommio::sync::Semaphore>> =
        RefCell::new(Rc::new(glommio::sync::Semaphore::new(DEFAULT_ATOMIC_WRITES_MAX)));
}

/// Sets how many [`write_atomic`]s this thread (shard) runs at once (at least 1).
/// More at once share more of each `syncfs` round and of each turn of the shard's
/// blocking thread (their renames and removals run there, behind the rounds): with
/// 64, one record to each of 5,000 new partitions (three brokers here, RF=3) took
/// 19–36 s, with 256 13–16 s, with 512 13–20 s, nearly all of it in the followers'
/// leader-epoch checkpoints. The caller accounts for the descriptors.
pub fn set_atomic_writes_max(n: u64) {
    ATOMIC_WRITES.with(|w| *w.borrow_mut() = Rc::new(glommio::sync::Semaphore::new(n.max(1))));
}

/// Writes `data` to `path` durably and atomically (temp file `<name>.tmp`, fdatasync,
/// rename, directory fsync). At most [`set_atomic_writes_max`] run at once per shard.
pub async fn write_atomic(path: &Path, data: &[u8]) -> Result<(), Error> {
    let writes = ATOMIC_WRITES.with(|w| w.borrow().clone());
    let _permit = writes
        .acquire_permit(1)
        .await
        .map_err(|e| Error::io(path, std::io::Error::other(e.to_string())))?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let _ = remove(&tmp).await;
    {
        let f = AppendFile::open(&tmp, 0, data.len().max(1), 0).await?;
        f.push(data)?;
        f.seal().await?;
    }
    rename(&tmp, path).await.map_err(|e| Error::io(path, e))?;
    sync_dir(path.parent().unwrap_or(Path::new("."))).await
}

/// fsyncs a directory so that creations, renames and removals in it are durable.
pub async fn sync_dir(dir: &Path) -> Result<(), Error> {
    simdisk::alive().map_err(|e| Error::io(dir, e))?;
    fault::check_io(dir, FaultOp::Sync)?;
    let d = glommio::io::Directory::open(dir)
        .await
        .map_err(|e| Error::io(dir, e))?;
    d.sync().await.map_err(|e| Error::io(dir, e))?;
    let _ = d.close().await;
    Ok(())
}

/// Removes a file (every removal in this crate goes through here, so the crash
/// simulation can stop a crashed process's tasks from changing the disk).
pub async fn remove(path: impl AsRef<Path>) -> std::io::Result<()> {
    simdisk::alive()?;
    glommio::io::remove(&path).await?;
    simdisk::replaced(path.as_ref());
    Ok(())
}

/// Renames a file (see [`remove`]).
pub async fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> std::io::Result<()> {
    simdisk::alive()?;
    glommio::io::rename(&from, &to).await?;
    simdisk::replaced(to.as_ref());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultRule;

    fn run<Fut: std::future::Future<Output = ()> + 'static>(
        f: impl FnOnce() -> Fut + Send + 'static,
    ) {
        sluice_shard::run_unpinned("file-test", 4 << 20, f);
    }

    #[test]
    fn at_most_the_set_number_of_logs_are_write_through_even_when_opened_at_once() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        run(move || async move {
            set_dsync_logs_max(3);
            let open = |i: usize, wanted: bool| {
                let path = dir.join(format!("{i}.log"));
                async move { AppendFile::open_log(&path, 0, 1 << 16, 0, wanted).await }
            };
            // Eight at once: the places are taken before the opens suspend.
            let tasks: Vec<_> = (0..8)
                .map(|i| glommio::spawn_local(open(i, true)))
                .collect();
            let mut files = Vec::new();
            for t in tasks {
                files.push(t.await.unwrap());
            }
            let through = |fs: &[Rc<AppendFile>]| fs.iter().filter(|f| f.dsync).count();
            assert_eq!(through(&files), 3);
            // A log that does not want it never takes a place.
            assert!(!open(8, false).await.unwrap().dsync);
            // Dropping one frees its place for the next log.
            let i = files.iter().position(|f| f.dsync).unwrap();
            files.remove(i);
            let next = open(9, true).await.unwrap();
            assert!(next.dsync);
            assert!(!open(10, true).await.unwrap().dsync);
            // A write-through file's completed write is durable without a sync.
            next.push(&[7u8; 5000]).unwrap();
            next.wait_written(5000).await.unwrap();
            assert_eq!(next.state.borrow().durable, 5000);
            next.sync_all().await.unwrap();
            set_dsync_logs_max(DEFAULT_DSYNC_LOGS_MAX);
        });
    }

    /// A checkpoint's files are made durable by one shared round: each is durable up
    /// to what it had written, bytes accepted later are not counted, and a sync fault
    /// on one file fails that file alone.
    #[test]
    fn files_synced_together_are_durable_up_to_what_they_had_written() {
        let d = tempdir();
        let dir = d.path().to_path_buf();
        run(move || async move {
            let mut files = Vec::new();
            for i in 0..4 {
                let f = AppendFile::open(&dir.join(format!("{i}.log")), 0, 1 << 20, 0)
                    .await
                    .unwrap();
                f.push(&[i as u8; 300]).unwrap();
                f.wait_written(300).await.unwrap();
                assert_eq!(f.state.borrow().durable, 0);
                files.push(f);
            }
            // Accepted after its write: not covered by the round.
            files[1].push(&[9u8; 50]).unwrap();
            let marker = dir.join("3.log").display().to_string();
            fault::arm(FaultRule {
                op: FaultOp::Sync,
                errno: 5,
                path_contains: marker.clone(),
            });
            let rounds = crate::stats::FS_SYNC_ROUNDS.load(Ordering::Relaxed);
            let res = sync_written_together(&files).await;
            fault::disarm(&marker);
            assert!(res[..3].iter().all(Result::is_ok), "{res:?}");
            assert!(res[3].is_err(), "{:?}", res[3]);
            assert!(crate::stats::FS_SYNC_ROUNDS.load(Ordering::Relaxed) > rounds);
            for f in &files[..3] {
                assert_eq!(f.state.borrow().durable, 300);
                assert_eq!(f.failure(), None);
            }
            assert!(files[3]
                .failure()
                .unwrap_or_default()
                .contains("os error 5"));
            // The rest of file 1 is written and synced on its own, as ever.
            files[1].sync_all().await.unwrap();
            assert_eq!(files[1].state.borrow().durable, 350);
        });
    }

    /// Small appends that arrive while a write is in flight all go out in the next
    /// write, not one write each: the next write is not closed early by preparing it
    /// on the first waiter's poll.
    #[test]
    fn small_appends_during_a_write_share_the_next_write() {
        use futures_lite::future::poll_once;
        let d = tempdir();
        let dir = d.path().to_path_buf();
        run(move || async move {
            let f = AppendFile::open(&dir.join("group.log"), 0, 1 << 20, 0)
                .await
                .unwrap();
            let a = f.push(&[1u8; 100]).unwrap();
            let mut wa = Box::pin(f.wait_written(a));
            assert!(
                poll_once(&mut wa).await.is_none(),
                "the first write is in flight"
            );
            assert_eq!(f.writes(), 1);
            let b = f.push(&[2u8; 100]).unwrap();
            let mut wb = Box::pin(f.wait_written(b));
            assert!(poll_once(&mut wb).await.is_none());
            let c = f.push(&[3u8; 100]).unwrap();
            let mut wc = Box::pin(f.wait_written(c));
            assert!(poll_once(&mut wc).await.is_none());
            assert_eq!(f.writes(), 1, "b and c wait for the write in flight");
            wa.await.unwrap();
            wb.await.unwrap();
            wc.await.unwrap();
            assert_eq!(f.writes(), 2, "b and c went out together");
            assert_eq!(f.written_len(), 300);
            // Enough pending bytes are still copied ahead while a write is in flight.
            let big = f.push(&[4u8; PREPARE_AHEAD_MIN]).unwrap();
            let mut wbig = Box::pin(f.wait_written(big));
            assert!(poll_once(&mut wbig).await.is_none());
            let more = f.push(&[5u8; PREPARE_AHEAD_MIN]).unwrap();
            let mut wmore = Box::pin(f.wait_written(more));
            assert!(poll_once(&mut wmore).await.is_none());
            assert!(
                f.state.borrow().prepared.is_some(),
                "the next write is ready"
            );
            wbig.await.unwrap();
            wmore.await.unwrap();
            assert_eq!(f.writes(), 4);
            f.sync_all().await.unwrap();
            let mut data = std::fs::read(dir.join("group.log")).unwrap();
            // Whole pages are written: the file ends padded to one.
            let len = 300 + 2 * PREPARE_AHEAD_MIN;
            assert_eq!(data.len() as u64, align_up(len as u64));
            data.truncate(len);
            assert!(data[..100].iter().all(|&x| x == 1));
            assert!(data[100..200].iter().all(|&x| x == 2));
            assert!(data[200..300].iter().all(|&x| x == 3));
            assert!(data[300..].iter().take(PREPARE_AHEAD_MIN).all(|&x| x == 4));
            assert!(data[300 + PREPARE_AHEAD_MIN..].iter().all(|&x| x == 5));
        });
    }

    fn tempdir() -> tempfile::TempDir {
        let base = std::env::var("SLUICE_TEST_TMP")
            .unwrap_or_else(|_| std::env::temp_dir().display().to_string());
        tempfile::Builder::new()
            .prefix("sluice-file-")
            .tempdir_in(base)
            .expect("tempdir")
    }

    /// A fallocate that fails is not retried for the file, and does not fail it: the
    /// writes extend the file. (A real failure: ext4 refuses to allocate past its
    /// largest file size, 16 TiB, with EFBIG, before allocating anything.)
    #[test]
    fn a_failed_fallocate_is_not_retried_and_writes_go_on() {
        let d = tempdir();
        let dir = d.path().to_path_buf();
        run(move || async move {
            crate::probe::prime_device(&dir).await.unwrap();
            let path = dir.join("huge.log");
            let start = (16u64 << 40) - (1 << 20);
            let f = AppendFile::open(&path, start, 1 << 16, PREALLOCATE_BYTES)
                .await
                .unwrap();
            f.push(&[1u8; 100]).unwrap();
            f.sync_all().await.unwrap();
            let (preallocating, allocated) = {
                let st = f.state.borrow();
                (st.preallocating, st.allocated)
            };
            if preallocating {
                // A file system with larger files (XFS): the fallocate worked.
                assert!(allocated >= start + PREALLOCATE_BYTES);
            } else {
                assert_eq!(allocated, start, "nothing was preallocated");
            }
            f.push(&[2u8; ALIGN as usize]).unwrap();
            f.sync_all().await.unwrap();
            assert_eq!(f.durable_len(), start + 100 + ALIGN);
            assert_eq!(f.state.borrow().allocated, allocated, "no second try");
            assert_eq!(f.failure(), None);
        });
    }

    /// An injected fault on the fallocate (a Write rule covers it) stops
    /// preallocation for the file; the write itself then fails too.
    #[test]
    fn an_injected_fallocate_fault_stops_preallocation() {
        let d = tempdir();
        let dir = d.path().to_path_buf();
        run(move || async move {
            crate::probe::prime_device(&dir).await.unwrap();
            let path = dir.join("p.log");
            let f = AppendFile::open(&path, 0, 1 << 16, PREALLOCATE_BYTES)
                .await
                .unwrap();
            assert!(f.state.borrow().preallocating);
            let marker = dir.display().to_string();
            fault::arm(FaultRule {
                op: FaultOp::Write,
                errno: 28,
                path_contains: marker.clone(),
            });
            f.push(&[1u8; 100]).unwrap();
            let res = f.sync_all().await;
            fault::disarm(&marker);
            assert!(matches!(res, Err(Error::Failed(_))), "{res:?}");
            let st = f.state.borrow();
            assert!(!st.preallocating);
            assert_eq!(st.allocated, 0);
            assert!(st
                .failed
                .get()
                .map_or("", String::as_str)
                .contains("os error 28"));
        });
    }
}
