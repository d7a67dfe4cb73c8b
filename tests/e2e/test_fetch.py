"""Tier: black-box over raw sockets. Fetch long-poll and byte limits."""
from kafka_wire import Conn, batch_count, fetch_v4, parse_fetch_v4, produce_v3, record_batch


def produce(addr, topic, values):
    c = Conn(addr)
    c.send(produce_v3(topic, 0, record_batch(values)))
    c.recv()
    c.close()


def test_long_poll_waits_for_data_then_returns_early(broker):
    produce(broker.addr, "lp", [b"first"])
    # The broker caps max_wait_ms at 30 s; this connection gives up after 20 s, so an
    # answer that waited for the cap instead of coming on its event fails the test.
    c = Conn(broker.addr, timeout=20)
    # Nothing past offset 1 yet: the long poll ends at max_wait_ms, empty.
    c.send(fetch_v4("lp", 0, 1, max_wait_ms=300))
    _, body = c.recv()
    [(_, _, err, hw, recs)] = parse_fetch_v4(body)
    assert (err, hw, recs) == (0, 1, b"")
    # min_bytes=0: answered at once, whatever max_wait_ms says.
    c.send(fetch_v4("lp", 0, 1, max_wait_ms=600_000, min_bytes=0, corr=5))
    corr, body = c.recv()
    assert corr == 5 and parse_fetch_v4(body)[0][2:] == (0, 1, b"")
    # With min_bytes=1 and no data it is not answered: requests on another connection,
    # sent after it, are answered while it still waits...
    c.send(fetch_v4("lp", 0, 1, max_wait_ms=600_000, corr=2))
    other = Conn(broker.addr)
    for corr in range(10, 15):
        other.send(fetch_v4("lp", 0, 1, max_wait_ms=0, corr=corr))
        assert other.recv()[0] == corr
    assert not c.pending(), "a long poll with no data was answered before max_wait_ms"
    other.close()
    # ...and an append answers it, with the new record.
    produce(broker.addr, "lp", [b"second"])
    corr, body = c.recv()
    [(_, _, err, hw, recs)] = parse_fetch_v4(body)
    assert corr == 2 and err == 0 and hw == 2 and b"second" in recs
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
    # A response limit of 0 is not "no limit": one batch, as Kafka answers (KIP-74).
    c.send(fetch_v4("mb", 0, 5, max_wait_ms=0, max_bytes=0, corr=4))
    _, body = c.recv()
    [(_, _, err, _, recs)] = parse_fetch_v4(body)
    assert err == 0 and batch_count(recs) == 1 and b"F" * 1000 in recs
    # Out of range.
    c.send(fetch_v4("mb", 0, 99, max_wait_ms=0, corr=3))
    _, body = c.recv()
    assert parse_fetch_v4(body)[0][2] == 1, "OFFSET_OUT_OF_RANGE"
    c.close()
