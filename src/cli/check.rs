//! `sluice check`: the preflight an operator runs before a broker's first start on a
//! machine. It takes the same flags and config file as `sluice serve` and checks what
//! the broker needs of the machine: io_uring, O_DIRECT on the data directory's file
//! system, the locked-memory and open-file limits, free disk against the configured
//! minimum, clock synchronisation, and free listen ports. Each finding is OK, WARN or
//! FAIL with a concrete fix; any FAIL (a blocker: the broker would not start, or not
//! safely) makes the exit code non-zero. It changes nothing but a probe file it writes
//! and removes in the data directory.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sluice::base::config::{BrokerConfig, MetricsListen};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

/// One check's result: its name, the level, what was found, and how to fix it.
#[derive(Debug, Clone)]
pub struct Finding {
    pub check: &'static str,
    pub level: Level,
    pub detail: String,
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
        Finding {
            check,
            level: Level::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            check,
            level: Level::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn fail(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            check,
            level: Level::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// glommio refuses to start an executor below this locked-memory limit.
const MEMLOCK_MIN_BYTES: u64 = 512 * 1024;
/// glommio registers each executor's io_uring buffer in its three rings; the kernel
/// charges every registration to the locked-memory limit (root is exempt). Below this
/// per shard the buffers are not registered and every I/O copies.
const MEMLOCK_RINGS: u64 = 3;
/// Kafka's guidance for brokers: 100000 or more open files; below this a busy broker
/// runs out (a descriptor per connection, segment, index and time index).
const NOFILE_RECOMMENDED: u64 = 100_000;
/// Below this even a small broker fails under load.
const NOFILE_MIN: u64 = 4_096;

/// Runs every check for `config`.
pub fn run(config: &BrokerConfig) -> Vec<Finding> {
    let mut out = vec![check_io_uring()];
    out.extend(check_data_dir(&config.data_dir, config));
    out.push(check_memlock(config.cores));
    out.push(check_nofile());
    out.push(check_clock());
    for l in &config.listeners {
        let flag = match config.given.contains(&"listeners") {
            true => "--listeners",
            false => "--listen",
        };
        out.push(check_port("kafka port", l.bind, flag));
    }
    if let Some(c) = config.controller_listen {
        out.push(check_port("controller port", c, "--controller-listen"));
    }
    match config.metrics_listen {
        MetricsListen::Off => {}
        MetricsListen::Explicit(a) => out.push(check_port("metrics port", a, "--metrics-listen")),
        // The default address: in use, the broker runs without metrics (a warning).
        MetricsListen::Default(a) => {
            let mut f = check_port("metrics port", a, "--metrics-listen");
            if f.level == Level::Fail {
                f.level = Level::Warn;
                f.detail.push_str(" (the broker would run without metrics)");
            }
            out.push(f);
        }
    }
    out
}

/// Prints the findings, one line each and its fix under it; returns true when none is
/// a blocker.
pub fn report(findings: &[Finding], out: &mut impl Write) -> std::io::Result<bool> {
    for f in findings {
        let level = match f.level {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        writeln!(out, "{level:<5} {:<16} {}", f.check, f.detail)?;
        if let Some(fix) = &f.fix {
            writeln!(out, "{:<22}fix: {fix}", "")?;
        }
    }
    let fails = findings.iter().filter(|f| f.level == Level::Fail).count();
    let warns = findings.iter().filter(|f| f.level == Level::Warn).count();
    if fails == 0 {
        writeln!(
            out,
            "ready to start ({warns} warning(s)); `sluice serve` with the same flags"
        )?;
    } else {
        writeln!(
            out,
            "{fails} blocker(s), {warns} warning(s): fix the FAIL lines before starting"
        )?;
    }
    Ok(fails == 0)
}

/// io_uring: set up (and close) a small ring, as glommio does for every shard.
/// Kernels older than 5.8, `kernel.io_uring_disabled`, or a seccomp profile (some
/// container runtimes) refuse it.
pub fn check_io_uring() -> Finding {
    const NAME: &str = "io_uring";
    // struct io_uring_params: 120 bytes, all zero asks for the defaults.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup reads and fills in `params`, 120 bytes as the ABI defines.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    let kernel = kernel_release();
    if fd >= 0 {
        // SAFETY: a descriptor the call just returned to us.
        unsafe { libc::close(fd as i32) };
        return Finding::ok(NAME, format!("a ring can be set up (kernel {kernel})"));
    }
    let e = std::io::Error::last_os_error();
    let fix = match e.raw_os_error() {
        Some(libc::ENOSYS) => "a kernel with io_uring: Linux 5.8 or newer (5.15+ recommended)",
        Some(libc::EPERM) => {
            "io_uring is disabled: set `sysctl kernel.io_uring_disabled=0` (or 1 and run in \
             its group), or allow io_uring_setup/io_uring_enter/io_uring_register in the \
             container's seccomp profile"
        }
        Some(libc::ENOMEM) => "raise the locked-memory limit (LimitMEMLOCK=infinity)",
        _ => "a kernel with io_uring enabled (Linux 5.8+)",
    };
    Finding::fail(
        NAME,
        format!("io_uring_setup failed: {e} (kernel {kernel})"),
        fix,
    )
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The data directory: it exists or can be created, it supports O_DIRECT, and its file
/// system has room above the configured minimum.
fn check_data_dir(dir: &Path, config: &BrokerConfig) -> Vec<Finding> {
    // An absent directory is created at start; probe the nearest existing parent
    // (same file system, unless a mount is to be made there first).
    let (probe_dir, note) = match existing_ancestor(dir) {
        Some(d) if d == dir => (d, String::new()),
        Some(d) => {
            let note = format!(
                " ({} does not exist yet; probed {})",
                dir.display(),
                d.display()
            );
            (d, note)
        }
        None => {
            return vec![Finding::fail(
                "data dir",
                format!("{}: no existing parent", dir.display()),
                "pass an absolute --data-dir on a mounted file system",
            )]
        }
    };
    vec![
        check_fs(&probe_dir),
        check_o_direct(&probe_dir, &note),
        check_free_disk(&probe_dir, config),
    ]
}

/// The data directory's file system: memory-backed ones lose every record at reboot
/// (tmpfs accepts O_DIRECT since Linux 6.6, so the O_DIRECT probe alone passes there);
/// network file systems make fsync and direct I/O latency unpredictable.
pub fn check_fs(dir: &Path) -> Finding {
    const NAME: &str = "file system";
    let fstype = fs_type(dir);
    let shown = format!("{} is on {fstype}", dir.display());
    match fstype.as_str() {
        "tmpfs" | "ramfs" => Finding::fail(
            NAME,
            format!("{shown}: memory-backed, every record is lost at reboot"),
            "put --data-dir on a local disk with ext4 or XFS",
        ),
        "nfs" | "cifs" | "fuse" => Finding::warn(
            NAME,
            format!("{shown}: a network or user-space file system"),
            "use a local disk with ext4 or XFS; acknowledged writes depend on its fsync",
        ),
        "ext4" | "xfs" => Finding::ok(NAME, shown),
        _ => Finding::warn(
            NAME,
            format!("{shown}: not one Sluice is tested on"),
            "ext4 or XFS are tested; others work if they support O_DIRECT and fdatasync",
        ),
    }
}

fn existing_ancestor(dir: &Path) -> Option<PathBuf> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(dir)
    };
    abs.ancestors().find(|a| a.is_dir()).map(Path::to_path_buf)
}

/// O_DIRECT: storage writes every segment with aligned direct I/O (glommio's DMA files).
/// tmpfs and some FUSE or network file systems refuse the open; others accept it but
/// fail the aligned write. Writes one 4 KiB block to a probe file and removes it.
pub fn check_o_direct(dir: &Path, note: &str) -> Finding {
    const NAME: &str = "O_DIRECT";
    let fstype = fs_type(dir);
    let path = dir.join(format!(".sluice-check-{}", std::process::id()));
    let result = write_direct(&path);
    let _ = std::fs::remove_file(&path);
    match result {
        Ok(()) => Finding::ok(
            NAME,
            format!(
                "{} ({fstype}) takes aligned direct writes{note}",
                dir.display()
            ),
        ),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EROFS) => {
            Finding::fail(
                NAME,
                format!("{}: cannot write: {e}", dir.display()),
                format!(
                    "make {} writable by the broker's user (e.g. `chown sluice: {}`), on a read-write mount",
                    dir.display(),
                    dir.display()
                ),
            )
        }
        Err(e) => Finding::fail(
            NAME,
            format!(
                "{} ({fstype}) does not support O_DIRECT: {e}{note}",
                dir.display()
            ),
            "put --data-dir on a local disk with ext4 or XFS (tmpfs, overlayfs on tmpfs and \
             most FUSE file systems refuse direct I/O)",
        ),
    }
}

fn write_direct(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    const BLOCK: usize = 4096;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let layout = std::alloc::Layout::from_size_align(BLOCK, BLOCK).expect("a valid layout");
    // SAFETY: a non-zero-sized layout; the block is freed below.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(std::io::Error::other("out of memory"));
    }
    // SAFETY: `ptr` points to BLOCK initialised (zeroed) bytes we own.
    let block = unsafe { std::slice::from_raw_parts(ptr, BLOCK) };
    let r = f.write_all(block).and_then(|()| f.sync_data());
    // SAFETY: allocated above with the same layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    r
}

/// The file system type of `dir`, by name (`statfs`'s magic number).
fn fs_type(dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return "?".into();
    };
    // SAFETY: statfs is a C struct of integers, for which all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` a properly sized out-parameter.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "?".into();
    }
    // f_type is an i64 on x86_64 and narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    match magic {
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x8584_58F6 => "ramfs".into(),
        0xFF53_4D42 => "cifs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x6969 => "nfs".into(),
        0x6573_5546 => "fuse".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0xF2F5_2010 => "f2fs".into(),
        other => format!("fs type {other:#x}"),
    }
}

