//! A simulated disk for crash tests: unsynced writes stay volatile and a simulated
//! crash drops or tears them.
//!
//! A real crash keeps only what `fdatasync` made durable; anything written after the
//! last sync may be on the platter, partly there (torn at sector granularity) or gone.
//! `SIGKILL` of a process cannot show this (the page cache and the device cache
//! survive it) and this machine has no dm-log-writes, so tests enable this layer on
//! their executor thread instead:
//!
//! - [`enable`] starts recording. From then on every [`crate::file::AppendFile`]
//!   opened on this thread keeps a shadow of its *durable* image (read at open) and a
//!   list of its completed-but-unsynced writes. A sync that succeeds moves the writes
//!   it covers (those completed before it started) into the shadow; a truncation or a
//!   seal (which sync) moves all of them.
//! - [`crash`] waits until no write or sync is in flight, then, at one instant, marks
//!   every recorded file dead (a write or sync attempted on it afterwards fails, as the
//!   process would be gone; so does a segment read, see `segment::read_batches`) and
//!   rewrites each file that holds unsynced writes to its durable image plus, under
//!   [`CrashMode::Torn`], a random prefix of its unsynced writes with the next one torn
//!   at 512-byte sectors.
//! - [`syncs`] counts successful file syncs since [`enable`] (group commit is judged
//!   by it).
//! - [`kill`] is the process's death without a power loss (SIGKILL, a panic): the files
//!   die as in a crash but keep every completed write, synced or not, because the
//!   device's volatile cache outlives the process. What is still unsynced goes to the
//!   next process's [`enable_after`], where it stays volatile until a sync covers it
//!   (a sync of that file, or a `syncfs`) or a [`crash`] drops it.
//! - A `syncfs` (`small_files::FileSystem::sync`) makes every recorded file's completed
//!   writes durable, as a real one does for its file system; so does recovery's cut
//!   of a file's invalid tail ([`cut`], which syncs it) for that file.
//!
//! What it does not model: directory entries (creations, renames and removals are
//! durable at once here; the storage code syncs directories explicitly anyway), files
//! written with `std::fs` (the metadata journal), and reordering of writes within one
//! sync interval beyond "a prefix, then one torn write". Disabled (the default,
//! production) it costs one thread-local read per file open.
//!
//! It is a thread-local on purpose: a test harness switch, not a subsystem. Nothing in
//! production enables it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Sector size of the simulated device: a torn write keeps whole sectors.
pub const SECTOR: usize = 512;

/// How a crash treats unsynced writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unsynced write is lost.
    LoseUnsynced,
    /// A prefix of the unsynced writes survives, the next one torn at sector
    /// granularity; chosen by the seed (replayable).
    Torn { seed: u64 },
}

/// One file's durable image and its writes since the last sync.
pub(crate) struct SimFile {
    path: PathBuf,
    durable: Vec<u8>,
    unsynced: Vec<(u64, Vec<u8>)>,
    /// Writes made durable so far: with `unsynced.len()`, numbers the writes, so a
    /// `syncfs` covers exactly those recorded before it started ([`fs_sync_marks`]).
    drained: u64,
    in_flight: u32,
    dead: bool,
    /// Left by a killed process ([`enable_after`]): the next handle of its path starts
    /// from this durable image and these unsynced writes, not from what it reads.
    left_by_kill: bool,
}

pub(crate) type Handle = Rc<RefCell<SimFile>>;

struct SimDisk {
    files: HashMap<PathBuf, Handle>,
    syncs: u64,
    writes: u64,
    /// Set by [`crash`]: the simulated process is gone, so no file is opened, removed
    /// or renamed any more (a task still running must not change the disk after it).
    crashed: bool,
}

thread_local! {
    static DISK: RefCell<Option<SimDisk>> = const { RefCell::new(None) };
}

/// Starts simulating on this thread (clears what an earlier [`enable`] recorded).
pub fn enable() {
    DISK.with(|d| {
        *d.borrow_mut() = Some(SimDisk {
            files: HashMap::new(),
            syncs: 0,
            writes: 0,
            crashed: false,
        })
    });
}

