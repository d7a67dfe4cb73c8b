"""A volatile disk for power-loss tests: a block device whose writes stay in a
volatile cache until the kernel flushes it, and whose cache a "power cut" throws away.

How it is built (this VM has /dev/fuse and loop devices but no device-mapper, so no
dm-flakey or dm-log-writes, and no nbd):

    durable.img (a plain file)  <-  FUSE daemon (this file, run as a program) exposes
    <fuse mount>/disk.img  <-  loop device  <-  ext4  <-  the broker's --data-dir

* Writes to disk.img land in an in-memory overlay (4 KiB block -> bytes); reads see the
  overlay over durable.img.
* FSYNC of disk.img (FUSE_FSYNC) applies the overlay to durable.img. That is where a
  device cache flush arrives: the loop driver turns a REQ_OP_FLUSH (a REQ_PREFLUSH, and
  FUA, which the loop device does not offer so the block layer emulates it with flushes)
  into vfs_fsync() of its backing file, which FUSE sends to the daemon as FUSE_FSYNC.
  The file system's fdatasync/fsync, O_DSYNC writes, journal commits and barriers all
  end up there. The counts the control file reports prove it happens.
* FLUSH (FUSE_FLUSH) is *not* a sync point: the kernel sends it on every close() of a
  descriptor of disk.img, and close() promises no durability (close(2): "a successful
  close does not guarantee that the data has been successfully saved to disk"); a real
  disk does not persist its cache because a program closed a file. It is only counted.
* "cut" written to the control file is the power cut: the overlay is dropped and every
  later write is ignored (reported as done, as a dead disk's writes never land), so
  whatever the kernel writes while unmounting afterwards is lost as well.
* What counts as durable is durable.img's content: the host does not lose power in
  this test, so the daemon does not fsync durable.img (that would only slow each
  flush down and change nothing the test can observe).

After the cut the test unmounts everything and mounts durable.img itself on a new loop
device: ext4 replays its journal as after a real power loss, and a broker started on it
finds exactly what the flushes made durable.

The harness side is `VolatileDisk`; the daemon is `python3 volatile_disk.py DURABLE
MOUNTPOINT` (fusepy over libfuse2, both installed by scripts/install-test-deps.sh).
"""
import json
import os
import subprocess
import sys
import time

BLOCK = 4096
DISK = "disk.img"
CONTROL = "control"
CONTROL_SIZE = 4096


# --- the daemon ---------------------------------------------------------------------------

def _operations(durable_path):
    import errno
    import stat
    from fuse import FuseOSError, Operations

    class Disk(Operations):
        def __init__(self):
            self.fd = os.open(durable_path, os.O_RDWR)
            self.size = os.fstat(self.fd).st_size
            self.overlay = {}  # block number -> bytearray(BLOCK), written but not flushed
            self.cut = False
            self.stats = {"writes": 0, "fsyncs": 0, "flushes": 0, "blocks_made_durable": 0,
                          "writes_after_cut": 0, "dirty_blocks_at_cut": None}
            self.t0 = time.time()

        # -- names --
        def getattr(self, path, fh=None):
            base = dict(st_uid=0, st_gid=0, st_atime=self.t0, st_mtime=self.t0, st_ctime=self.t0)
            if path == "/":
                return dict(base, st_mode=stat.S_IFDIR | 0o755, st_nlink=2)
            if path == "/" + DISK:
                return dict(base, st_mode=stat.S_IFREG | 0o600, st_nlink=1, st_size=self.size)
            if path == "/" + CONTROL:
                return dict(base, st_mode=stat.S_IFREG | 0o600, st_nlink=1, st_size=CONTROL_SIZE)
            raise FuseOSError(errno.ENOENT)

        def readdir(self, path, fh):
            return [".", "..", DISK, CONTROL]

        def truncate(self, path, length, fh=None):
            if path == "/" + CONTROL:
                return 0
            raise FuseOSError(errno.EPERM)

        # -- the disk --
        def _block(self, n):
            """The current content of block n: the overlay's, else durable.img's."""
            b = self.overlay.get(n)
            if b is not None:
                return b
            data = os.pread(self.fd, BLOCK, n * BLOCK)
            return bytearray(data.ljust(BLOCK, b"\0"))

        def read(self, path, size, offset, fh):
            if path == "/" + CONTROL:
                s = dict(self.stats, dirty_blocks=len(self.overlay), cut=self.cut)
                return json.dumps(s).encode().ljust(CONTROL_SIZE)[offset:offset + size]
            if path != "/" + DISK:
                raise FuseOSError(errno.EIO)
            end = min(offset + size, self.size)
            out = bytearray()
            pos = offset
            while pos < end:
                n, within = divmod(pos, BLOCK)
                take = min(BLOCK - within, end - pos)
                out += self._block(n)[within:within + take]
                pos += take
            return bytes(out)

        def write(self, path, data, offset, fh):
            if path == "/" + CONTROL:
                if data.strip() == b"cut":
                    self.stats["dirty_blocks_at_cut"] = len(self.overlay)
                    self.overlay.clear()
                    self.cut = True
                    return len(data)
                raise FuseOSError(errno.EINVAL)
            if path != "/" + DISK:
                raise FuseOSError(errno.EIO)
            if offset + len(data) > self.size:
                raise FuseOSError(errno.ENOSPC)
            if self.cut:
                self.stats["writes_after_cut"] += 1
                return len(data)
            self.stats["writes"] += 1
            pos, i = offset, 0
            while i < len(data):
                n, within = divmod(pos, BLOCK)
                take = min(BLOCK - within, len(data) - i)
                b = self._block(n)
                b[within:within + take] = data[i:i + take]
                self.overlay[n] = b
                pos += take
                i += take
            return len(data)

        def fsync(self, path, datasync, fh):
            if path != "/" + DISK or self.cut:
                return 0
            self.stats["fsyncs"] += 1
            for n in sorted(self.overlay):
                os.pwrite(self.fd, bytes(self.overlay[n]), n * BLOCK)
            self.stats["blocks_made_durable"] += len(self.overlay)
            self.overlay.clear()
            return 0

        def flush(self, path, fh):
            if path == "/" + DISK:
                self.stats["flushes"] += 1
            return 0

    return Disk()


