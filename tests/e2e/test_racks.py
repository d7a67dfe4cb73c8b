"""Tier: black-box, real broker processes (cluster.py) with racks (issue 12, item 8).

Brokers started with --rack: the racks are in Metadata and DescribeCluster, replica
placement spreads every partition over as many racks as it has replicas (leaders spread
evenly), and fetch from follower (KIP-392) works end to end: the leader answers a Fetch
v11 naming the consumer's rack with an in-sync replica of that rack as
`preferred_read_replica`, the follower serves the records up to its high watermark
(and refuses a pre-v11 fetch, NOT_LEADER_OR_FOLLOWER), and a confluent-kafka consumer
with `client.rack` reads everything.
"""
import struct
import subprocess
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic

from cluster import Cluster, wait_until
from conftest import SLUICE_BIN, check_consumer_error, expected_log_errors
from kafka_wire import Conn, fetch_v4, frame, header, parse_fetch_v4, string

NOT_LEADER_OR_FOLLOWER = 6


def _racked_cluster(tmp_path, request, racks):
    c = Cluster(tmp_path / "cluster", n=len(racks))
    for i, rack in zip(c.ids, racks):
        c.brokers[i].extra += ["--rack", rack]
    c.start()
    try:
        yield c
    finally:
        c.stop(expected_log_errors(request))


@pytest.fixture
def three_racks(tmp_path, request):
    yield from _racked_cluster(tmp_path, request, ["a", "b", "c"])


@pytest.fixture
def two_racks(tmp_path, request):
    # Brokers 1 and 2 share rack "x": placement by id alone would pair them.
    yield from _racked_cluster(tmp_path, request, ["x", "x", "y"])


def _create(c, topic, partitions, rf):
    fs = c.admin().create_topics([NewTopic(topic, partitions, rf)], operation_timeout=30)
    fs[topic].result(timeout=60)
    wait_until(lambda: all(c.leader_of(topic, p) > 0 for p in range(partitions)), 30,
               f"{topic} has leaders")


def _assignments(c, topic, partitions):
    md = c.admin().list_topics(topic=topic, timeout=10)
    return {p: (md.topics[topic].partitions[p].leader, list(md.topics[topic].partitions[p].replicas))
            for p in range(partitions)}


def fetch_v11(topic, partition, offset, rack, max_wait_ms=100, min_bytes=1, corr=11):
    body = header(1, 11, corr)
    body += struct.pack(">iiiib", -1, max_wait_ms, min_bytes, 50 << 20, 0)
    body += struct.pack(">ii", 0, -1)  # no fetch session
    body += struct.pack(">i", 1) + string(topic) + struct.pack(">i", 1)
    body += struct.pack(">iiqqi", partition, -1, offset, -1, 1 << 20)
    body += struct.pack(">i", 0)  # forgotten topics
    body += string(rack)
    return frame(body)


def parse_fetch_v11(resp):
    """-> [(partition, error, high watermark, preferred read replica, records)]"""
    pos = 4 + 2 + 4  # throttle, error, session id
    (n_topics,) = struct.unpack_from(">i", resp, pos); pos += 4
    out = []
    for _ in range(n_topics):
        (ln,) = struct.unpack_from(">h", resp, pos); pos += 2 + ln
        (n_parts,) = struct.unpack_from(">i", resp, pos); pos += 4
        for _ in range(n_parts):
            p, err, hw, _lso, _start = struct.unpack_from(">ihqqq", resp, pos); pos += 30
            (n_aborted,) = struct.unpack_from(">i", resp, pos); pos += 4
            pos += max(n_aborted, 0) * 16
            (preferred,) = struct.unpack_from(">i", resp, pos); pos += 4
            (rl,) = struct.unpack_from(">i", resp, pos); pos += 4
            recs = resp[pos:pos + max(rl, 0)]; pos += max(rl, 0)
            out.append((p, err, hw, preferred, recs))
    return out


def record_count(records):
    """Records in a run of v2 batches (last offset delta + 1 each)."""
    n, pos = 0, 0
    while pos + 61 <= len(records):
        (ln,) = struct.unpack_from(">i", records, pos + 8)
        (delta,) = struct.unpack_from(">i", records, pos + 23)
        n += delta + 1
        pos += 12 + ln
    return n


def _ask(addr, request):
    conn = Conn(addr)
    try:
        conn.send(request)
        return conn.recv()[1]
    finally:
        conn.close()


