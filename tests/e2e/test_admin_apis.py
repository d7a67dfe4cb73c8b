"""Admin APIs current Kafka tooling calls (issue 12 item 9), checked at the wire level:
librdkafka 2.16 has no DescribeProducers or DescribeTopicPartitions call, so the
requests are built by hand here (flexible versions: compact strings and arrays, tagged
fields) and the answers compared with what Kafka 3.9 answers."""
import os
import struct
import time

import pytest

from conftest import wait_until
from kafka_wire import (Conn, api_versions_v0, frame, header, uvarint, init_producer_id, parse_produce_v3, produce_v3,
                        record_batch, string)
from test_confluent import create_topic


# ---- flexible-version encoding (KIP-482) ----

def cstring(s):
    if s is None:
        return uvarint(0)
    b = s.encode()
    return uvarint(len(b) + 1) + b


def carray(items):
    return uvarint(len(items) + 1) + b"".join(items)


NO_TAGS = b"\x00"


def flexible_request(api_key, version, corr, body):
    """Request header v2 (client id as a plain nullable string, then tagged fields)."""
    return frame(struct.pack(">hhi", api_key, version, corr) + string("e2e") + NO_TAGS + body)


class Reader:
    def __init__(self, data):
        self.d, self.pos = data, 0

    def take(self, fmt):
        vals = struct.unpack_from(">" + fmt, self.d, self.pos)
        self.pos += struct.calcsize(">" + fmt)
        return vals if len(vals) > 1 else vals[0]

    def uvarint(self):
        shift = out = 0
        while True:
            b = self.d[self.pos]
            self.pos += 1
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7

    def cstring(self):
        n = self.uvarint()
        if n == 0:
            return None
        s = self.d[self.pos:self.pos + n - 1].decode()
        self.pos += n - 1
        return s

    def carray(self, item):
        n = self.uvarint()
        return None if n == 0 else [item(self) for _ in range(n - 1)]

    def tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def call(addr, request):
    """Sends one request (framed) on a connection of its own; returns the response body
    (after the correlation id)."""
    conn = Conn(addr)
    try:
        conn.send(request)
        _, resp = conn.recv()
    finally:
        conn.close()
    return resp


def call_flexible(addr, api_key, version, body, corr=5):
    """Sends one flexible request; returns a Reader positioned after the v1 response
    header."""
    conn = Conn(addr)
    try:
        conn.send(flexible_request(api_key, version, corr, body))
        c, data = conn.recv()
    finally:
        conn.close()
    assert c == corr
    r = Reader(data)
    r.tags()
    return r


# ---- DescribeProducers (61) ----

def describe_producers(addr, topic, partitions):
    body = carray([cstring(topic) + carray([struct.pack(">i", p) for p in partitions]) + NO_TAGS])
    r = call_flexible(addr, 61, 0, body + NO_TAGS)
    r.take("i")  # throttle

    def producer(r):
        pid, epoch, last_seq, last_ts, coord_epoch, txn_start = r.take("qiiqiq")
        r.tags()
        return {"producer_id": pid, "epoch": epoch, "last_sequence": last_seq,
                "last_timestamp": last_ts, "coordinator_epoch": coord_epoch,
                "txn_start_offset": txn_start}

    def partition(r):
        index, err = r.take("ih")
        r.cstring()
        producers = r.carray(producer)
        r.tags()
        return index, err, producers

    def topic_(r):
        name = r.cstring()
        parts = r.carray(partition)
        r.tags()
        return name, parts

    [(name, parts)] = r.carray(topic_)
    assert name == topic
    return {index: (err, producers) for index, err, producers in parts}


def add_partitions_to_txn_v0(addr, txn_id, pid, epoch, topic, partition):
    body = struct.pack(">hhi", 24, 0, 3) + string("e2e") + string(txn_id)
    body += struct.pack(">qh", pid, epoch) + struct.pack(">i", 1) + string(topic)
    body += struct.pack(">ii", 1, partition)
    data = call(addr, frame(body))
    # throttle, [topic, [partition, error]]: one topic, one partition.
    (ln,) = struct.unpack_from(">h", data, 8)
    _p, err = struct.unpack_from(">ih", data, 10 + ln + 4)
    return err


def end_txn_v0(addr, txn_id, pid, epoch, commit):
    body = struct.pack(">hhi", 26, 0, 4) + string("e2e") + string(txn_id)
    body += struct.pack(">qhb", pid, epoch, 1 if commit else 0)
    data = call(addr, frame(body))
    return struct.unpack_from(">ih", data, 0)[1]


def produce(addr, topic, partition, batch, transactional_id=None):
    body = call(addr, produce_v3(topic, partition, batch, transactional_id=transactional_id))
    [(_, _, err, base)] = parse_produce_v3(body)
    assert err == 0, f"produce error {err}"
    return base


