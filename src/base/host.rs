//! What the broker asks of the machine it runs on, outside the shards: resource limits
//! raised at start, the systemd readiness notification, the data directory's lock, and
//! waiting for a port that a crashed predecessor still holds. Everything here runs on the main thread (or once
//! per process) and never on a shard's produce/fetch path.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Why the broker cannot take its ports or its data directory; the text is what
/// `sluice serve` prints.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot listen on {addr} ({what}): {source} (is another broker running?)")]
    PortHeld {
        addr: SocketAddr,
        what: String,
        source: std::io::Error,
    },
    #[error("opening {}: {source}", path.display())]
    OpenLock {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("locking {}: {source}", path.display())]
    Lock {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{} is locked by another broker process (is one still running on this data directory?)", dir.display())]
    DirLocked { dir: std::path::PathBuf },
}

/// A resource limit after [`raise_soft_limit`]: what the soft limit was, is now, and the
/// hard limit (`None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub before: Option<u64>,
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

fn from_rlim(v: libc::rlim_t) -> Option<u64> {
    (v != libc::RLIM_INFINITY).then_some(v)
}

/// The soft and hard limit of `resource` (`None`: unlimited).
pub fn limit(resource: libc::__rlimit_resource_t) -> std::io::Result<(Option<u64>, Option<u64>)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit the call fills in.
    if unsafe { libc::getrlimit(resource, &mut r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((from_rlim(r.rlim_cur), from_rlim(r.rlim_max)))
}

/// Raises the soft limit of `resource` to its hard limit (an unprivileged process may).
/// For RLIMIT_NOFILE an unlimited hard limit is capped at the kernel's `nr_open`, the
/// most `setrlimit` accepts.
pub fn raise_soft_limit(resource: libc::__rlimit_resource_t) -> std::io::Result<Limit> {
    let (before, hard) = limit(resource)?;
    let mut target = hard;
    if resource == libc::RLIMIT_NOFILE && target.is_none() {
        target = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok());
    }
    if target == before {
        return Ok(Limit {
            before,
            soft: before,
            hard,
        });
    }
    let r = libc::rlimit {
        rlim_cur: target.unwrap_or(libc::RLIM_INFINITY),
        rlim_max: hard.unwrap_or(libc::RLIM_INFINITY),
    };
    // SAFETY: `r` is a valid rlimit; raising the soft limit up to the hard one is
    // always permitted.
    if unsafe { libc::setrlimit(resource, &r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (soft, hard) = limit(resource)?;
    Ok(Limit { before, soft, hard })
}

/// `Some(n)` as `n`, `None` as `unlimited`.
pub fn show_limit(v: Option<u64>) -> String {
    v.map_or_else(|| "unlimited".to_string(), |n| n.to_string())
}

/// Start-up: the open-file limit (one per connection, segment file and index) and the
/// lockable-memory limit (glommio's registered io_uring buffers) go up to their hard
/// limits; what the broker got is logged.
pub fn raise_limits() {
    for (name, resource) in [
        ("open files (RLIMIT_NOFILE)", libc::RLIMIT_NOFILE),
        ("locked memory (RLIMIT_MEMLOCK)", libc::RLIMIT_MEMLOCK),
    ] {
        match raise_soft_limit(resource) {
            Ok(l) if l.before != l.soft => tracing::info!(
                "{name}: soft limit raised from {} to {} (hard limit {})",
                show_limit(l.before),
                show_limit(l.soft),
                show_limit(l.hard)
            ),
            Ok(l) => tracing::info!(
                "{name}: soft limit {} (hard limit {})",
                show_limit(l.soft),
                show_limit(l.hard)
            ),
            Err(e) => tracing::warn!("{name}: cannot raise the soft limit: {e}"),
        }
    }
}

/// Tells the service manager about the broker's state (`READY=1`, `STOPPING=1`,
/// `STATUS=...`), systemd's notification protocol: one datagram of `KEY=VALUE` lines to
/// the unix socket named by `$NOTIFY_SOCKET` (a path, or `@name` in the abstract
/// namespace). Without the variable (not started by systemd with Type=notify) it does
/// nothing. Errors are logged, never fatal: the broker serves either way.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send_notify(&path, state) {
        tracing::warn!(socket = ?path, "cannot notify the service manager: {e}");
    }
}

fn send_notify(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
    let bytes = path.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            UnixAddr::from_abstract_name(name)?
        }
        None => UnixAddr::from_pathname(std::path::Path::new(path))?,
    };
    let sock = UnixDatagram::unbound()?;
    let sent = sock.send_to_addr(state.as_bytes(), &addr)?;
    if sent != state.len() {
        return Err(std::io::Error::other("short datagram"));
    }
    Ok(())
}

