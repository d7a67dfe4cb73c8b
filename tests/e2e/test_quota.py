"""Tier: client quotas (issue 42): `producer_byte_rate` and `consumer_byte_rate` per user
and client id, set with `sluice config --entity-type users|clients` (AlterClientQuotas)
and enforced per shard: past its quota a client's responses carry throttle_time_ms and
its connection is muted. Rates are measured over the run, in the steady part after the
window's burst allowance, never per request."""
import subprocess
import time

from confluent_kafka import Consumer, Producer

from conftest import SLUICE_BIN, wait_until
from test_sasl import create

MB = 1 << 20


def sluice(*args):
    return subprocess.run([SLUICE_BIN, *args], capture_output=True, text=True, timeout=60)


def quota(addr, *args):
    r = sluice("config", *args, "--bootstrap-server", addr)
    assert r.returncode == 0, r.stderr
    return r.stdout


# Kafka's window: a rate is judged over at least 10 of its 11 one-second samples, so a
# client may send about ten seconds' worth at once before its first throttle.
WINDOW_S = 11


def within_quota(total, seconds, quota):
    """Whether `total` bytes over `seconds` are what a `quota` bytes/s client may move:
    the window's allowance plus the quota for the run, 20% slack for the throttle being
    computed after each request."""
    return total <= 1.2 * quota * (seconds + WINDOW_S)


def test_a_producer_is_held_to_its_byte_rate(make_broker):
    """A 1 MiB/s producer_byte_rate on client id `capped`: confluent-kafka producing
    10 KB records as fast as it can for 12 s gets no more acknowledged than the quota
    allows over the run (its rate plus the window's allowance), and hears
    throttle_time_ms; the quota is described back, and removed."""
    b = make_broker()
    quota(b.addr, "alter", "--entity-type", "clients", "--entity-name", "capped",
          "--add-config", f"producer_byte_rate={MB}")
    out = quota(b.addr, "describe", "--entity-type", "clients", "--entity-name", "capped")
    assert f"client-id=capped  producer_byte_rate={MB}" in out, out
    create({"bootstrap.servers": b.addr}, "q")
    throttles, acked = [], []
    p = Producer({"bootstrap.servers": b.addr, "client.id": "capped", "linger.ms": 5,
                  "queue.buffering.max.messages": 2000,
                  "throttle_cb": lambda ev: throttles.append(ev.throttle_time)})
    value = b"x" * 10_000
    start = time.monotonic()

    def done(err, msg):
        if err is None:
            acked.append((time.monotonic(), len(msg.value())))
    while time.monotonic() - start < 12:
        try:
            p.produce("q", value, on_delivery=done)
        except BufferError:
            p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0
    total, seconds = sum(n for _, n in acked), time.monotonic() - start
    print(f"producer: {total / MB:.1f} MiB acknowledged in {seconds:.1f} s, max throttle {max(throttles or [0])} ms")
    assert MB <= total and within_quota(total, seconds, MB), \
        f"{total / MB:.1f} MiB acknowledged in {seconds:.1f} s against a 1 MiB/s quota"
    assert throttles and max(throttles) > 0, throttles

    quota(b.addr, "alter", "--entity-type", "clients", "--entity-name", "capped",
          "--delete-config", "producer_byte_rate")
    assert "producer_byte_rate" not in quota(b.addr, "describe", "--entity-type", "clients",
                                             "--entity-name", "capped")