def test_describe_producers_shows_idempotent_and_transactional_producers(broker):
    """After an idempotent producer wrote two batches and a transactional one opened a
    transaction, DescribeProducers lists both with the ids and epochs InitProducerId
    gave them, the last sequence, and the open transaction's first offset; once the
    transaction commits its start offset is -1 and the marker's coordinator epoch shows."""
    addr = broker.addr
    create_topic(addr, "dp", 2)
    idem_pid, idem_epoch = init_producer_id(addr)
    before_ms = int(time.time() * 1000) - 1000
    produce(addr, "dp", 0, record_batch([b"a", b"b", b"c"], producer_id=idem_pid,
                                        producer_epoch=idem_epoch, base_sequence=0))
    produce(addr, "dp", 0, record_batch([b"d", b"e"], producer_id=idem_pid,
                                        producer_epoch=idem_epoch, base_sequence=3))
    txn_pid, txn_epoch = init_producer_id(addr, transactional_id="dp-txn")
    assert add_partitions_to_txn_v0(addr, "dp-txn", txn_pid, txn_epoch, "dp", 0) == 0
    txn_base = produce(addr, "dp", 0, record_batch([b"t1", b"t2"], producer_id=txn_pid,
                                                    producer_epoch=txn_epoch, base_sequence=0,
                                                    transactional=True),
                       transactional_id="dp-txn")
    assert txn_base == 5

    parts = describe_producers(addr, "dp", [0, 1, 7])
    err, producers = parts[0]
    assert err == 0
    by_id = {p["producer_id"]: p for p in producers}
    assert set(by_id) == {idem_pid, txn_pid}
    idem, txn = by_id[idem_pid], by_id[txn_pid]
    assert (idem["epoch"], idem["last_sequence"], idem["txn_start_offset"]) == (idem_epoch, 4, -1)
    assert (txn["epoch"], txn["last_sequence"], txn["txn_start_offset"]) == (txn_epoch, 1, txn_base)
    assert idem["coordinator_epoch"] == txn["coordinator_epoch"] == -1
    assert all(p["last_timestamp"] >= before_ms for p in producers)
    assert parts[1] == (0, []), "a partition nobody wrote to has no producers"
    assert parts[7][0] == 3, "a partition beyond the topic's: UNKNOWN_TOPIC_OR_PARTITION"
    assert describe_producers(addr, "no-such-topic", [0])[0][0] == 3

    assert end_txn_v0(addr, "dp-txn", txn_pid, txn_epoch, commit=True) == 0

    def committed():
        [p] = [p for p in describe_producers(addr, "dp", [0])[0][1] if p["producer_id"] == txn_pid]
        return p if p["txn_start_offset"] == -1 else None

    done = wait_until(committed, what="the commit marker on dp-0")
    assert done["epoch"] == txn_epoch and done["coordinator_epoch"] >= 0

    # The transaction state topic now exists: internal, as Kafka flags it, in Metadata
    # (confluent-kafka's describe_topics) and in DescribeTopicPartitions.
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": addr})
    futs = admin.describe_topics(TopicCollection(["__transaction_state", "dp"]))
    assert futs["__transaction_state"].result(timeout=30).is_internal
    assert not futs["dp"].result(timeout=30).is_internal
    [t] = describe_topic_partitions(addr, ["__transaction_state"], 1)[0]
    assert t[0] == 0 and t[3] is True


# ---- DescribeTopicPartitions (75, KIP-966) ----

TOPIC_ALL_OPERATIONS = 3576  # what Kafka 3.9 returns without an authorizer


def describe_topic_partitions(addr, topics, limit, cursor=None):
    """-> ([(error, name, topic id, is internal, [partition dict], authorized ops)],
    next cursor or None)"""
    body = carray([cstring(t) + NO_TAGS for t in topics]) + struct.pack(">i", limit)
    if cursor is None:
        body += struct.pack(">b", -1)
    else:
        body += struct.pack(">b", 1) + cstring(cursor[0]) + struct.pack(">i", cursor[1]) + NO_TAGS
    r = call_flexible(addr, 75, 0, body + NO_TAGS)
    r.take("i")  # throttle

    def ints(r):
        return r.take("i")

    def partition(r):
        err, index, leader, epoch = r.take("hiii")
        p = {"error": err, "index": index, "leader": leader, "leader_epoch": epoch,
             "replicas": r.carray(ints), "isr": r.carray(ints), "elr": r.carray(ints),
             "last_known_elr": r.carray(ints), "offline": r.carray(ints)}
        r.tags()
        return p

    def topic(r):
        err = r.take("h")
        name = r.cstring()
        topic_id = r.d[r.pos:r.pos + 16]
        r.pos += 16
        internal = r.take("b")
        parts = r.carray(partition)
        ops = r.take("i")
        r.tags()
        return err, name, topic_id, bool(internal), parts, ops

    topics_out = r.carray(topic)
    next_cursor = None
    if r.take("b") == 1:
        name = r.cstring()
        next_cursor = (name, r.take("i"))
        r.tags()
    return topics_out, next_cursor


