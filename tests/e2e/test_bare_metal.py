"""Bare-metal operation (issue 13): the `sluice check` preflight, the open-file limit
raised at start, JSON logs, systemd's readiness notification and unit file, and a
restart on the same ports right after a SIGKILL. Real `sluice` processes throughout.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import ROOT, SLUICE_BIN, Broker, check_brokers, free_port, wait_until


def fs_type(path):
    """The file system type of the mount holding `path` (/proc/mounts, longest prefix)."""
    path = os.path.realpath(path)
    best, kind = "", None
    with open("/proc/mounts") as f:
        for line in f:
            _, mnt, fstype = line.split()[:3]
            mnt = mnt.replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best, kind = mnt, fstype
    return kind


def kernel_version():
    return tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])


def run_check(*args):
    p = subprocess.run([SLUICE_BIN, "check", *args], capture_output=True, text=True, timeout=60)
    lines = {}
    for ln in p.stdout.splitlines():
        parts = ln.split(None, 1)
        if parts and parts[0] in ("OK", "WARN", "FAIL"):
            # "LEVEL  name-with-spaces   detail": names are fixed-width (16).
            lines[ln[6:22].strip()] = (parts[0], ln[22:].strip())
    return p, lines


@pytest.fixture
def tmpfs_dir():
    shm = "/dev/shm"
    if not os.path.isdir(shm) or fs_type(shm) != "tmpfs":
        pytest.skip("no tmpfs mounted at /dev/shm on this machine")
    d = os.path.join(shm, f"sluice-check-{os.getpid()}-{time.monotonic_ns()}")
    os.makedirs(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_check_refuses_a_tmpfs_data_dir(tmpfs_dir):
    p, lines = run_check("--data-dir", tmpfs_dir, "--listen", f"127.0.0.1:{free_port()}")
    assert p.returncode == 1, p.stdout + p.stderr
    level, detail = lines["file system"]
    assert level == "FAIL" and "tmpfs" in detail, p.stdout
    level, detail = lines["O_DIRECT"]
    if kernel_version() < (6, 6):
        # Before Linux 6.6 tmpfs refuses O_DIRECT outright.
        assert level == "FAIL" and "does not support O_DIRECT" in detail, p.stdout
    else:
        # Since 6.6 tmpfs accepts O_DIRECT (still memory: the file-system line fails).
        assert level in ("OK", "FAIL"), p.stdout
    assert "fix: put --data-dir on a local disk" in p.stdout
    assert "blocker(s)" in p.stdout


def test_check_passes_o_direct_on_the_normal_data_dir_and_names_a_held_port(tmp_path):
    kind = fs_type(str(tmp_path))
    if kind not in ("ext4", "xfs", "btrfs"):
        pytest.skip(f"tmp_path is on {kind}, not a disk file system")
    data = tmp_path / "data"  # not there yet: the check probes its parent, creates nothing
    port, cport = free_port(), free_port()
    p, lines = run_check("--data-dir", str(data), "--listen", f"127.0.0.1:{port}",
                         "--controller-listen", f"127.0.0.1:{cport}",
                         "--controller-quorum", f"1@127.0.0.1:{cport}")
    assert lines["O_DIRECT"][0] == "OK", p.stdout
    assert lines["io_uring"][0] == "OK", p.stdout
    assert lines["kafka port"] == ("OK", f"127.0.0.1:{port} is free"), p.stdout
    assert lines["controller port"][0] == "OK", p.stdout
    assert lines["metrics port"][0] in ("OK", "WARN"), p.stdout  # default: Kafka port + 552
    for name in ("memlock", "open files", "free disk", "clock sync"):
        assert name in lines, p.stdout
    assert not data.exists()
    fails = [n for n, (lvl, _) in lines.items() if lvl == "FAIL"]
    assert p.returncode == (1 if fails else 0), p.stdout
    # A port someone listens on is a blocker, with the flag to change.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        p, lines = run_check("--data-dir", str(data), "--listen", f"127.0.0.1:{busy}")
        assert p.returncode == 1, p.stdout
        assert lines["kafka port"] == ("FAIL", f"127.0.0.1:{busy} is in use"), p.stdout
        assert "choose another --listen" in p.stdout
        # An explicit metrics address in use is a blocker too (the broker would not start).
        p, lines = run_check("--data-dir", str(data), "--listen", f"127.0.0.1:{free_port()}",
                             "--metrics-listen", f"127.0.0.1:{busy}")
        assert p.returncode == 1, p.stdout
        assert lines["metrics port"] == ("FAIL", f"127.0.0.1:{busy} is in use"), p.stdout


def test_check_reads_the_shipped_config_file(tmp_path):
    """deploy/sluice.toml, as shipped, loads in the binary's config loader."""
    cfg = os.path.join(ROOT, "deploy", "sluice.toml")
    p, lines = run_check("--config", cfg, "--data-dir", str(tmp_path / "d"),
                         "--listen", f"127.0.0.1:{free_port()}")
    assert p.returncode in (0, 1), p.stdout + p.stderr  # 2: the config did not load
    assert "O_DIRECT" in lines, p.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('log_format = "xml"\n')
    p, _ = run_check("--config", str(bad))
    assert p.returncode == 2 and "--log-format xml: expected text or json" in p.stderr, p.stderr