def serve(durable_path, mountpoint):
    from fuse import FUSE
    # One thread: requests are handled in arrival order and a cut cannot interleave with
    # a write. 128 KiB writes (libfuse2's largest) instead of 4 KiB ones.
    FUSE(_operations(durable_path), mountpoint, foreground=True, nothreads=True,
         big_writes=True, max_write=131072, fsname="volatile-disk")


# --- the harness ----------------------------------------------------------------------------

def run(*cmd, timeout=60):
    """Runs a command; fails with its output if it fails."""
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r.stdout


def _wait(pred, timeout, what, interval=0.02):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def check_machine():
    """Fails (never skips) with what is missing for a volatile disk."""
    missing = []
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse (the fuse kernel module)")
    if not os.path.exists("/dev/loop-control"):
        missing.append("/dev/loop-control (loop devices)")
    if os.geteuid() != 0:
        missing.append("root (mount, losetup)")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            missing.append(f"the {tool} command")
    r = subprocess.run([sys.executable, "-c", "import fuse"], capture_output=True, text=True)
    if r.returncode != 0:
        missing.append("fusepy over libfuse2 (" + (r.stderr.strip().splitlines() or ["?"])[-1] + ")")
    assert not missing, ("the power-loss tests need " + ", ".join(missing) +
                         "; scripts/install-test-deps.sh installs the packages")


