"""Tier: black-box over raw sockets. Fetch long-poll and byte limits."""
import time

from kafka_wire import Conn, batch_count, fetch_v4, parse_fetch_v4, produce_v3, record_batch


def produce(addr, topic, values):
    c = Conn(addr)
    c.send(produce_v3(topic, 0, record_batch(values)))
    c.recv()
    c.close()


def test_long_poll_waits_for_data_then_returns_early(broker):
    produce(broker.addr, "lp", [b"first"])
    c = Conn(broker.addr, timeout=30)
    # Nothing past offset 1 yet: an empty partition answers after max_wait_ms.
    t0 = time.monotonic()
    c.send(fetch_v4("lp", 0, 1, max_wait_ms=300))
    _, body = c.recv()
    waited = time.monotonic() - t0
    [(_, _, err, hw, recs)] = parse_fetch_v4(body)
    assert (err, hw, recs) == (0, 1, b"") and waited >= 0.25
    # min_bytes=0: answer at once, whatever max_wait_ms says.
    t0 = time.monotonic()
    c.send(fetch_v4("lp", 0, 1, max_wait_ms=20000, min_bytes=0, corr=5))
    _, body = c.recv()
    assert parse_fetch_v4(body)[0][2] == 0 and time.monotonic() - t0 < 10
    # A long wait is cut short by an append.
    t0 = time.monotonic()
    c.send(fetch_v4("lp", 0, 1, max_wait_ms=20000, corr=2))
    produce(broker.addr, "lp", [b"second"])
    _, body = c.recv()
    [(_, _, err, hw, recs)] = parse_fetch_v4(body)
    assert err == 0 and hw == 2 and b"second" in recs
    assert time.monotonic() - t0 < 15, "answered on the append, not at max_wait_ms"
    c.close()


def test_max_bytes_limits_and_at_least_one_batch(broker):
    for i in range(10):
        produce(broker.addr, "mb", [bytes([65 + i]) * 1000])
    c = Conn(broker.addr)
    c.send(fetch_v4("mb", 0, 0, max_wait_ms=0, max_bytes=2500))
    _, body = c.recv()
    [(_, _, err, hw, recs)] = parse_fetch_v4(body)
    assert err == 0 and hw == 10 and 1 <= batch_count(recs) <= 2 and len(recs) <= 2500
    # A limit below one batch still returns one whole batch.
    c.send(fetch_v4("mb", 0, 3, max_wait_ms=0, partition_max_bytes=10, corr=2))
    _, body = c.recv()
    [(_, _, err, _, recs)] = parse_fetch_v4(body)
    assert err == 0 and batch_count(recs) == 1 and b"D" * 1000 in recs
    # Out of range.
    c.send(fetch_v4("mb", 0, 99, max_wait_ms=0, corr=3))
    _, body = c.recv()
    assert parse_fetch_v4(body)[0][2] == 1, "OFFSET_OUT_OF_RANGE"
    c.close()