def test_a_consumer_is_held_to_its_byte_rate(make_broker):
    """A 1 MiB/s consumer_byte_rate on the default user: a confluent-kafka consumer
    offered 40 MB for 12 s reads no more than the quota allows over the run, hears
    throttle_time_ms, and reads every record in order (a throttled fetch answers
    without records, fetched again after the pause)."""
    b = make_broker()
    create({"bootstrap.servers": b.addr}, "big")
    p = Producer({"bootstrap.servers": b.addr, "linger.ms": 20})
    n = 4000
    for i in range(n):
        p.produce("big", (b"%06d" % i) + b"y" * 9_994)
        p.poll(0)
    assert p.flush(60) == 0
    quota(b.addr, "alter", "--entity-type", "users", "--entity-name", "<default>",
          "--add-config", f"consumer_byte_rate={MB}")
    throttles, got = [], []
    c = Consumer({"bootstrap.servers": b.addr, "group.id": "slow", "auto.offset.reset": "earliest",
                  "throttle_cb": lambda ev: throttles.append(ev.throttle_time)})
    c.subscribe(["big"])
    start = time.monotonic()
    try:
        while time.monotonic() - start < 12:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append((time.monotonic(), len(m.value()), int(m.value()[:6])))
    finally:
        c.close()
    total, seconds = sum(sz for _, sz, _ in got), time.monotonic() - start
    print(f"consumer: {total / MB:.1f} MiB read in {seconds:.1f} s, max throttle {max(throttles or [0])} ms")
    assert MB <= total and within_quota(total, seconds, MB), \
        f"{total / MB:.1f} MiB read in {seconds:.1f} s against a 1 MiB/s quota"
    assert throttles and max(throttles) > 0, throttles
    seq = [i for _, _, i in got]
    assert seq == list(range(len(seq))), "records skipped or repeated under throttling"


def test_a_backlog_larger_than_the_window_still_flows(make_broker):
    """Under a 100 KB/s consumer quota a consumer facing 2 MB over 4 partitions (one
    full fetch answer would be twice the window's allowance, throttled forever if it
    were taken back) reads every record: each fetch asks for at most a window's
    worth."""
    b = make_broker()
    create({"bootstrap.servers": b.addr}, "backlog", partitions=4)
    p = Producer({"bootstrap.servers": b.addr, "linger.ms": 20})
    for i in range(200):
        p.produce("backlog", b"z" * 10_000, partition=i % 4)
    assert p.flush(60) == 0
    quota(b.addr, "alter", "--entity-type", "clients", "--entity-name", "trickle",
          "--add-config", "consumer_byte_rate=102400")
    c = Consumer({"bootstrap.servers": b.addr, "group.id": "trickle", "client.id": "trickle",
                  "auto.offset.reset": "earliest"})
    c.subscribe(["backlog"])
    got = []

    def all_read():
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.offset())
        return len(got) >= 200
    try:
        wait_until(all_read, timeout=90, interval=0, what="200 records under a 100 KB/s quota")
    finally:
        c.close()


def test_request_percentage_throttles_a_busy_client(make_broker):
    """request_percentage=1 (10 ms of the shard's time a second) on user ANONYMOUS and
    client id `chatty`: a producer sending one record per request (linger.ms=0,
    acks=1) for a few seconds hears throttle_time_ms, and every record is still
    acknowledged."""
    b = make_broker()
    create({"bootstrap.servers": b.addr}, "chat")
    quota(b.addr, "alter", "--entity-type", "users", "--entity-name", "ANONYMOUS", "--entity-type", "clients",
          "--entity-name", "chatty", "--add-config", "request_percentage=1")
    throttles, acked = [], []
    p = Producer({"bootstrap.servers": b.addr, "client.id": "chatty", "linger.ms": 0, "acks": 1,
                  "max.in.flight.requests.per.connection": 1,
                  "throttle_cb": lambda ev: throttles.append(ev.throttle_time)})
    sent = 0

    def busy():
        nonlocal sent
        for _ in range(200):
            p.produce("chat", b"m", on_delivery=lambda e, m: acked.append(e))
            sent += 1
        p.poll(0.01)
        return throttles and max(throttles) > 0
    wait_until(busy, timeout=30, interval=0, what="a request_percentage throttle")
    assert p.flush(60) == 0
    assert len(acked) == sent and not any(acked)


def test_quota_requests_are_checked(make_broker):
    """Quotas Sluice does not enforce, and nonsense values, are refused with the
    reason; nothing is stored."""
    b = make_broker()
    for kv, why in (("controller_mutation_rate=50", "not enforced"), ("producer_byte_rate=-5", "positive"),
                    ("producer_byte_rate=abc", "number")):
        r = sluice("config", "alter", "--entity-type", "users", "--entity-name", "alice", "--add-config", kv,
                   "--bootstrap-server", b.addr)
        assert r.returncode != 0 and why in r.stderr, (kv, r.stderr)
    assert quota(b.addr, "describe", "--entity-type", "users", "--entity-name", "alice").strip() == ""