def proc_limits(pid, name):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith(name):
                soft, hard = line[len(name):].split()[:2]
                return soft, hard
    raise AssertionError(f"{name} not in /proc/{pid}/limits")


def test_json_logs_parse_and_the_open_file_limit_is_raised(tmp_path):
    import resource
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"hard open-file limit {hard}: nothing to raise")
    # Start with a soft limit below the hard one, as a login shell gives (the child
    # inherits it; this process gets its own back at once).
    b = Broker(tmp_path / "data", extra=["--log-format", "json"])
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        b.spawn()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)
    try:
        b.wait_ready()
        got_soft, got_hard = proc_limits(b.proc.pid, "Max open files")
        assert got_soft == got_hard, (got_soft, got_hard)
        wait_until(lambda: "sluice ready" in b.read_log(), 10, what="the ready line")
        records = [json.loads(line) for line in b.read_log().splitlines() if line.strip()]
        assert all("level" in r and "timestamp" in r and "fields" in r for r in records), records[:3]
        raised = [r["fields"]["message"] for r in records
                  if "open files (RLIMIT_NOFILE)" in r["fields"].get("message", "")]
        assert raised and f"raised from 1024 to {got_soft}" in raised[0], raised
        assert any(r["level"] == "INFO" and "sluice ready" in r["fields"].get("message", "")
                   for r in records)
    finally:
        check_brokers([b])


def test_bad_log_format_is_refused_with_the_flag_named(tmp_path):
    p = subprocess.run([SLUICE_BIN, "serve", "--data-dir", str(tmp_path / "d"),
                        "--listen", f"127.0.0.1:{free_port()}", "--log-format", "xml"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert "--log-format xml: expected text or json" in p.stderr


def test_systemd_readiness_and_stopping_notifications(tmp_path):
    """Type=notify: READY=1 arrives once the Kafka port serves; STOPPING=1 on SIGTERM."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    b = Broker(tmp_path / "data", env={"NOTIFY_SOCKET": path})
    try:
        b.spawn()
        sock.settimeout(30)
        msg = sock.recv(4096).decode()
        assert msg.startswith("READY=1\n") and f"STATUS=serving Kafka on {b.addr}" in msg, msg
        # Ready means serving: the port accepts at once (no retry loop).
        socket.create_connection(("127.0.0.1", b.port), timeout=5).close()
        b.stop()
        sock.settimeout(5)
        assert sock.recv(4096).decode().startswith("STOPPING=1"), "no STOPPING=1"
        assert b.proc.returncode == 0
    finally:
        sock.close()
        check_brokers([b])


def produce_and_read(addr, topic, n, tag):
    p = Producer({"bootstrap.servers": addr, "acks": "all"})
    for i in range(n):
        p.produce(topic, f"{tag}-{i}".encode(), partition=0)
    assert p.flush(30) == 0


def read_all(addr, topic, want):
    c = Consumer({"bootstrap.servers": addr, "group.id": "bm-read", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    c.close()
    return got


def test_restart_right_after_sigkill_on_the_same_ports(tmp_path):
    """SIGKILL with clients connected, then start again at once on the same Kafka and
    controller ports: the start waits out sockets the dead process's io_uring still
    holds (bounded, logged) instead of failing with "address already in use"."""
    cport = free_port()
    b = Broker(tmp_path / "data", cores=2,
               extra=["--controller-listen", f"127.0.0.1:{cport}",
                      "--controller-quorum", f"1@127.0.0.1:{cport}"])
    b.start()
    try:
        total = 0
        for round_ in range(3):
            produce_and_read(b.addr, "crash", 20, f"r{round_}")
            total += 20
            # A connected consumer keeps sockets open in the shards' rings at the kill.
            c = Consumer({"bootstrap.servers": b.addr, "group.id": "bm", "enable.auto.commit": False})
            c.assign([TopicPartition("crash", 0, 0)])
            wait_until(lambda: (m := c.poll(0.2)) is not None and not m.error(), 20, what="a record")
            b.kill()
            b.spawn()  # at once: no wait for the kernel to release the ports
            c.close()
            b.wait_ready(timeout=40)
            got = read_all(b.addr, "crash", total)
            assert len(got) == total, (round_, len(got))
        log = b.read_log()
        assert "address already in use" not in log.lower() or "waiting up to" in log
    finally:
        check_brokers([b])


def test_systemd_unit_verifies():
    unit = os.path.join(ROOT, "deploy", "systemd", "sluice.service")
    text = open(unit).read()
    for line in ("Type=notify", "LimitNOFILE=", "LimitMEMLOCK=infinity", "Restart=on-failure",
                 "KillSignal=SIGTERM", "TimeoutStopSec="):
        assert line in text, line
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        # verify checks that ExecStart's binary exists: point it at the one built.
        path = os.path.join(d, "sluice.service")
        with open(path, "w") as f:
            f.write(text.replace("/usr/local/bin/sluice", SLUICE_BIN))
        p = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True,
                           timeout=60)
        out = (p.stdout + p.stderr).strip()
        assert p.returncode == 0, out
        assert "sluice.service" not in out, out  # no warning about our unit