class VolatileDisk:
    """A volatile disk under `root`, with an ext4 file system made on it at `mnt`.

        d = VolatileDisk(tmp_path, size_mb=256); d.attach()   # ext4 at d.mnt
        ... write, fsync or not ...
        d.power_cut()           # cache gone, everything unmounted
        d.mount_durable()       # ext4 on durable.img alone (journal replayed) at d.mnt
        d.cleanup()             # every exit path: unmount, detach, stop the daemon
    """

    def __init__(self, root, size_mb=256):
        self.root = str(root)
        self.durable = os.path.join(self.root, "durable.img")
        self.fuse_mnt = os.path.join(self.root, "fuse")
        self.mnt = os.path.join(self.root, "mnt")
        self.daemon = None
        self.daemon_log = os.path.join(self.root, "volatile-disk.log")
        self.loops = []      # loop devices attached by this object, detached at cleanup
        self.mounted = []    # mount points mounted by this object, innermost last
        self.killers = []    # callables ending the processes using the file system
        for d in (self.fuse_mnt, self.mnt):
            os.makedirs(d, exist_ok=True)
        check_machine()
        with open(self.durable, "wb") as f:
            f.truncate(size_mb << 20)
        # Made on the plain file, so none of it goes through the daemon. Inode tables and
        # the journal are initialised now: no lazy-init thread writes (and flushes) later.
        run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.durable)

    # -- mounting --

    def attach(self, timeout=20):
        """Starts the daemon, puts a loop device on its disk.img and mounts ext4 on it.
        commit=300: the journal commits only when something syncs (or after 5 minutes),
        so no periodic commit flushes the cache behind a test's back."""
        log = open(self.daemon_log, "ab")
        self.daemon = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.durable, self.fuse_mnt],
                                       stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def up():
            if self.daemon.poll() is not None:
                with open(self.daemon_log, errors="replace") as f:
                    raise AssertionError(f"the volatile disk daemon exited with {self.daemon.returncode}: {f.read()[-2000:]}")
            return os.path.ismount(self.fuse_mnt)
        _wait(up, timeout, "the volatile disk's FUSE mount")
        self.mounted.append(self.fuse_mnt)
        loop = run("losetup", "--find", "--show", os.path.join(self.fuse_mnt, DISK)).strip()
        self.loops.append(loop)
        self.loop = loop
        run("mount", "-t", "ext4", "-o", "commit=300", loop, self.mnt)
        self.mounted.append(self.mnt)
        return self

    def stats(self):
        """The daemon's counts: writes, fsyncs, flushes, dirty_blocks, ..."""
        with open(os.path.join(self.fuse_mnt, CONTROL), "rb") as f:
            return json.loads(f.read().decode().strip())

    def power_cut(self):
        """Drops every write not flushed, then unmounts all (losing the unmount's writes
        too), detaches the loop device and stops the daemon. Returns the daemon's last
        counts."""
        for kill in self.killers:
            kill()
        fd = os.open(os.path.join(self.fuse_mnt, CONTROL), os.O_WRONLY)
        try:
            os.write(fd, b"cut")
        finally:
            os.close(fd)
        stats = self.stats()
        assert stats["cut"] and stats["dirty_blocks"] == 0, stats
        self._umount(self.mnt)
        self._detach(self.loop)
        final = self.stats()
        self._umount(self.fuse_mnt)
        self.daemon.wait(timeout=20)
        return final

    def mount_durable(self):
        """Mounts what survived: ext4 on durable.img itself (a new loop device)."""
        assert self.daemon is None or self.daemon.poll() is not None, "the daemon still runs"
        loop = run("losetup", "--find", "--show", self.durable).strip()
        self.loops.append(loop)
        self.loop = loop
        run("mount", "-t", "ext4", loop, self.mnt)
        self.mounted.append(self.mnt)
        return self

    def umount(self):
        """Unmounts the ext4 file system (the loop device stays, for e2fsck)."""
        self._umount(self.mnt)

    # -- cleanup --

    def _umount(self, path, timeout=20):
        """Unmounts `path`, retrying while it is busy (a loop device just detached may
        still hold its backing file for a moment)."""
        last = []

        def done():
            r = subprocess.run(["umount", path], capture_output=True, text=True)
            last[:] = [r.stderr.strip()]
            return r.returncode == 0 or "busy" not in r.stderr
        try:
            _wait(done, timeout, f"umount {path}")
        except AssertionError as e:
            raise AssertionError(f"{e}: {last}") from None
        assert not os.path.ismount(path), f"umount {path}: {last}"
        self.mounted.remove(path)

    def _detach(self, loop):
        run("losetup", "-d", loop)
        self.loops.remove(loop)

    def cleanup(self):
        """Every exit path: ends the processes using the file system, unmounts (lazily if
        still busy), detaches the loop devices and stops the daemon. Returns what could
        not be undone (empty if all went)."""
        left = []
        for kill in self.killers:
            try:
                kill()
            except Exception as e:  # noqa: BLE001 - keep cleaning up
                left.append(f"ending a process: {e}")
        for path in reversed(list(self.mounted)):
            if subprocess.run(["umount", path], capture_output=True).returncode != 0:
                r = subprocess.run(["umount", "-l", path], capture_output=True, text=True)
                if r.returncode != 0:
                    left.append(f"umount {path}: {r.stderr.strip()}")
            self.mounted.remove(path)
        for loop in list(self.loops):
            r = subprocess.run(["losetup", "-d", loop], capture_output=True, text=True)
            if r.returncode != 0:
                left.append(f"losetup -d {loop}: {r.stderr.strip()}")
            self.loops.remove(loop)
        if self.daemon is not None and self.daemon.poll() is None:
            try:
                self.daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait(timeout=10)
                left.append("the daemon did not exit after its unmount (killed)")
        return left


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