def test_describe_topic_partitions_pages_with_a_cursor(broker):
    """Three topics (3, 2 and 1 partitions) paged two partitions at a time: each page
    ends with the cursor at the first partition left out, the last page has none, and
    every partition comes exactly once, with its leader, replicas, ISR, empty ELR lists
    and the full set of topic operations (no authorizer)."""
    addr = broker.addr
    for name, n in (("dtp-a", 3), ("dtp-b", 2), ("dtp-c", 1)):
        create_topic(addr, name, n)
    named = ["dtp-c", "dtp-a", "dtp-b"]

    pages, cursor = [], None
    while True:
        topics, cursor = describe_topic_partitions(addr, named, 2, cursor)
        pages.append(([(t[1], [p["index"] for p in t[4]]) for t in topics], cursor))
        if cursor is None:
            break
        assert len(pages) < 10
    assert pages == [
        ([("dtp-a", [0, 1])], ("dtp-a", 2)),
        ([("dtp-a", [2]), ("dtp-b", [0])], ("dtp-b", 1)),
        ([("dtp-b", [1]), ("dtp-c", [0])], None),
    ]

    topics, cursor = describe_topic_partitions(addr, named, 100)
    assert cursor is None
    for err, name, topic_id, internal, parts, ops in topics:
        assert (err, internal, ops) == (0, False, TOPIC_ALL_OPERATIONS), name
        assert topic_id != bytes(16)
        for p in parts:
            assert p["error"] == 0 and p["leader"] >= 0
            assert p["replicas"] == p["isr"] == [p["leader"]]
            assert p["elr"] == [] and p["last_known_elr"] == [] and p["offline"] == []
            assert p["leader_epoch"] >= 0

    # No topics named: every topic, in name order, resumable from a cursor.
    everything, cursor = describe_topic_partitions(addr, [], 1000)
    names = [t[1] for t in everything]
    assert cursor is None and names == sorted(names)
    assert {"dtp-a", "dtp-b", "dtp-c"} <= set(names)
    rest, _ = describe_topic_partitions(addr, [], 1000, ("dtp-b", 1))
    assert [(t[1], [p["index"] for p in t[4]]) for t in rest][:2] == [("dtp-b", [1]), ("dtp-c", [0])]

    # Unknown and illegal names, and a cursor outside the named topics.
    topics, _ = describe_topic_partitions(addr, ["dtp-a", "no-such", "bad/name"], 10)
    assert [(t[1], t[0]) for t in topics] == [("bad/name", 17), ("dtp-a", 0), ("no-such", 3)]
    topics, cursor = describe_topic_partitions(addr, ["dtp-a"], 10, ("dtp-b", 0))
    assert [(t[1], t[0]) for t in topics] == [("dtp-a", 42)] and cursor is None


# ---- AlterReplicaLogDirs (34) ----

def describe_log_dir(addr, version=1):
    """The broker's (first) log directory from DescribeLogDirs v0 or v1 (the same
    layout)."""
    data = call(addr, frame(struct.pack(">hhi", 35, version, 8) + string("e2e") + struct.pack(">i", -1)))
    (ln,) = struct.unpack_from(">h", data, 10)
    return data[12:12 + ln].decode()


def alter_replica_log_dirs_v1(addr, moves, version=1):
    """moves: [(path, topic, partition)] -> {(topic, partition): error}; v0 has v1's
    layout."""
    body = struct.pack(">hhi", 34, version, 9) + string("e2e") + struct.pack(">i", len(moves))
    for path, topic, p in moves:
        body += string(path) + struct.pack(">i", 1) + string(topic) + struct.pack(">ii", 1, p)
    data = call(addr, frame(body))
    pos = 4
    (n,) = struct.unpack_from(">i", data, pos); pos += 4
    out = {}
    for _ in range(n):
        (ln,) = struct.unpack_from(">h", data, pos); pos += 2
        topic = data[pos:pos + ln].decode(); pos += ln
        (np,) = struct.unpack_from(">i", data, pos); pos += 4
        for _ in range(np):
            p, err = struct.unpack_from(">ih", data, pos); pos += 6
            out[(topic, p)] = err
    return out


def test_alter_replica_log_dirs_answers_as_kafka(broker):
    """One data directory: moving a replica to it is a no-op (NONE); another directory
    is LOG_DIR_NOT_FOUND; a partition the cluster does not have is
    UNKNOWN_TOPIC_OR_PARTITION; a topic name too long for Kafka's future-log directory
    name is INVALID_TOPIC_EXCEPTION. v0 and v2 (flexible) answer the same."""
    addr = broker.addr
    create_topic(addr, "ard", 2)
    here = describe_log_dir(addr)
    assert here.startswith("/")
    long_name = "x" * 240
    got = alter_replica_log_dirs_v1(addr, [
        (here, "ard", 0), (here, "ard", 1), ("/no/such/dir", "ard", 0),
        (here, "no-such-topic", 0), (here, "ard", 9), (here, long_name, 0),
    ])
    # ("ard", 0) is named twice: the last destination counts, as Kafka's map.
    assert got == {("ard", 0): 57, ("ard", 1): 0, ("no-such-topic", 0): 3, ("ard", 9): 3,
                   (long_name, 0): 17}
    # v0 of both (Kafka 3.9 serves it; the same layout as v1).
    assert describe_log_dir(addr, version=0) == here
    assert alter_replica_log_dirs_v1(addr, [(here, "ard", 1), ("/elsewhere", "ard", 0)],
                                     version=0) == {("ard", 1): 0, ("ard", 0): 57}

    body = carray([cstring(here) + carray([cstring("ard") + carray([struct.pack(">i", 1)]) + NO_TAGS])
                   + NO_TAGS]) + NO_TAGS
    r = call_flexible(addr, 34, 2, body)
    r.take("i")

    def part(r):
        v = r.take("ih")
        r.tags()
        return v

    def topic(r):
        name = r.cstring()
        parts = r.carray(part)
        r.tags()
        return name, parts

    assert r.carray(topic) == [("ard", [(1, 0)])]


