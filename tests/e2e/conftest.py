"""Fixtures for the end-to-end tier: real `sluice serve` processes on free ports.

No sleeps as synchronisation: every wait is a bounded retry loop with a deadline.
"""
import os
import queue
import re
import signal
from signal import SIGTERM
import random
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The binary `make test` builds (profile unit), as scripts/run-e2e.sh uses.
SLUICE_BIN = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "target", "unit", "sluice"))


# Every port free_port() has handed out in this run. The kernel may give the same free
# port to two bind(0)s in a row once the first socket is closed: a cluster's brokers
# each took a metrics port that way, and two got the same one (CI: "cannot serve
# metrics on --metrics-listen ...: Address already in use").
_HANDED_OUT = set()


def _ephemeral_low():
    """The lowest port the kernel hands out as a connection's source port."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_range():
    """[lo, hi) of the ports this process hands out: 10000 up to the kernel's ephemeral
    range, split into disjoint slices, one per pytest-xdist worker (PYTEST_XDIST_WORKER
    gwN of PYTEST_XDIST_WORKER_COUNT), so two workers never hand out the same port. Each
    slice keeps 600 ports clear at its top: a broker's default metrics port is its Kafka
    port + 552."""
    lo, hi = 10000, _ephemeral_low()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and count > 1:
        width = (hi - lo) // count
        lo += int(worker[2:]) * width
        hi = lo + width
    return lo, hi - 600


def free_port():
    """A free loopback port that no earlier call of this run returned, below the
    kernel's ephemeral range: a port from that range (what binding port 0 gives) can be
    taken meanwhile as the source port of some outgoing connection, and once held a
    port a cluster broker was about to listen on for over 30 s."""
    lo, hi = _port_range()
    for _ in range(1000):
        port = random.randrange(lo, hi)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free loopback port that this run has not handed out already")


# Errors a wait may retry: the network being down or slow while a broker starts,
# stops or fails over. Anything else (an AssertionError above all) fails at once.
TRANSIENT_ERRORS = (ConnectionError, TimeoutError, EOFError)


def _kafka_codes():
    from confluent_kafka import KafkaError as E
    return frozenset({
        E._TIMED_OUT, E._TRANSPORT, E._ALL_BROKERS_DOWN, E._WAIT_COORD, E._WAIT_CACHE,
        E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS,
        E.LEADER_NOT_AVAILABLE, E.NOT_LEADER_FOR_PARTITION, E.REQUEST_TIMED_OUT,
        E.NOT_CONTROLLER, E.NETWORK_EXCEPTION, E.FENCED_LEADER_EPOCH, E.UNKNOWN_LEADER_EPOCH,
    })


# librdkafka error codes of KafkaExceptions and consumer errors that mean "not yet"
# (a broker unreachable, a leader or coordinator moving), so a wait retries them.
TRANSIENT_KAFKA_CODES = _kafka_codes()


def kafka_code(e):
    """The KafkaError code of a KafkaException (or of a KafkaError), else None."""
    from confluent_kafka import KafkaError, KafkaException
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        return e.args[0].code()
    if isinstance(e, KafkaError):
        return e.code()
    return None


def is_transient(e, retry=()):
    """True if `e` is an expected transient error: one of TRANSIENT_ERRORS, a
    KafkaException with a code in TRANSIENT_KAFKA_CODES, or named in `retry` (exception
    classes, or KafkaError codes as ints)."""
    if isinstance(e, TRANSIENT_ERRORS):
        return True
    classes = tuple(r for r in retry if isinstance(r, type))
    if classes and isinstance(e, classes):
        return True
    code = kafka_code(e)
    return code is not None and (code in TRANSIENT_KAFKA_CODES or code in retry)


def check_consumer_error(err, allow=()):
    """For a consumer message's error(): True (skip it) for end-of-partition and
    transient errors (and codes in `allow`); any other error fails the test."""
    from confluent_kafka import KafkaError
    code = err.code()
    if code == KafkaError._PARTITION_EOF or code in TRANSIENT_KAFKA_CODES or code in allow:
        return True
    raise AssertionError(f"consumer error: {err}")


def read_back(addr, want, timeout=180):
    """Reads every (topic, partition) of `want` from the beginning with a confluent-kafka
    consumer until each holds at least as many records as `want` lists; returns
    {(topic, partition): [values]} cut to those lengths, for comparing with `want`."""
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
    c = Consumer({"bootstrap.servers": addr, "group.id": f"read-back-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for (t, p) in want])
        got = {}

        def all_read():
            for m in c.consume(1000, timeout=1.0):
                if m.error():
                    check_consumer_error(m.error())
                    continue
                got.setdefault((m.topic(), m.partition()), []).append(m.value())
            return all(len(got.get(k, [])) >= len(v) for k, v in want.items())
        wait_until(all_read, timeout=timeout, what=f"every record of {len(want)} partitions")
        return {k: got[k][:len(v)] for k, v in want.items()}
    finally:
        c.close()


def wait_until(pred, timeout=20.0, interval=0.05, what="condition", retry=()):
    """Calls `pred` until it returns a truthy value (returned) or `timeout` seconds
    pass (AssertionError naming `what` and the last value or transient error).

    Only expected transient errors are retried (see is_transient; `retry` adds
    exception classes or KafkaError codes); an AssertionError or any other exception
    from `pred` fails at once."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            v = pred()
            if v:
                return v
            last = v
        except Exception as e:  # noqa: BLE001 - re-raised below unless transient
            if not is_transient(e, retry):
                raise
            last = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


