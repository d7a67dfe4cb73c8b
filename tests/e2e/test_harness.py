"""Tier: the harness itself. The retry helper fails at once on an assertion, read_all
fails when it cannot read up to the high watermark in time, waiting for a child
process's next line fails at a deadline instead of hanging, and the end-of-test broker
check notices a broker that died, one that exited badly when told to stop, and an
ERROR or panic line nobody declared."""
import os
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from conftest import Broker, Lines, check_brokers, read_all, wait_until
from faultproxy import FETCH, DroppingProxy
from test_confluent import create_topic


def test_wait_until_fails_at_once_on_an_assertion_and_retries_only_transient_errors():
    calls = []

    def asserts():
        calls.append(1)
        assert False, "the predicate's own check"
    with pytest.raises(AssertionError, match="the predicate's own check"):
        wait_until(asserts, timeout=30, interval=0)
    assert len(calls) == 1, "an AssertionError is not retried"

    def unexpected():
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaException):
        wait_until(unexpected, timeout=30, interval=0)

    tries = iter([ConnectionRefusedError(), KafkaException(KafkaError(KafkaError._TRANSPORT)),
                  KeyError("named by the caller"), 0, "done"])

    def flaky():
        v = next(tries)
        if isinstance(v, Exception):
            raise v
        return v
    assert wait_until(flaky, timeout=30, interval=0, retry=(KeyError,)) == "done"
    with pytest.raises(AssertionError, match="timed out after 0.2s waiting for never"):
        wait_until(lambda: None, timeout=0.2, interval=0.05, what="never")


def test_health_check_catches_death_bad_exit_and_error_lines(tmp_path):
    # Died behind the test's back (as a panic with panic=abort would).
    b = Broker(tmp_path / "a").start()
    os.kill(b.proc.pid, signal.SIGKILL)
    b.proc.wait(timeout=30)
    with pytest.raises(AssertionError, match="died with code -9 on its own"):
        check_brokers([b])
    # Killed by the test: fine.
    b = Broker(tmp_path / "b").start()
    b.kill()
    check_brokers([b])
    # An ERROR or panic line fails the check unless declared.
    b = Broker(tmp_path / "c").start()
    with open(b.log_path, "a") as f:
        f.write("2026-01-01T00:00:00.000000Z ERROR shard-0-1 sluice::x: disk on fire\n"
                "sluice: fatal in thread shard-0-1: panicked at src/x.rs:1:1: boom\n")
    with pytest.raises(AssertionError, match="2 unexpected ERROR/panic log lines"):
        check_brokers([b])
    assert not b.alive() and b.proc.returncode == 0, "stopped cleanly all the same"
    check_brokers([b], expected=["disk on fire", "boom"])
    # Stopped by the test, but its exit code was not 0.
    b = Broker(tmp_path / "d").start()
    b.runs[-1][1] = "stop"
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(timeout=30)
    with pytest.raises(AssertionError, match="exited with code -9 after SIGTERM"):
        check_brokers([b])


def test_read_all_fails_when_it_cannot_reach_the_high_watermark(make_broker):
    """Through a proxy that loses every Fetch answer (the broker advertises it, so every
    connection of the reader goes through it), read_all learns the high watermark but
    never reads a record: it fails at its deadline, naming what it waited for, instead
    of returning the nothing it has. With the answers let through, it reads them all."""
    broker = make_broker()
    proxy = DroppingProxy(broker.port, every=1, max_drops=10**9, api_key=FETCH)
    broker.stop()
    broker.extra = ["--advertised", proxy.addr]
    broker.start()
    try:
        create_topic(broker.addr, "unreachable", 1)
        p = Producer({"bootstrap.servers": proxy.addr})
        for i in range(5):
            p.produce("unreachable", key=b"k", value=b"v%d" % i)
        assert p.flush(30) == 0
        with pytest.raises(AssertionError, match=r"read_all\(unreachable-0\): read 0 records, "
                                                 r"position 0 after 3s, waited for the high watermark 5"):
            read_all(proxy.addr, "unreachable", deadline=3)
        assert proxy.dropped > 0, "the reader fetched, and lost the answers"
        proxy.max_drops = proxy.dropped  # no more losses
        assert read_all(proxy.addr, "unreachable") == [(i, "k", f"v{i}") for i in range(5)]
    finally:
        proxy.close()


def test_lines_of_a_silent_process_fail_at_the_deadline():
    """A child that prints one line and then hangs: the line is read, waiting for the
    next fails after the deadline with a message (a plain readline() would block for
    good), and once the child is gone, waiting fails at once saying so."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; print('READY', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        lines = Lines(proc.stdout, "the silent child")
        assert lines.next(30, "READY") == "READY\n"
        start = time.monotonic()
        with pytest.raises(AssertionError, match=r"the silent child: no line within 0.5s while waiting for DONE"):
            lines.until(lambda line: line.startswith("DONE"), timeout=0.5, what="DONE")
        assert 0.5 <= time.monotonic() - start < 10
        assert lines.ready() == []
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(AssertionError, match=r"the silent child closed its output \(exited\) while waiting for DONE"):
        lines.next(30, "DONE")
    assert lines.closed