# ---- OffsetForLeaderEpoch (23) from a consumer ----

def offset_for_leader_epoch_v3(addr, topic, partitions, replica_id=-1):
    """partitions: [(partition, current leader epoch, epoch asked)] ->
    {partition: (error, leader epoch, end offset)}"""
    body = struct.pack(">hhi", 23, 3, 11) + string("e2e") + struct.pack(">i", replica_id)
    body += struct.pack(">i", 1) + string(topic) + struct.pack(">i", len(partitions))
    for p, current, epoch in partitions:
        body += struct.pack(">iii", p, current, epoch)
    data = call(addr, frame(body))
    pos = 4
    (n,) = struct.unpack_from(">i", data, pos); pos += 4
    assert n == 1
    (ln,) = struct.unpack_from(">h", data, pos); pos += 2 + ln
    (np,) = struct.unpack_from(">i", data, pos); pos += 4
    out = {}
    for _ in range(np):
        err, p, epoch, end = struct.unpack_from(">hiiq", data, pos); pos += 18
        out[p] = (err, epoch, end)
    return out


def batch_leader_epoch(addr, topic, partition, offset):
    """The partition leader epoch stamped on the batch holding `offset`."""
    from kafka_wire import fetch_v4, parse_fetch_v4
    body = call(addr, fetch_v4(topic, partition, offset))
    [(_, _, err, _hw, recs)] = parse_fetch_v4(body)
    assert err == 0 and len(recs) >= 16
    return struct.unpack_from(">i", recs, 12)[0]


def test_offset_for_leader_epoch_from_a_consumer(make_broker, tmp_path):
    """KIP-320 as a consumer sends it (replica id -1): the leader answers the end offset
    of the epoch asked — the log end for its current epoch, the start of the next epoch
    for an older one — and fences a stale current_leader_epoch (FENCED_LEADER_EPOCH) and
    one from the future (UNKNOWN_LEADER_EPOCH); an unknown epoch or -1 is undefined
    (-1, -1); unknown partitions are UNKNOWN_TOPIC_OR_PARTITION. v0-v1 (Kafka 3.9 still
    serves them) and v4 (flexible) answer the same."""
    broker = make_broker(data_dir=tmp_path / "ofle")
    addr = broker.addr
    create_topic(addr, "ofle", 1)
    produce(addr, "ofle", 0, record_batch([b"a", b"b", b"c"]))
    first = batch_leader_epoch(addr, "ofle", 0, 0)
    assert offset_for_leader_epoch_v3(addr, "ofle", [(0, first, first)]) == {0: (0, first, 3)}

    # A restart elects the broker leader again in a new epoch.
    broker.stop()
    broker.start()
    wait_until(lambda: offset_for_leader_epoch_v3(addr, "ofle", [(0, -1, first)])[0][0] == 0,
               what="ofle-0 led again")
    produce(addr, "ofle", 0, record_batch([b"d", b"e"]))
    now = batch_leader_epoch(addr, "ofle", 0, 3)
    assert now > first
    got = offset_for_leader_epoch_v3(addr, "ofle", [(0, now, now)])
    assert got == {0: (0, now, 5)}, "current epoch: the log end"
    got = offset_for_leader_epoch_v3(addr, "ofle", [(0, now, first)])
    assert got == {0: (0, first, 3)}, "older epoch: where the next epoch starts"
    assert offset_for_leader_epoch_v3(addr, "ofle", [(0, -1, first)]) == {0: (0, first, 3)}
    assert offset_for_leader_epoch_v3(addr, "ofle", [(0, now - 1, now)])[0][0] == 74
    assert offset_for_leader_epoch_v3(addr, "ofle", [(0, now + 1, now)])[0][0] == 75
    assert offset_for_leader_epoch_v3(addr, "ofle", [(0, now, now + 5)]) == {0: (0, -1, -1)}
    assert offset_for_leader_epoch_v3(addr, "ofle", [(0, now, -1)]) == {0: (0, -1, -1)}
    assert offset_for_leader_epoch_v3(addr, "ofle", [(3, -1, now)]) == {3: (3, -1, -1)}
    assert offset_for_leader_epoch_v3(addr, "nope", [(0, -1, 0)]) == {0: (3, -1, -1)}

    # v0-v1 (no current leader epoch; v0 answers no epoch, neither has a throttle time).
    for version in (0, 1):
        body = struct.pack(">hhi", 23, version, 12) + string("e2e")
        body += struct.pack(">i", 1) + string("ofle") + struct.pack(">iii", 1, 0, first)
        conn = Conn(addr)
        try:
            conn.send(frame(body))
            _, data = conn.recv()
        finally:
            conn.close()
        n_topics, ln = struct.unpack_from(">ih", data, 0)
        assert (n_topics, data[6:6 + ln]) == (1, b"ofle")
        pos = 6 + ln
        if version == 0:
            n, err, p, end = struct.unpack_from(">ihiq", data, pos)
            assert (n, err, p, end) == (1, 0, 0, 3) and len(data) == pos + 18
        else:
            n, err, p, epoch, end = struct.unpack_from(">ihiiq", data, pos)
            assert (n, err, p, epoch, end) == (1, 0, 0, first, 3) and len(data) == pos + 22

    # v4: flexible, same answer.
    body = struct.pack(">i", -1) + carray([cstring("ofle") + carray(
        [struct.pack(">iii", 0, now, first) + NO_TAGS]) + NO_TAGS]) + NO_TAGS
    r = call_flexible(addr, 23, 4, body)
    r.take("i")

    def part(r):
        v = r.take("hiiq")
        r.tags()
        return v

    def topic(r):
        name = r.cstring()
        parts = r.carray(part)
        r.tags()
        return name, parts

    assert r.carray(topic) == [("ofle", [(0, 0, first, 3)])]