class Lines:
    """The lines a child process writes to a pipe, read by a daemon thread, so that a
    test waits for them with a deadline: a blocking readline() on a process that hangs
    would hang the test with it, without a word."""

    def __init__(self, pipe, name="the child process"):
        self.name = name
        self.closed = False  # the pipe reached end of file (the process exited)
        self._q = queue.Queue()
        threading.Thread(target=self._pump, args=(pipe,), name=f"lines of {name}", daemon=True).start()

    def _pump(self, pipe):
        try:
            for line in pipe:
                self._q.put(line)
        except (OSError, ValueError):
            pass  # closed under us: end of the lines all the same
        self._q.put(None)

    def _take(self, line):
        if line is None:
            self.closed = True
        return line

    def next(self, timeout, what="a line"):
        """The next line; AssertionError naming `what` if none comes within `timeout`
        seconds or the pipe is closed (the process exited) first."""
        if not self.closed:
            try:
                line = self._take(self._q.get(timeout=max(0.0, timeout)))
            except queue.Empty:
                raise AssertionError(f"{self.name}: no line within {timeout:.1f}s "
                                     f"while waiting for {what}") from None
            if line is not None:
                return line
        raise AssertionError(f"{self.name} closed its output (exited) while waiting for {what}")

    def until(self, pred, timeout, what="a line"):
        """The first line for which `pred` is true, within `timeout` seconds in all."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.next(end - time.monotonic(), what)
            except AssertionError as e:
                if self.closed:
                    raise
                raise AssertionError(f"{self.name}: no line within {timeout:.1f}s "
                                     f"while waiting for {what}") from e
            if pred(line):
                return line

    def ready(self):
        """The lines written so far that are not taken yet, without waiting."""
        out = []
        while not self.closed:
            try:
                line = self._take(self._q.get_nowait())
            except queue.Empty:
                break
            if line is not None:
                out.append(line)
        return out


# A broker log line that fails the test unless the test declared it expected: an
# ERROR-level tracing line or a panic (the panic hook logs "fatal: panicked at ...").
LOG_PROBLEM = re.compile(r"^\S+\s+ERROR\s|panicked|sluice: fatal")



def http_get(url, timeout=5):
    """(status, body) of a GET; HTTP error statuses are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def read_all(addr, topic, deadline=30):
    """Every record of partition 0 up to its end: [(offset, key, value or None)].

    The end is the high watermark when the call starts (the last stable offset for
    this consumer's isolation level, librdkafka's default read_committed); it fails
    (AssertionError) if the consumer's position has not reached it within `deadline`
    seconds, rather than returning what it has read by then."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": addr, "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, lo)])
        out = []
        end = time.monotonic() + deadline
        # Done once the position passes `hi` (compaction leaves gaps, and the last
        # offsets may be transaction markers, which are never returned).
        position = lo
        while position < hi:
            if time.monotonic() > end:
                raise AssertionError(
                    f"read_all({topic}-0): read {len(out)} records, position {position} after "
                    f"{deadline}s, waited for the high watermark {hi} (log start {lo})")
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    check_consumer_error(m.error())
                    continue
                v = m.value()
                out.append((m.offset(), m.key().decode(), v.decode() if v is not None else None))
            [tp] = c.position([TopicPartition(topic, 0)])
            position = max(position, tp.offset)
        return out
    finally:
        c.close()


class Broker:
    """One `sluice serve` process. `start()` returns once the port accepts connections.

    The same Broker may be started again after `kill()` or `stop()` (same data
    directory, port and log file); every process it started is remembered with how the
    test ended it, so `problems()` can tell an expected exit from a death."""

    def __init__(self, data_dir, port=None, cores=1, extra=(), env=None, expected_errors=(),
                 metrics_port=None, nofile=None, cpus=None):
        self.data_dir = str(data_dir)
        self.nofile = nofile  # the process's open-file limit (soft and hard), if set
        self.cpus = cpus  # the process's CPU set (as `taskset -c` starts it), if set
        self.port = port or free_port()
        # An explicit metrics port of its own (the default, Kafka port + 552, could be
        # another test's); a test that passes --metrics-listen in `extra` decides itself,
        # and metrics_port="default" passes no flag (the broker's default address).
        self.metrics_flag = "--metrics-listen" not in extra and metrics_port != "default"
        if "--metrics-listen" in extra:
            self.metrics_port = None
        elif metrics_port == "default":
            self.metrics_port = self.port + 552
        else:
            self.metrics_port = metrics_port or free_port()
        self.cores = cores
        self.extra = list(extra)
        self.env = env or {}
        self.proc = None
        self.runs = []  # [process, how the test ended it: None, "stop" or "kill"]
        self.expected_errors = list(expected_errors)
        self.log_path = os.path.join(self.data_dir + ".logs", f"broker-{uuid.uuid4().hex[:8]}.log")

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self):
        """Base URL of the HTTP endpoint (/metrics, /health, /ready, ...)."""
        assert self.metrics_port is not None, "this broker was started with its own --metrics-listen"
        return f"http://127.0.0.1:{self.metrics_port}"

    def start(self):
        self.spawn()
        self.wait_ready()
        return self

    def spawn(self):
        """Starts the process without waiting (a cluster's brokers open their Kafka
        port only once a quorum of them runs)."""
        assert not self.alive(), "broker is still running"
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        env.update(self.env)
        self.log = open(self.log_path, "ab")
        # cores=None passes no --cores: the broker's default, a shard per CPU it may use.
        cores = [] if self.cores is None else ["--cores", str(self.cores)]
        # Named listeners (--listeners in `extra`) replace --listen: one of them is
        # expected on self.port, which wait_ready probes.
        listen = [] if "--listeners" in self.extra else ["--listen", self.addr]
        self.proc = subprocess.Popen(
            [SLUICE_BIN, "serve", *listen, "--data-dir", self.data_dir,
             *cores, *self.metrics_flags(), *self.extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, preexec_fn=self._limits)
        self.runs.append([self.proc, None])
        return self

    def _limits(self):
        if self.nofile is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)

    def metrics_flags(self):
        if not self.metrics_flag:
            return []
        return ["--metrics-listen", f"127.0.0.1:{self.metrics_port}"]

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

    def expect_errors(self, *patterns):
        """Declares ERROR log lines (regexes, re.search) this test expects."""
        self.expected_errors.extend(patterns)

    def kill(self, sig=signal.SIGKILL):
        """SIGKILL (or `sig`): no flush, no goodbye. Any exit is fine afterwards."""
        self.runs[-1][1] = "kill"
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)

    def exited(self, timeout=30):
        """Waits (bounded) for the process to exit by itself, as the test expects it
        to; returns the exit code."""
        self.proc.wait(timeout=timeout)
        self.runs[-1][1] = "kill"  # ended as the test meant: not a death
        return self.proc.returncode

    def stop(self, timeout=30):
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.proc and self.proc.poll() is None:
            self.runs[-1][1] = "stop"
            self.proc.send_signal(SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("broker did not stop within %ss of SIGTERM" % timeout)
        return self.proc.returncode

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def exit_problems(self):
        """Processes that exited without the test asking: [description]."""
        out = []
        for n, (proc, how) in enumerate(self.runs):
            code = proc.poll()
            if how == "kill" or code is None:
                continue
            if how == "stop" and code != 0:
                out.append(f"run {n} exited with code {code} after SIGTERM (pid {proc.pid})")
            elif how is None:
                out.append(f"run {n} died with code {code} on its own (pid {proc.pid})")
        return out

    def log_problems(self, expected=()):
        """ERROR or panic lines of the log not matching an expected pattern."""
        pats = [re.compile(p) for p in list(expected) + self.expected_errors]
        try:
            text = self.read_log()
        except OSError:
            return []
        return [ln for ln in text.splitlines()
                if LOG_PROBLEM.search(ln) and not any(p.search(ln) for p in pats)]

    def finish(self, expected=()):
        """End of a test: every process the test did not end must still be running
        (checked first), then is stopped with SIGTERM and must exit 0; then the log
        must hold no unexpected ERROR or panic line. Returns [problem]; empty if fine."""
        problems = self.exit_problems()
        if self.alive():
            try:
                code = self.stop()
                if code != 0:
                    problems.append(f"exited with code {code} on SIGTERM at teardown")
            except AssertionError as e:
                problems.append(str(e))
        bad = self.log_problems(expected)
        if bad:
            problems.append(f"{len(bad)} unexpected ERROR/panic log lines, e.g.:\n  " +
                            "\n  ".join(bad[:10]))
        return problems


def expected_log_errors(request):
    """Patterns from the test's @pytest.mark.broker_log_errors(...) markers."""
    return [p for m in request.node.iter_markers("broker_log_errors") for p in m.args]