/// Free space against `--disk-min-free-bytes/-percent`: below it the broker refuses
/// appends from the start.
fn check_free_disk(dir: &Path, config: &BrokerConfig) -> Finding {
    const NAME: &str = "free disk";
    let space = match sluice_storage::file::space_of(dir) {
        Ok(s) => s,
        Err(e) => {
            return Finding::fail(
                NAME,
                format!("statvfs {}: {e}", dir.display()),
                "check that --data-dir is on a mounted, readable file system",
            )
        }
    };
    let min = config.disk_min_free.threshold(space.total);
    let detail = format!(
        "{} free of {} on {} (appends stop below {})",
        human(space.free),
        human(space.total),
        dir.display(),
        human(min)
    );
    let fix = "free space on the data directory's file system, give it a larger disk, or \
               lower --disk-min-free-bytes/--disk-min-free-percent";
    if space.free <= min {
        Finding::fail(NAME, detail, fix)
    } else if space.free < min.saturating_mul(2) {
        Finding::warn(NAME, format!("{detail}; less than twice the minimum"), fix)
    } else {
        Finding::ok(NAME, detail)
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The locked-memory limit: glommio needs 512 KiB to start an executor at all, and
/// `cores` × 3 rings × its io buffer to register them (else every I/O copies).
pub fn check_memlock(cores: usize) -> Finding {
    const NAME: &str = "memlock";
    let fix = "LimitMEMLOCK=infinity in the systemd unit, or `memlock unlimited` for the \
               broker's user in /etc/security/limits.conf (docker: --ulimit memlock=-1)";
    let (soft, hard) = match sluice::base::host::limit(libc::RLIMIT_MEMLOCK) {
        Ok(l) => l,
        Err(e) => return Finding::warn(NAME, format!("getrlimit: {e}"), fix),
    };
    // The broker raises the soft limit to the hard one at start: the hard one counts.
    let io_memory = sluice_shard::runtime::RuntimeConfig::new(cores).io_memory_bytes as u64;
    let want = cores as u64 * MEMLOCK_RINGS * io_memory;
    let shown = format!(
        "soft {}, hard {} (the broker raises soft to hard)",
        show_bytes(soft),
        show_bytes(hard)
    );
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match hard {
        Some(h) if h < MEMLOCK_MIN_BYTES => Finding::fail(
            NAME,
            format!("{shown}: glommio needs at least 512 KiB"),
            fix,
        ),
        Some(h) if h < want && !root => Finding::warn(
            NAME,
            format!(
                "{shown}: {cores} shard(s) register {} of io_uring buffers; without it every I/O copies",
                human(want)
            ),
            fix,
        ),
        Some(h) if h < want => Finding::ok(
            NAME,
            format!("{shown}; running as root, io_uring buffers are not charged to it"),
        ),
        _ => Finding::ok(NAME, shown),
    }
}

fn show_bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "unlimited".into(), human)
}

