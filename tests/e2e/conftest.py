"""Fixtures for the end-to-end tier: real `sluice serve` processes on free ports.

No sleeps as synchronisation: every wait is a bounded retry loop with a deadline.
"""
import os
import signal
import socket
import subprocess
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE_BIN = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "target", "release", "sluice"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout=20.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


class Broker:
    """One `sluice serve` process. `start()` returns once the port accepts connections."""

    def __init__(self, data_dir, port=None, cores=1, extra=(), env=None):
        self.data_dir = str(data_dir)
        self.port = port or free_port()
        self.cores = cores
        self.extra = list(extra)
        self.env = env or {}
        self.proc = None
        self.log_path = os.path.join(self.data_dir + ".logs", f"broker-{uuid.uuid4().hex[:8]}.log")

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        self.spawn()
        self.wait_ready()
        return self

    def spawn(self):
        """Starts the process without waiting (a cluster's brokers open their Kafka
        port only once a quorum of them runs)."""
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        env.update(self.env)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [SLUICE_BIN, "serve", "--listen", self.addr, "--data-dir", self.data_dir,
             "--cores", str(self.cores), *self.extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        return self

    def wait_ready(self, timeout=30):
        """Returns once the Kafka port accepts connections; fails if the process exits."""
        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.read_log()[-2000:]}")
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        wait_until(up, timeout=timeout, what=f"broker on {self.addr}")
        return self

    def read_log(self):
        with open(self.log_path, "r", errors="replace") as f:
            return f.read()

    def kill(self):
        """SIGKILL: no flush, no goodbye."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout=30):
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("broker did not stop within %ss of SIGTERM" % timeout)
        return self.proc.returncode

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture
def make_broker(tmp_path):
    brokers = []

    def make(cores=1, extra=(), data_dir=None, port=None, env=None):
        b = Broker(data_dir or (tmp_path / f"data{len(brokers)}"), port=port, cores=cores, extra=extra, env=env)
        brokers.append(b)
        return b.start()

    yield make
    for b in brokers:
        if b.alive():
            b.stop()


@pytest.fixture
def broker(make_broker):
    return make_broker()