def test_racks_are_listed_and_rf3_partitions_span_three_racks_with_leaders_spread(three_racks):
    c = three_racks
    d = c.admin().describe_cluster(request_timeout=10).result(timeout=15)
    assert {n.id: n.rack for n in d.nodes} == {1: "a", 2: "b", 3: "c"}
    md = c.admin().list_topics(timeout=10)
    assert {b.id for b in md.brokers.values()} == {1, 2, 3}

    _create(c, "spread", 6, 3)
    placed = _assignments(c, "spread", 6)
    rack = {1: "a", 2: "b", 3: "c"}
    for p, (leader, replicas) in placed.items():
        assert sorted(rack[r] for r in replicas) == ["a", "b", "c"], (p, replicas)
    assert Counter(leader for leader, _ in placed.values()) == {1: 2, 2: 2, 3: 2}, placed

    out = subprocess.run([SLUICE_BIN, "cluster", "describe", "--bootstrap-server", c.addr(1)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    listed = {int(t[0]): t[2] for t in rows if len(t) >= 4 and t[0].isdigit() and ":" in t[1]}
    assert listed == {1: "a", 2: "b", 3: "c"}, out.stdout


def test_two_racks_rf2_partitions_span_both(two_racks):
    c = two_racks
    _create(c, "pairs", 6, 2)
    rack = {1: "x", 2: "x", 3: "y"}
    placed = _assignments(c, "pairs", 6)
    for p, (_leader, replicas) in placed.items():
        assert sorted(rack[r] for r in replicas) == ["x", "y"], (p, replicas)
    # RF 1: leaders rotate over every broker.
    _create(c, "singles", 6, 1)
    assert Counter(l for l, _ in _assignments(c, "singles", 6).values()) == {1: 2, 2: 2, 3: 2}


def test_consumer_in_a_followers_rack_is_sent_to_it_and_reads_everything(three_racks):
    c = three_racks
    rack = {1: "a", 2: "b", 3: "c"}
    topic = f"near-{uuid.uuid4().hex[:6]}"
    _create(c, topic, 1, 3)
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5})
    n = 200
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=0)
    assert p.flush(30) == 0

    leader = c.leader_of(topic, 0)
    wait_until(lambda: c.isr_of(topic, 0) == [1, 2, 3], 30, "every replica in sync")
    follower = next(b for b in c.ids if b != leader)

    # The leader, asked by a consumer in the follower's rack: go there, no records.
    (p0,) = parse_fetch_v11(_ask(c.addr(leader), fetch_v11(topic, 0, 0, rack[follower])))
    assert p0[1] == 0 and p0[3] == follower and p0[4] == b"", p0
    # A consumer in the leader's own rack, or naming no rack, reads from the leader.
    for r in (rack[leader], ""):
        (own,) = parse_fetch_v11(_ask(c.addr(leader), fetch_v11(topic, 0, 0, r)))
        assert own[1] == 0 and own[3] == -1 and record_count(own[4]) > 0, own

    # The follower serves Fetch v11 up to its high watermark, which reaches every
    # record once the leader's next fetch response has told it.
    def follower_has_all():
        (f,) = parse_fetch_v11(_ask(c.addr(follower), fetch_v11(topic, 0, 0, rack[follower])))
        assert f[1] == 0 and f[3] == -1, f
        got = record_count(f[4])
        assert got <= f[2], f"records past the follower's high watermark {f[2]}"
        return f[2] == n and got == n
    wait_until(follower_has_all, 30, "the follower serves every record")
    # Past its log end: OFFSET_OUT_OF_RANGE (the consumer goes back to the leader).
    (oor,) = parse_fetch_v11(_ask(c.addr(follower), fetch_v11(topic, 0, n + 5, "b")))
    assert oor[1] == 1, oor
    # A pre-KIP-392 consumer (Fetch v4) still needs the leader.
    (_, _, err, _, _), = parse_fetch_v4(_ask(c.addr(follower), fetch_v4(topic, 0, 0)))
    assert err == NOT_LEADER_OR_FOLLOWER

    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"g-{topic}",
                         "client.rack": rack[follower], "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        seen = []
        def read_all():
            m = consumer.poll(0.5)
            if m is not None and not (m.error() and check_consumer_error(m.error())):
                seen.append(m.value().decode())
            return len(seen) >= n
        wait_until(read_all, 60, f"{n} records consumed with client.rack={rack[follower]}")
        assert seen == [f"v{i}" for i in range(n)]
    finally:
        consumer.close()