/// The open-file limit: one descriptor per connection, segment file and index.
pub fn check_nofile() -> Finding {
    const NAME: &str = "open files";
    let fix = format!(
        "LimitNOFILE=1048576 in the systemd unit, or `nofile {NOFILE_RECOMMENDED}` or more for \
         the broker's user in /etc/security/limits.conf"
    );
    let (soft, hard) = match sluice::base::host::limit(libc::RLIMIT_NOFILE) {
        Ok(l) => l,
        Err(e) => return Finding::warn(NAME, format!("getrlimit: {e}"), fix),
    };
    let shown = format!(
        "soft {}, hard {} (the broker raises soft to hard)",
        sluice::base::host::show_limit(soft),
        sluice::base::host::show_limit(hard)
    );
    match hard {
        Some(h) if h < NOFILE_MIN => Finding::fail(NAME, shown, fix),
        Some(h) if h < NOFILE_RECOMMENDED => Finding::warn(
            NAME,
            format!("{shown}: below the {NOFILE_RECOMMENDED} a busy broker needs"),
            fix,
        ),
        _ => Finding::ok(NAME, shown),
    }
}

/// Clock synchronisation (a warning only): commit and record timestamps, retention by
/// time and lag in seconds come from the wall clock. `adjtimex` reports whether the
/// kernel's clock is disciplined by NTP/PTP.
pub fn check_clock() -> Finding {
    const NAME: &str = "clock sync";
    // SAFETY: timex is a C struct of integers, for which all zeroes is a valid value.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: modes 0 only reads; `tx` is a properly sized out-parameter.
    let state = unsafe { libc::adjtimex(&mut tx) };
    let fix = "run an NTP client (`timedatectl set-ntp true`, chrony or systemd-timesyncd)";
    if state < 0 {
        let e = std::io::Error::last_os_error();
        return Finding::warn(NAME, format!("adjtimex: {e}"), fix);
    }
    if state == libc::TIME_ERROR || tx.status & libc::STA_UNSYNC != 0 {
        Finding::warn(
            NAME,
            format!(
                "the kernel clock is not synchronised (adjtimex state {state}, estimated error {} µs)",
                tx.esterror
            ),
            fix,
        )
    } else {
        Finding::ok(
            NAME,
            format!("synchronised (estimated error {} µs)", tx.esterror),
        )
    }
}