# ---- the same APIs across a cluster ----

@pytest.fixture
def cluster(tmp_path, request):
    from test_cluster import _make_cluster
    yield from _make_cluster(tmp_path, request, proxied=False)


def test_partition_apis_on_leader_follower_and_non_replica(cluster):
    """A partition with two replicas in a three-broker cluster, asked of each broker:
    DescribeProducers is answered by both replicas with the same producer (Kafka lets
    any replica holding the log answer) and NOT_LEADER_OR_FOLLOWER by the third;
    OffsetForLeaderEpoch from a consumer only by the leader (NOT_LEADER_OR_FOLLOWER
    elsewhere, as Kafka); AlterReplicaLogDirs to a broker's own directory is NONE where
    a replica lives and REPLICA_NOT_AVAILABLE where none does."""
    topic = "spread2"
    cluster.create_topic(topic, partitions=1, rf=2)
    leader = cluster.leader_of(topic, 0)
    replicas = cluster.replicas_of(topic, 0)
    [follower] = [r for r in replicas if r != leader]
    [outsider] = [i for i in cluster.ids if i not in replicas]
    pid, epoch = init_producer_id(cluster.addr(leader))
    produce(cluster.addr(leader), topic, 0,
            record_batch([b"x", b"y"], producer_id=pid, producer_epoch=epoch, base_sequence=0))

    def producers_on(i):
        err, producers = describe_producers(cluster.addr(i), topic, [0])[0]
        return err, [(p["producer_id"], p["epoch"], p["last_sequence"]) for p in producers]

    assert producers_on(leader) == (0, [(pid, epoch, 1)])
    wait_until(lambda: producers_on(follower) == (0, [(pid, epoch, 1)]),
               what="the follower's copy of the producer state")
    assert producers_on(outsider) == (6, [])

    leader_epoch = batch_leader_epoch(cluster.addr(leader), topic, 0, 0)
    for i in cluster.ids:
        got = offset_for_leader_epoch_v3(cluster.addr(i), topic, [(0, leader_epoch, leader_epoch)])
        if i == leader:
            assert got == {0: (0, leader_epoch, 2)}
        else:
            assert got == {0: (6, -1, -1)}, f"broker {i}"

    for i in cluster.ids:
        here = describe_log_dir(cluster.addr(i))
        got = alter_replica_log_dirs_v1(cluster.addr(i), [(here, topic, 0)])
        assert got == {(topic, 0): 9 if i == outsider else 0}, f"broker {i}"


@pytest.mark.broker_log_errors(r"partition offline after an I/O error")
def test_partition_apis_on_a_partition_offline_after_an_io_error(make_broker, tmp_path):
    """A partition taken offline by an I/O error is a KAFKA_STORAGE_ERROR for
    DescribeProducers, OffsetForLeaderEpoch and AlterReplicaLogDirs (Kafka answers an
    offline replica so), while the other partition answers as usual."""
    rules = tmp_path / "faults"
    b = make_broker(extra=["--fault-rules", str(rules)])
    addr = b.addr
    create_topic(addr, "off", 2)
    for p in (0, 1):
        produce(addr, "off", p, record_batch([b"a"]))
    tmp = f"{rules}.tmp"
    with open(tmp, "w") as f:
        # Reads and opens fail too, so the broker's reopen attempts keep it offline.
        f.write("write eio off-0/\nopen eio off-0/\nread eio off-0/\n")
    os.replace(tmp, rules)

    wait_until(lambda: any("storage fault rules armed" in ln and "off-0/" in ln
                           for ln in b.read_log().splitlines()),
               timeout=10, what="the fault rules armed")
    # One more append: refused at once when it writes off-0's file itself (the shard
    # journal off), or acknowledged through the journal (the default for a batch this
    # small) and failing when off-0's segment file is written behind it, within about
    # a second.
    conn = Conn(addr)
    try:
        conn.send(produce_v3("off", 0, record_batch([b"b"])))
        [(_, _, err, _)] = parse_produce_v3(conn.recv()[1])
    finally:
        conn.close()
    assert err in (0, 56), err
    wait_until(lambda: describe_producers(addr, "off", [0])[0][0] == 56, timeout=10,
               what="off-0 offline")

    parts = describe_producers(addr, "off", [0, 1])
    assert parts[0][0] == 56 and parts[1] == (0, [])
    got = offset_for_leader_epoch_v3(addr, "off", [(0, -1, 0), (1, -1, 0)])
    assert got[0] == (56, -1, -1) and got[1][0] == 0
    here = describe_log_dir(addr)
    assert alter_replica_log_dirs_v1(addr, [(here, "off", 0), (here, "off", 1)]) == {
        ("off", 0): 56, ("off", 1): 0}