/// Stops simulating on this thread.
pub fn disable() {
    DISK.with(|d| *d.borrow_mut() = None);
}

/// Successful file syncs since [`enable`] (0 when disabled).
pub fn syncs() -> u64 {
    DISK.with(|d| d.borrow().as_ref().map_or(0, |d| d.syncs))
}

/// Completed writes since [`enable`], write-through ones included (0 when disabled).
pub fn writes() -> u64 {
    DISK.with(|d| d.borrow().as_ref().map_or(0, |d| d.writes))
}

fn count_write() {
    DISK.with(|d| {
        if let Some(d) = d.borrow_mut().as_mut() {
            d.writes += 1;
        }
    });
}

/// Fails once the simulated process has crashed; Ok when the simulation is off.
pub(crate) fn alive() -> std::io::Result<()> {
    let crashed = DISK.with(|d| d.borrow().as_ref().is_some_and(|d| d.crashed));
    if crashed {
        return Err(std::io::Error::other(
            "simulated crash: the process is gone",
        ));
    }
    Ok(())
}

/// Registers a file just opened (and made durable up to its current length) by an
/// `AppendFile`; returns its handle, or `None` when the simulation is off. An earlier
/// handle of the same path (a previous incarnation) is marked dead.
pub(crate) fn register(path: &Path) -> Option<Handle> {
    DISK.with(|d| {
        let mut d = d.borrow_mut();
        let disk = d.as_mut()?;
        let left = disk
            .files
            .get(path)
            .filter(|old| old.borrow().left_by_kill)
            .map(|old| {
                let old = old.borrow();
                (old.durable.clone(), old.unsynced.clone())
            });
        let (durable, unsynced) = left.unwrap_or_else(|| {
            // A test-only path: reading the whole (small) file synchronously is fine.
            (std::fs::read(path).unwrap_or_default(), Vec::new())
        });
        let h = Rc::new(RefCell::new(SimFile {
            path: path.to_path_buf(),
            durable,
            unsynced,
            drained: 0,
            in_flight: 0,
            dead: false,
            left_by_kill: false,
        }));
        if let Some(old) = disk.files.insert(path.to_path_buf(), h.clone()) {
            old.borrow_mut().dead = true;
        }
        Some(h)
    })
}

/// Called before an I/O on the file: fails if the simulated process crashed.
pub(crate) fn begin(h: &Handle) -> std::io::Result<()> {
    let mut f = h.borrow_mut();
    if f.dead {
        return Err(std::io::Error::other("simulated crash: the file is gone"));
    }
    f.in_flight += 1;
    Ok(())
}

/// A write of `data` at `pos` completed (unsynced until a later sync).
pub(crate) fn wrote(h: &Handle, pos: u64, data: &[u8]) {
    count_write();
    let mut f = h.borrow_mut();
    f.in_flight -= 1;
    f.unsynced.push((pos, data.to_vec()));
}

/// A write-through (`O_DSYNC`) write of `data` at `pos` completed: durable, like every
/// write of the file before it.
pub(crate) fn wrote_through(h: &Handle, pos: u64, data: &[u8]) {
    count_write();
    let mut f = h.borrow_mut();
    f.in_flight -= 1;
    f.unsynced.push((pos, data.to_vec()));
    let all = f.unsynced.len();
    make_durable(&mut f, all);
}

/// An I/O that did not complete.
pub(crate) fn failed(h: &Handle) {
    h.borrow_mut().in_flight -= 1;
}

/// How many unsynced writes a sync starting now covers.
pub(crate) fn sync_mark(h: &Handle) -> usize {
    h.borrow().unsynced.len()
}

/// A sync that started at `mark` succeeded: those writes are durable.
pub(crate) fn synced(h: &Handle, mark: usize) {
    let mut f = h.borrow_mut();
    f.in_flight -= 1;
    make_durable(&mut f, mark);
    DISK.with(|d| {
        if let Some(d) = d.borrow_mut().as_mut() {
            d.syncs += 1;
        }
    });
}