/// A listen port: free (or released within the start-up wait would not help a
/// preflight: a port held now by a live process is a blocker).
pub fn check_port(name: &'static str, addr: SocketAddr, flag: &str) -> Finding {
    match std::net::TcpListener::bind(addr) {
        Ok(l) => {
            drop(l);
            Finding::ok(name, format!("{addr} is free"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Finding::fail(
            name,
            format!("{addr} is in use"),
            format!(
                "stop what listens there (`ss -ltnp 'sport = :{}'`) or choose another {flag}",
                addr.port()
            ),
        ),
        Err(e) => Finding::fail(
            name,
            format!("{addr}: {e}"),
            format!("{flag} must be an address of this machine"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_port_fails_and_a_free_one_passes() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let f = check_port("kafka port", addr, "--listen");
        assert_eq!(f.level, Level::Fail);
        assert!(f.fix.unwrap().contains("--listen"));
        drop(held);
        assert_eq!(check_port("kafka port", addr, "--listen").level, Level::Ok);
    }

    #[test]
    fn a_tmpfs_directory_is_a_blocker() {
        let shm = Path::new("/dev/shm");
        if fs_type(shm) != "tmpfs" {
            return; // No tmpfs here: the e2e test says so; nothing to assert.
        }
        let f = check_fs(shm);
        assert_eq!(f.level, Level::Fail, "{f:?}");
        assert!(f.detail.contains("tmpfs"), "{f:?}");
    }

    #[test]
    fn report_says_blocked_when_any_check_fails() {
        let mut out = Vec::new();
        let fine = [Finding::ok("a", "fine"), Finding::warn("b", "meh", "do x")];
        assert!(report(&fine, &mut out).unwrap());
        let bad = [Finding::ok("a", "fine"), Finding::fail("c", "bad", "do y")];
        let mut out = Vec::new();
        assert!(!report(&bad, &mut out).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("FAIL  c") && text.contains("fix: do y"),
            "{text}"
        );
    }
}
