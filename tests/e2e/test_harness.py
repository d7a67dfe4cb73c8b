"""Tier: the harness itself. The retry helper fails at once on an assertion, and the
end-of-test broker check notices a broker that died, one that exited badly when told
to stop, and an ERROR or panic line nobody declared."""
import os
import signal

import pytest
from confluent_kafka import KafkaError, KafkaException

from conftest import Broker, check_brokers, wait_until


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