/// The file was cut to `len` and synced: every write so far is durable, then cut.
pub(crate) fn truncated(h: &Handle, len: u64) {
    let mark = sync_mark(h);
    synced(h, mark);
    h.borrow_mut().durable.truncate(len as usize);
}

/// A `syncfs` starting now: the number of the last write of each recorded file it
/// covers (empty when the simulation is off).
pub(crate) fn fs_sync_marks() -> Vec<(Handle, u64)> {
    DISK.with(|d| {
        d.borrow().as_ref().map_or_else(Vec::new, |disk| {
            disk.files
                .values()
                .map(|h| {
                    let f = h.borrow();
                    (h.clone(), f.drained + f.unsynced.len() as u64)
                })
                .collect()
        })
    })
}

/// The `syncfs` that started at `marks` succeeded: those writes are durable (a file's
/// own sync may have made some of them durable meanwhile; later writes stay volatile).
/// Files a killed process left, with nothing volatile left, are forgotten: the path
/// may be removed or replaced, and its next handle must read what is there.
pub(crate) fn fs_synced(marks: Vec<(Handle, u64)>) {
    for (h, mark) in &marks {
        let mut f = h.borrow_mut();
        let n = mark.saturating_sub(f.drained).min(f.unsynced.len() as u64);
        make_durable(&mut f, n as usize);
    }
    DISK.with(|d| {
        if let Some(disk) = d.borrow_mut().as_mut() {
            disk.files
                .retain(|_, h| !(h.borrow().left_by_kill && h.borrow().unsynced.is_empty()));
        }
    });
}

/// `path` was cut to `len` and synced outside any open `AppendFile` (recovery cutting
/// an invalid tail): every completed write of it is durable, then cut.
pub(crate) fn cut(path: &Path, len: u64) {
    DISK.with(|d| {
        let d = d.borrow();
        let Some(h) = d.as_ref().and_then(|disk| disk.files.get(path)) else {
            return;
        };
        let mut f = h.borrow_mut();
        let all = f.unsynced.len();
        make_durable(&mut f, all);
        f.durable.truncate(len as usize);
    });
}

/// `path` was removed or renamed over: a file a killed process left there is gone.
pub(crate) fn replaced(path: &Path) {
    DISK.with(|d| {
        if let Some(disk) = d.borrow_mut().as_mut() {
            if disk
                .files
                .get(path)
                .is_some_and(|h| h.borrow().left_by_kill)
            {
                disk.files.remove(path);
            }
        }
    });
}

/// The first `mark` unsynced writes of `f`, in order, become its durable image.
fn make_durable(f: &mut SimFile, mark: usize) {
    f.drained += mark as u64;
    let covered: Vec<_> = f.unsynced.drain(..mark).collect();
    for (pos, data) in covered {
        apply(&mut f.durable, pos, &data);
    }
}

fn apply(image: &mut Vec<u8>, pos: u64, data: &[u8]) {
    let pos = pos as usize;
    if image.len() < pos + data.len() {
        image.resize(pos + data.len(), 0);
    }
    image[pos..pos + data.len()].copy_from_slice(data);
}

/// A small deterministic generator (splitmix64), so a seed replays a crash.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// What a killed process left on the device: each recorded file's durable image and
/// its completed writes that no sync covered yet (see [`kill`]).
pub struct Volatile(Vec<LeftFile>);

/// One file a killed process left: its path, durable image and unsynced writes.
type LeftFile = (PathBuf, Vec<u8>, Vec<(u64, Vec<u8>)>);

impl Volatile {
    /// Files holding writes no sync covered.
    pub fn unsynced_files(&self) -> usize {
        self.0.iter().filter(|(_, _, w)| !w.is_empty()).count()
    }
}

