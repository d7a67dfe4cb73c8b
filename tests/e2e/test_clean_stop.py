"""A clean stop at scale (issue 14): with many partitions and many idle client
connections, SIGTERM closes every log in rounds with one file-system sync each
(`Storage::close_logs`), marks each one clean, closes the connections and exits 0; the
restart then opens every log from its clean-close record, recovering none, and every
acknowledged record reads back. (A stop that took too long would be SIGKILLed by
systemd or Kubernetes and the restart would recover every log; here the restart's
count of recovered logs is what is asserted, not a time.)"""
import re
import resource
import socket

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import read_back, wait_until

TOPICS = 10
PER_TOPIC = 100
PARTITIONS = TOPICS * PER_TOPIC
IDLE_CONNECTIONS = 2_000


def topics():
    return [f"stop{t}" for t in range(TOPICS)]


def produce_each(addr):
    p = Producer({"bootstrap.servers": addr, "linger.ms": 20, "acks": "all"})
    failed, want = [], {}
    for t in topics():
        for i in range(PER_TOPIC):
            v = f"{t}-{i}".encode()
            p.produce(t, value=v, partition=i,
                      on_delivery=lambda err, m: err and failed.append((m.topic(), m.partition(), err)))
            want[(t, i)] = [v]
            p.poll(0)
    assert p.flush(120) == 0, "records without a delivery report"
    assert not failed, failed[:5]
    return want


def open_idle(port, n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 512:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1024), hard))
    socks = []
    for _ in range(n):
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    return socks


def closed_by_broker(s):
    """True once the broker has closed the connection (EOF or reset)."""
    s.settimeout(10)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_clean_stop_with_many_partitions_and_idle_connections_needs_no_recovery(make_broker):
    b = make_broker(cores=2)
    admin = AdminClient({"bootstrap.servers": b.addr})
    for f in admin.create_topics([NewTopic(t, PER_TOPIC, 1) for t in topics()],
                                 request_timeout=60).values():
        f.result(timeout=90)
    want = produce_each(b.addr)
    idle = open_idle(b.port, IDLE_CONNECTIONS)
    try:
        assert b.stop(timeout=120) == 0
        # Every idle connection was closed by the broker's exit, none left hanging.
        assert all(closed_by_broker(s) for s in idle)
    finally:
        for s in idle:
            s.close()
    stopped = b.read_log()
    closes = re.findall(r"logs closed shard=\d+ logs=(\d+) marked_clean=(\d+) unchanged=(\d+) failed=(\d+)",
                        stopped)
    assert len(closes) == 2, f"one close report per shard: {closes}"
    assert all(int(failed) == 0 for *_, failed in closes), closes
    assert all(int(logs) == int(clean) + int(same) for logs, clean, same, _ in closes), closes
    assert sum(int(clean) for _, clean, _, _ in closes) >= PARTITIONS, closes

    b.start()

    def opened():
        found = re.findall(r"logs opened: (\d+) clean, (\d+) recovered", b.read_log()[len(stopped):])
        return [(int(c), int(r)) for c, r in found]
    wait_until(lambda: len(opened()) == 2, timeout=60, what="each shard's report of the logs it opened")
    counts = opened()
    assert all(r == 0 for _, r in counts), f"a log was recovered after a clean stop: {counts}"
    assert sum(c for c, _ in counts) >= PARTITIONS, counts
    assert read_back(b.addr, want) == want