def check_brokers(brokers, expected=(), names=None):
    """Finishes every broker (see Broker.finish) and fails with each one's problems and
    log tail. `names` labels them in the report (default: their log paths)."""
    report = []
    for n, b in enumerate(brokers):
        problems = b.finish(expected)
        if problems:
            name = names[n] if names else b.log_path
            tail = b.read_log()[-3000:] if os.path.exists(b.log_path) else ""
            report.append(f"broker {name} ({b.log_path}):\n  " + "\n  ".join(problems) +
                          f"\n--- log tail ---\n{tail}")
    if report:
        raise AssertionError("broker health check failed:\n" + "\n".join(report))


@pytest.fixture
def make_broker(tmp_path, request):
    """make_broker(...) starts a broker; at teardown each must be alive (or ended by
    the test: killed, or stopped with exit code 0), stop cleanly, and have no ERROR
    or panic line in its log beyond the test's broker_log_errors patterns."""
    brokers = []

    def make(cores=1, extra=(), data_dir=None, port=None, env=None, nofile=None, cpus=None):
        b = Broker(data_dir or (tmp_path / f"data{len(brokers)}"), port=port, cores=cores, extra=extra, env=env,
                   nofile=nofile, cpus=cpus)
        brokers.append(b)
        return b.start()

    yield make
    check_brokers(brokers, expected_log_errors(request))