/// Simulates the death of the process alone (SIGKILL, a panic), not of the machine:
/// waits (bounded) for in-flight I/O, then kills every recorded file as [`crash`] does
/// but rewrites none, so the files keep every completed write. Returns the writes no
/// sync covered, which the device still holds only in its volatile cache: pass them
/// to the next process's [`enable_after`].
pub async fn kill() -> Volatile {
    quiesce().await;
    let files: Vec<Handle> = DISK.with(|d| {
        let mut d = d.borrow_mut();
        let disk = d.as_mut().expect("simdisk::kill without simdisk::enable");
        disk.crashed = true;
        disk.files.drain().map(|(_, h)| h).collect()
    });
    let mut left = Vec::new();
    for h in files {
        let mut f = h.borrow_mut();
        f.dead = true;
        if !f.unsynced.is_empty() {
            left.push((
                f.path.clone(),
                f.durable.clone(),
                std::mem::take(&mut f.unsynced),
            ));
        }
    }
    Volatile(left)
}

/// Starts simulating on this thread as the next process on the device a [`kill`] left:
/// its unsynced writes stay volatile here until a sync covers them or a [`crash`]
/// drops them.
pub fn enable_after(left: Volatile) {
    enable();
    DISK.with(|d| {
        let mut d = d.borrow_mut();
        let disk = d.as_mut().expect("enabled");
        for (path, durable, unsynced) in left.0 {
            let h = Rc::new(RefCell::new(SimFile {
                path: path.clone(),
                durable,
                unsynced,
                drained: 0,
                in_flight: 0,
                dead: true,
                left_by_kill: true,
            }));
            disk.files.insert(path, h);
        }
    });
}

/// Waits (bounded) until no recorded file has I/O in flight.
///
/// Panics if I/O is still in flight after 10 s (a wedged test, not a crash case).
async fn quiesce() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let busy = DISK.with(|d| {
            d.borrow()
                .as_ref()
                .expect("simdisk: a crash or kill without simdisk::enable")
                .files
                .values()
                .any(|f| f.borrow().in_flight > 0)
        });
        if !busy {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "simdisk: I/O still in flight after 10 s"
        );
        glommio::yield_if_needed().await;
        glommio::timer::sleep(std::time::Duration::from_micros(100)).await;
    }
}

/// Simulates a power loss on this thread: waits (bounded) for in-flight writes and
/// syncs to finish, then kills every recorded file and rewrites those with unsynced
/// writes per `mode`. Returns how many files lost or tore unsynced bytes. The caller
/// drops its logs and reopens them to run recovery.
///
/// Panics if I/O is still in flight after 10 s (a wedged test, not a crash case).
pub async fn crash(mode: CrashMode) -> usize {
    quiesce().await;
    // From here to the end nothing awaits: the crash is one instant.
    let files: Vec<Handle> = DISK.with(|d| {
        let mut d = d.borrow_mut();
        let disk = d.as_mut().expect("enabled");
        disk.crashed = true;
        disk.files.drain().map(|(_, h)| h).collect()
    });
    let mut rng = Rng(match mode {
        CrashMode::LoseUnsynced => 0,
        CrashMode::Torn { seed } => seed,
    });
    let mut damaged = 0;
    // A fixed order, so a seed replays the same crash.
    let mut files = files;
    files.sort_by(|a, b| a.borrow().path.cmp(&b.borrow().path));
    for h in files {
        let mut f = h.borrow_mut();
        f.dead = true;
        if f.unsynced.is_empty() || !f.path.exists() {
            continue;
        }
        damaged += 1;
        let mut image = f.durable.clone();
        if let CrashMode::Torn { .. } = mode {
            let keep = rng.below(f.unsynced.len() as u64 + 1) as usize;
            for (pos, data) in &f.unsynced[..keep] {
                apply(&mut image, *pos, data);
            }
            if let Some((pos, data)) = f.unsynced.get(keep) {
                tear(&mut image, *pos, data, &mut rng);
            }
        }
        std::fs::write(&f.path, &image).expect("simdisk: rewrite after crash");
    }
    damaged
}

/// Applies a random subset of `data`'s sectors at `pos`: a write the device had
/// partly done.
fn tear(image: &mut Vec<u8>, pos: u64, data: &[u8], rng: &mut Rng) {
    for (i, sector) in data.chunks(SECTOR).enumerate() {
        if rng.below(2) == 1 {
            apply(image, pos + (i * SECTOR) as u64, sector);
        }
    }
}
