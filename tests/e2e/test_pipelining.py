"""Tier: black-box over raw sockets. Requests on one connection pipeline; responses
leave in request order even when a later request finishes first."""
import struct
import uuid

from kafka_wire import (Conn, fetch_v4, frame, header, parse_fetch_v4, parse_produce_v3, produce_v3, record_batch,
                        string)


def test_responses_keep_request_order(broker):
    c = Conn(broker.addr, timeout=20)
    c.send(produce_v3("order", 0, record_batch([b"x"]), corr=1))
    c.recv()
    # A long-poll fetch (nothing past offset 1, so it waits) and a quick ApiVersions
    # behind it: the ApiVersions handler finishes first, but its response must wait
    # its turn. Requests on another connection are answered meanwhile, and this one
    # has nothing to read.
    c.send(fetch_v4("order", 0, 1, max_wait_ms=600_000, corr=2) + frame(header(18, 0, 3)))
    other = Conn(broker.addr, timeout=20)
    for corr in range(10, 15):
        other.send(frame(header(18, 0, corr)))
        assert other.recv()[0] == corr
    assert not c.pending(), "a response left ahead of the waiting fetch"
    # An append ends the fetch: then both responses come, in request order.
    other.send(produce_v3("order", 0, record_batch([b"y"]), corr=20))
    assert other.recv()[0] == 20
    corr, body = c.recv()
    [(_, _, err, hw, recs)] = parse_fetch_v4(body)
    assert corr == 2 and err == 0 and hw == 2 and b"y" in recs
    corr, body = c.recv()
    assert corr == 3 and struct.unpack(">h", body[:2])[0] == 0
    other.close()
    c.close()


def test_many_pipelined_produces(broker):
    c = Conn(broker.addr, timeout=30)
    n = 200
    c.send(b"".join(produce_v3("pipe", 0, record_batch([b"m%d" % i]), corr=100 + i) for i in range(n)))
    bases = []
    for i in range(n):
        corr, body = c.recv()
        assert corr == 100 + i
        [(_, _, err, base)] = parse_produce_v3(body)
        assert err == 0
        bases.append(base)
    assert bases == list(range(n)), "appended in request order"
    c.close()


def test_frames_of_every_size_and_split_read_whole(broker):
    """Frames split across the broker's receive buffer, larger than it, and sent a
    byte at a time are each read whole, in order."""
    c = Conn(broker.addr, timeout=30)
    big = produce_v3("split", 0, record_batch([b"b" * 100_000]), corr=2)
    small = [produce_v3("split", 0, record_batch([b"s%d" % i]), corr=10 + i) for i in range(3)]
    # A small frame, then one much larger than the buffer, then two small: one send.
    c.send(small[0] + big + small[1] + small[2])
    # And one byte at a time.
    for b in frame(header(18, 0, 20)):
        c.send(bytes([b]))
    answers = [c.recv() for _ in range(5)]
    assert [corr for corr, _ in answers] == [10, 2, 11, 12, 20]
    bases = [parse_produce_v3(body)[0][2:] for _, body in answers[:4]]
    assert bases == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert struct.unpack(">h", answers[4][1][:2])[0] == 0
    c.close()


def test_acks_zero_gets_no_response(broker):
    c = Conn(broker.addr, timeout=30)
    c.send(produce_v3("quiet", 0, record_batch([b"a"]), acks=0, corr=1) + frame(header(18, 0, 2)))
    corr, _ = c.recv()
    assert corr == 2, "the acks=0 produce is skipped in the response stream"
    c.send(produce_v3("quiet", 0, record_batch([b"b"]), acks=1, corr=3))
    corr, body = c.recv()
    assert corr == 3 and parse_produce_v3(body)[0][2:] == (0, 1), "the acks=0 record was stored at offset 0"
    c.close()


def produce_v3_topics(topics, acks=-1, corr=1, timeout_ms=10000):
    """A Produce v3 request to partition 0 of each (topic, records)."""
    body = header(0, 3, corr) + string(None) + struct.pack(">hi", acks, timeout_ms)
    body += struct.pack(">i", len(topics))
    for topic, records in topics:
        body += string(topic) + struct.pack(">iii", 1, 0, len(records)) + records
    return frame(body)


def test_waiting_produce_is_not_overtaken_by_the_next(broker):
    """A plain (non-idempotent) producer pipelining on one connection: a request that
    must wait before appending (it auto-creates a topic) still appends to the partition
    it shares with the next request first."""
    c = Conn(broker.addr, timeout=30)
    c.send(produce_v3("shared", 0, record_batch([b"first"]), corr=1))
    assert parse_produce_v3(c.recv()[1])[0][2:] == (0, 0)
    for round in range(3):
        fresh = "fresh-" + uuid.uuid4().hex[:8]
        c.send(produce_v3_topics([("shared", record_batch([b"slow%d" % round])), (fresh, record_batch([b"f"]))],
                                 corr=10 + 2 * round)
               + produce_v3("shared", 0, record_batch([b"quick%d" % round]), corr=11 + 2 * round))
        corr, body = c.recv()
        slow = dict(((t, p), (err, base)) for t, p, err, base in parse_produce_v3(body))
        assert corr == 10 + 2 * round and slow[(fresh, 0)][0] == 0, slow
        corr, body = c.recv()
        [(_, _, err, quick)] = parse_produce_v3(body)
        assert corr == 11 + 2 * round and err == 0
        assert slow[("shared", 0)] == (0, 1 + 2 * round), "the waiting request kept its place"
        assert quick == 2 + 2 * round
    c.close()