@pytest.fixture
def broker(make_broker):
    return make_broker()


# Skips that do not fail the run, each because the machine (not a missing install) rules
# the test out: test function → why. scripts/install-test-deps.sh installs every tool a
# test needs, so a skip for a missing tool (Burrow, Alertmanager, Go, systemd-analyze,
# Java, ...) is not listed: it fails `make test`, with its reason, like a failed test.
ALLOWED_SKIPS = {
    "test_shards_are_pinned_only_when_they_take_every_cpu_they_may_use":
        "a one-CPU machine has no second CPU to pin a shard to",
    "test_check_refuses_a_tmpfs_data_dir":
        "a machine without a tmpfs at /dev/shm has none to refuse",
    "test_check_passes_o_direct_on_the_normal_data_dir_and_names_a_held_port":
        "the test's temporary directory is not on ext4, xfs or btrfs",
    "test_json_logs_parse_and_the_open_file_limit_is_raised":
        "the hard open-file limit is 1024 or less: there is nothing to raise",
}

_SKIPPED = []  # (nodeid, reason) of every skipped test of this run


def _test_name(nodeid):
    """The test function of a node id (file::name[params] → name)."""
    return nodeid.split("::")[-1].split("[")[0]


def _skip_allowed(nodeid):
    return _test_name(nodeid) in ALLOWED_SKIPS


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append((report.nodeid, reason))


def pytest_terminal_summary(terminalreporter):
    allowed = [s for s in _SKIPPED if _skip_allowed(s[0])]
    refused = [s for s in _SKIPPED if not _skip_allowed(s[0])]
    for title, group in (("skipped, allowed (conftest.ALLOWED_SKIPS)", allowed),
                         ("skipped, NOT allowed: this fails the run", refused)):
        if group:
            terminalreporter.section(f"{len(group)} {title}")
            for nodeid, reason in group:
                why = ALLOWED_SKIPS.get(_test_name(nodeid), "")
                terminalreporter.line(f"{nodeid}: {reason}" + (f" (allowed: {why})" if why else ""))


def pytest_sessionfinish(session, exitstatus):
    """A skip not in ALLOWED_SKIPS fails the run (a run that collected no test fails by
    itself: pytest exits 5)."""
    if any(not _skip_allowed(nodeid) for nodeid, _ in _SKIPPED) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