# --- broker configs (issue 12, item 2's broker half) ----------------------------------------

def _describe(admin, kind, name, **kw):
    from confluent_kafka.admin import ConfigResource
    r = ConfigResource(kind, name)
    return admin.describe_configs([r], **kw)[r].result(timeout=30)


def test_broker_configs_are_described_and_dynamic_defaults_change_topics_and_survive_restart(make_broker):
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource,
                                       ConfigSource, ResourceType)
    b = make_broker(extra=["--rack", "zone-a", "--default-partitions", "2"])
    admin = create_topic(b.addr, "dyn", 1)
    cfg = _describe(admin, ResourceType.BROKER, "1")
    src = lambda e: ConfigSource(e.source)
    assert (cfg["broker.rack"].value, src(cfg["broker.rack"])) == ("zone-a", ConfigSource.STATIC_BROKER_CONFIG)
    assert (cfg["num.partitions"].value, src(cfg["num.partitions"])) == ("2", ConfigSource.STATIC_BROKER_CONFIG)
    assert src(cfg["auto.create.topics.enable"]) == ConfigSource.DEFAULT_CONFIG
    assert cfg["auto.create.topics.enable"].is_read_only
    assert cfg["broker.id"].value == "1"
    assert cfg["log.dirs"].value == str(b.data_dir)
    for name in ("log.retention.hours", "log.retention.ms", "log.retention.bytes", "log.segment.bytes",
                 "default.replication.factor", "min.insync.replicas", "unclean.leader.election.enable",
                 "message.max.bytes", "log.cleanup.policy", "compression.type",
                 "offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                 "listeners"):
        assert name in cfg, name
    assert (cfg["log.retention.ms"].value, src(cfg["log.retention.ms"])) == ("604800000", ConfigSource.DEFAULT_CONFIG)
    assert not cfg["log.retention.ms"].is_read_only
    assert cfg["unclean.leader.election.enable"].value == "false"

    # A cluster-wide dynamic default (the empty broker name, which librdkafka does not
    # send: a raw request): the topic's effective value and source follow it.
    assert incremental_alter_broker_v0(b.addr, "", [("log.retention.ms", "3600000"),
                                                    ("message.max.bytes", "2000")]) == 0

    def topic_follows():
        t = _describe(admin, ResourceType.TOPIC, "dyn")
        r = t["retention.ms"]
        return (r.value, src(r)) == ("3600000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG) and r
    r = wait_until(topic_follows, 20, what="retention.ms follows the cluster default")
    assert "log.retention.ms" in r.synonyms, r.synonyms
    cfg = _describe(admin, ResourceType.BROKER, "1")
    assert src(cfg["log.retention.ms"]) == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG

    # Honoured: a batch over the new default max.message.bytes is refused.
    def produce_big():
        errors = []
        p = Producer({"bootstrap.servers": b.addr, "acks": "all", "enable.idempotence": False})
        p.produce("dyn", value=b"x" * 5000, on_delivery=lambda err, _m: errors.append(err))
        assert p.flush(30) == 0
        return errors[0]
    from confluent_kafka import KafkaError
    assert produce_big().code() == KafkaError.MSG_SIZE_TOO_LARGE

    # A read-only config is refused; nothing changes.
    ro = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("broker.id", "7", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as e:
        admin.incremental_alter_configs([ro])[ro].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.INVALID_REQUEST
    bad = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("log.retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as e:
        admin.incremental_alter_configs([bad])[bad].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
    # A config named twice in one resource (Kafka: "Error due to duplicate config
    # keys") is INVALID_REQUEST, and neither value is taken.
    assert incremental_alter_broker_v0(b.addr, "", [("log.retention.ms", "1000"),
                                                    ("log.retention.ms", "2000")]) == 42
    assert _describe(admin, ResourceType.TOPIC, "dyn")["retention.ms"].value == "3600000"

    # Through the metadata quorum: still in force after a restart.
    assert b.stop() == 0
    b.start()
    admin = AdminClientFor(b.addr)
    t = wait_until(lambda: _describe(admin, ResourceType.TOPIC, "dyn"), 20, what="topic described")
    assert (t["retention.ms"].value, src(t["retention.ms"])) == ("3600000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert t["max.message.bytes"].value == "2000"


def AdminClientFor(addr):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": addr})


def incremental_alter_v0(addr, resource_type, name, ops, validate_only=False):
    """IncrementalAlterConfigs v0 of `ops` (key, operation, value) on one resource ->
    its error code."""
    body = header(44, 0, 9) + struct.pack(">i", 1) + struct.pack(">b", resource_type) + string(name)
    body += struct.pack(">i", len(ops))
    for key, op, value in ops:
        body += string(key) + struct.pack(">b", op) + string(value)
    body += struct.pack(">b", int(validate_only))
    resp = call(addr, frame(body))
    (n,) = struct.unpack_from(">i", resp, 4)
    assert n == 1
    (err,) = struct.unpack_from(">h", resp, 8)
    return err


def incremental_alter_broker_v0(addr, name, sets):
    """SETs `sets` (key, value) on BROKER resource `name` -> its error code."""
    return incremental_alter_v0(addr, 4, name, [(k, 0, v) for k, v in sets])


def test_metadata_v12_by_topic_id(broker):
    """Metadata v12 may name topics by id alone (the Java AdminClient's
    describeTopics(TopicCollection.ofTopicIds(..)), kafka-topics.sh --topic-id): a
    known id is answered with its topic, an unknown one with UNKNOWN_TOPIC_ID (100)."""
    import os
    from kafka_wire import Conn, metadata_v12, parse_metadata_v12
    from test_confluent import create_topic
    create_topic(broker.addr, "by-id", 3)
    c = Conn(broker.addr)
    zero = bytes(16)
    c.send(metadata_v12([("by-id", zero)], corr=1))
    _, body = c.recv()
    [(err, name, topic_id, parts)] = parse_metadata_v12(body)
    assert (err, name, parts) == (0, "by-id", 3) and topic_id != zero
    unknown = os.urandom(16)
    c.send(metadata_v12([(None, topic_id), (None, unknown)], corr=2))
    _, body = c.recv()
    got = parse_metadata_v12(body)
    c.close()
    assert (0, "by-id", topic_id, 3) in got, got
    assert (100, None, unknown, 0) in got, got
    assert len(got) == 2, got


def _name_errors(body, skip=0, with_message=False):
    """[(name, error_code)] of a CreateTopics v2 / DeleteTopics v1 / CreatePartitions v0
    answer (`skip` bytes before its array: the throttle time)."""
    pos = skip
    (n,) = struct.unpack_from(">i", body, pos); pos += 4
    out = []
    for _ in range(n):
        (ln,) = struct.unpack_from(">h", body, pos); pos += 2
        name = body[pos:pos + ln].decode(); pos += ln
        (err,) = struct.unpack_from(">h", body, pos); pos += 2
        if with_message:
            (ml,) = struct.unpack_from(">h", body, pos); pos += 2 + max(ml, 0)
        out.append((name, err))
    return sorted(out)


def test_a_topic_named_twice_in_one_request_is_invalid_request_and_untouched(broker):
    """Kafka's controller acts on none of the entries of a topic named twice in
    CreateTopics, DeleteTopics or CreatePartitions and answers it once with
    INVALID_REQUEST (42); the other topics of the request go ahead."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": broker.addr})
    c = Conn(broker.addr)

    def new_topic(name):
        return string(name) + struct.pack(">ihii", 1, 1, 0, 0)

    c.send(frame(header(19, 2, 1) + struct.pack(">i", 3) + new_topic("twice") + new_topic("once")
                 + new_topic("twice") + struct.pack(">ib", 30000, 0)))
    _, body = c.recv()
    assert _name_errors(body, skip=4, with_message=True) == [("once", 0), ("twice", 42)]
    topics = admin.list_topics(timeout=10).topics
    assert "once" in topics and "twice" not in topics
    # CreatePartitions v0: "once" asked to grow twice grows by neither.
    grow = string("once") + struct.pack(">ii", 2, -1)
    c.send(frame(header(37, 0, 2) + struct.pack(">i", 2) + grow + grow + struct.pack(">ib", 30000, 0)))
    _, body = c.recv()
    assert _name_errors(body, skip=4, with_message=True) == [("once", 42)]
    assert len(admin.list_topics(timeout=10).topics["once"].partitions) == 1
    # DeleteTopics v1: "once" named twice is not deleted.
    c.send(frame(header(20, 1, 3) + struct.pack(">i", 2) + string("once") + string("once")
                 + struct.pack(">i", 30000)))
    _, body = c.recv()
    assert _name_errors(body, skip=4) == [("once", 42)]
    c.close()
    assert "once" in admin.list_topics(timeout=10).topics


def test_create_topics_v5_answers_the_topics_configs(broker):
    """CreateTopics v5+ (KIP-525) answers each created topic's partitions,
    replication factor and configs with their sources, as DescribeConfigs would (the
    Java AdminClient's CreateTopicsResult.config reads them); validate_only too."""
    for validate_only, name in [(1, "kip525-dry"), (0, "kip525")]:
        topic = (cstring(name) + struct.pack(">ih", 3, 1) + carray([])
                 + carray([cstring("retention.ms") + cstring("1234") + NO_TAGS]) + NO_TAGS)
        r = call_flexible(broker.addr, 19, 5, carray([topic]) + struct.pack(">ib", 30000, validate_only)
                          + NO_TAGS)
        r.take("i")  # throttle

        def result(r):
            got = {"name": r.cstring(), "error": r.take("h")}
            r.cstring()  # error message
            got["partitions"], got["rf"] = r.take("ih")

            def config(r):
                c = (r.cstring(), r.cstring(), r.take("b"), r.take("b"), r.take("b"))
                r.tags()
                return c
            got["configs"] = {c[0]: c[1:] for c in r.carray(config)}
            r.tags()
            return got
        [got] = r.carray(result)
        assert (got["name"], got["error"], got["partitions"], got["rf"]) == (name, 0, 3, 1), got
        # (value, read_only, source, sensitive): DYNAMIC_TOPIC_CONFIG is 1, DEFAULT_CONFIG 5.
        assert got["configs"]["retention.ms"] == ("1234", 0, 1, 0), got["configs"]
        assert got["configs"]["cleanup.policy"][0] == "delete"
        assert got["configs"]["cleanup.policy"][2] == 5
    from confluent_kafka.admin import AdminClient
    topics = AdminClient({"bootstrap.servers": broker.addr}).list_topics(timeout=10).topics
    assert "kip525" in topics and "kip525-dry" not in topics


def test_describe_cluster_v1_answers_broker_endpoints_only(broker):
    """KIP-919: a broker answers DescribeCluster v1 for endpoint type 1 (brokers); the
    controllers' endpoints (2) are MISMATCHED_ENDPOINT_TYPE (114), an unknown type
    UNSUPPORTED_ENDPOINT_TYPE (115)."""
    for endpoint_type, error in [(1, 0), (2, 114), (7, 115)]:
        r = call_flexible(broker.addr, 60, 1, struct.pack(">bb", 0, endpoint_type) + NO_TAGS)
        r.take("i")  # throttle
        got_error, message = r.take("h"), r.cstring()
        assert (got_error, r.take("b")) == (error, endpoint_type), (endpoint_type, message)
        cluster_id = r.cstring()
        assert bool(cluster_id) == (error == 0)


# ---- BROKER_LOGGER (config resource type 8) ----

def _describe_loggers_v1(addr, name="1"):
    """DescribeConfigs v1 of BROKER_LOGGER `name` -> (error code, {logger: level})."""
    body = header(32, 1, 3) + struct.pack(">i", 1) + struct.pack(">b", 8) + string(name)
    body += struct.pack(">ib", -1, 0)  # every key, no synonyms
    resp = call(addr, frame(body))
    r = Reader(resp)
    r.take("i")  # throttle
    assert r.take("i") == 1
    err = r.take("h")

    def nullable():
        n = r.take("h")
        if n < 0:
            return None
        s = r.d[r.pos:r.pos + n].decode()
        r.pos += n
        return s
    nullable()  # error message
    r.take("b"); nullable()  # resource type, name
    levels = {}
    for _ in range(r.take("i")):
        logger, level = nullable(), nullable()
        _read_only, source, _sensitive = r.take("bbb")
        assert source == 6, "DYNAMIC_BROKER_LOGGER_CONFIG"
        assert r.take("i") == 0  # synonyms
        levels[logger] = level
    return err, levels


def _alter_loggers_v0(addr, ops, name="1", validate_only=False):
    """IncrementalAlterConfigs v0 on BROKER_LOGGER `name`: ops of (logger, op, level)."""
    return incremental_alter_v0(addr, 8, name, ops, validate_only)


def test_broker_loggers_are_described_and_changed_at_run_time(broker):
    """kafka-configs.sh --entity-type broker-loggers: a broker lists its loggers with
    their levels, and a level set through IncrementalAlterConfigs takes effect at once
    (the broker's next event of that logger is written) until it is removed."""
    SET, DELETE, APPEND = 0, 1, 2
    err, levels = _describe_loggers_v1(broker.addr)
    assert err == 0 and levels["root"] == "INFO" and levels["sluice"] == "INFO", levels
    assert "sluice_storage" in levels

    def accepted_lines():
        return broker.read_log().count("connection accepted")

    def one_request():
        c = Conn(broker.addr)
        assert api_versions_v0(c)[0] == 0
        c.close()
    one_request()
    assert accepted_lines() == 0, "debug events are off at INFO"
    # validate_only checks and changes nothing.
    assert _alter_loggers_v0(broker.addr, [("sluice::serve::server", SET, "DEBUG")], validate_only=True) == 0
    assert _describe_loggers_v1(broker.addr)[1].get("sluice::serve::server") is None
    assert _alter_loggers_v0(broker.addr, [("sluice::serve::server", SET, "DEBUG")]) == 0
    assert _describe_loggers_v1(broker.addr)[1]["sluice::serve::server"] == "DEBUG"
    one_request()
    wait_until(lambda: accepted_lines() >= 1, 10, what="a debug event of sluice::serve::server in the log")
    # Removed: back to the start-up level; the next connection writes nothing.
    assert _alter_loggers_v0(broker.addr, [("sluice::serve::server", DELETE, None)]) == 0
    assert _describe_loggers_v1(broker.addr)[1].get("sluice::serve::server") is None
    seen = accepted_lines()
    one_request()
    assert accepted_lines() == seen
    # Refused, and nothing of the request applied: an unknown logger or level
    # (INVALID_CONFIG), removing root's level (INVALID_CONFIG), APPEND
    # (INVALID_REQUEST), another broker's id (INVALID_REQUEST).
    assert _alter_loggers_v0(broker.addr, [("sluice", SET, "DEBUG"), ("kafka.server", SET, "DEBUG")]) == 40
    assert _alter_loggers_v0(broker.addr, [("sluice", SET, "LOUD")]) == 40
    assert _alter_loggers_v0(broker.addr, [("root", DELETE, None)]) == 40
    assert _alter_loggers_v0(broker.addr, [("sluice", APPEND, "DEBUG")]) == 42
    assert _alter_loggers_v0(broker.addr, [("sluice", SET, "DEBUG")], name="7") == 42
    assert _describe_loggers_v1(broker.addr, name="7")[0] == 42
    assert _describe_loggers_v1(broker.addr)[1]["sluice"] == "INFO"