/// Longest a start waits for a listen address a crashed predecessor still holds.
pub const PORT_WAIT_MAX: Duration = Duration::from_secs(10);
/// First pause between tries; it doubles up to [`PORT_WAIT_STEP_MAX`].
const PORT_WAIT_STEP: Duration = Duration::from_millis(20);
const PORT_WAIT_STEP_MAX: Duration = Duration::from_millis(500);

/// Waits until `addr` can be bound by this process alone, for up to `max`.
///
/// The broker's listeners set SO_REUSEPORT (every shard binds the same address), so a
/// second broker could bind a port already served and silently take half its
/// connections; a plain bind (no SO_REUSEPORT) fails while anyone listens, and is the
/// check. A broker restarted right after a crash finds its ports held for a moment:
/// the kernel tears down a dead process's io_uring, and the sockets it references,
/// asynchronously after the process is reaped. So "address in use" is retried with
/// backoff (and logged) until `max`; any other error, or the port still held then, is
/// the answer.
pub fn wait_port_free(addr: SocketAddr, what: &str, max: Duration) -> Result<(), HostError> {
    let start = Instant::now();
    let mut step = PORT_WAIT_STEP;
    let mut logged = false;
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(l) => {
                drop(l);
                if logged {
                    tracing::info!(
                        "{what} {addr} is free after {} ms",
                        start.elapsed().as_millis()
                    );
                }
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && start.elapsed() < max => {
                if !logged {
                    tracing::warn!(
                        "{what} {addr} is in use; waiting up to {} s for it (a process that just died may still hold it)",
                        max.as_secs()
                    );
                    logged = true;
                }
                std::thread::sleep(step);
                step = (step * 2).min(PORT_WAIT_STEP_MAX);
            }
            Err(source) => {
                return Err(HostError::PortHeld {
                    addr,
                    what: what.to_string(),
                    source,
                })
            }
        }
    }
}

/// The lock file in the data directory, held (`flock`) while a broker runs.
pub const LOCK_FILE: &str = ".lock";

/// Takes the data directory's exclusive lock, as Kafka does with its log directories'
/// `.lock`: two brokers on one directory (a second one on other ports, or a new one
/// started while the old one still closes its logs) would corrupt each other's files.
/// The lock is an open-file `flock`, so the kernel drops it the moment its holder
/// dies; a holder that is still stopping is waited for up to `max`. Keep the returned
/// file open for the life of the process.
pub fn lock_data_dir(dir: &std::path::Path, max: Duration) -> Result<std::fs::File, HostError> {
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| HostError::OpenLock {
            path: path.clone(),
            source,
        })?;
    let start = Instant::now();
    let mut step = PORT_WAIT_STEP;
    let mut logged = false;
    loop {
        // SAFETY: a descriptor of the file we just opened.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(HostError::Lock { path, source: e });
        }
        if start.elapsed() >= max {
            return Err(HostError::DirLocked {
                dir: dir.to_path_buf(),
            });
        }
        if !logged {
            tracing::warn!(
                "{} is locked by another process; waiting up to {} s for it to exit",
                dir.display(),
                max.as_secs()
            );
            logged = true;
        }
        std::thread::sleep(step);
        step = (step * 2).min(PORT_WAIT_STEP_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_open_file_limit_goes_up_to_the_hard_limit() {
        let l = raise_soft_limit(libc::RLIMIT_NOFILE).unwrap();
        let (soft, hard) = limit(libc::RLIMIT_NOFILE).unwrap();
        assert_eq!(soft, l.soft);
        assert_eq!(hard, l.hard);
        if let Some(h) = hard {
            assert_eq!(soft, Some(h));
        }
    }

    #[test]
    fn notify_sends_one_datagram_to_the_socket_named_by_the_variable() {
        let dir = std::env::temp_dir().join(format!("sluice-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        send_notify(path.as_os_str(), "READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 64];
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
        // The abstract namespace (`@name`) works the same.
        use std::os::linux::net::SocketAddrExt;
        let name = format!("sluice-notify-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abs = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
        send_notify(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = abs.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_data_directory_takes_one_broker_at_a_time() {
        let dir = std::env::temp_dir().join(format!("sluice-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let held = lock_data_dir(&dir, Duration::ZERO).unwrap();
        // flock locks belong to the open file: a second open in this process conflicts
        // as another process's would.
        let e = lock_data_dir(&dir, Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        assert!(e.contains("locked by another broker"), "{e}");
        drop(held);
        lock_data_dir(&dir, Duration::ZERO).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_held_port_is_waited_for_then_refused_with_the_address_named() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let e = wait_port_free(addr, "Kafka listener", Duration::from_millis(100))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&addr.to_string()) && e.contains("in use"), "{e}");
        drop(held);
        wait_port_free(addr, "Kafka listener", Duration::from_millis(100)).unwrap();
    }
}
