"""Tier: black-box compatibility with real clients (issue 12): confluent-kafka
(librdkafka 2.16) admin calls and producers against real `sluice serve` processes, and
a wire-level check of what librdkafka does not expose.

Covered: legacy AlterConfigs (API 33), CreateTopics/CreatePartitions with manual
replica assignments, authorized operations (KIP-430), and compacted topics refusing
keyless records with KIP-467 record errors. Every wait is bounded.
"""
import struct
import time
import uuid

import pytest
from confluent_kafka import (Consumer, KafkaError, KafkaException, Producer, TopicCollection,
                             TopicPartition)
from confluent_kafka.admin import (AclOperation, AdminClient, ConfigResource, ConfigSource,
                                   NewPartitions, NewTopic)

import kafka_wire as kw
from cluster import Cluster
from conftest import expected_log_errors, wait_until


@pytest.fixture
def cluster(tmp_path, request):
    """A started 3-broker cluster (brokers 1, 2, 3); at teardown every broker must stop
    cleanly with no unexpected ERROR or panic in its log."""
    c = Cluster(tmp_path / "cluster", n=3).start()
    yield c
    c.stop(expected_log_errors(request))


def admin_for(addr):
    return AdminClient({"bootstrap.servers": addr})


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create(admin, name, partitions=1, rf=1, config=None):
    admin.create_topics([NewTopic(name, partitions, rf, config=config or {})])[name].result(timeout=30)


def explicit_configs(admin, topic):
    """{name: value} of the topic's explicitly set configs (source DYNAMIC_TOPIC_CONFIG)."""
    res = ConfigResource("topic", topic)
    entries = admin.describe_configs([res])[res].result(timeout=30)
    return {n: e.value for n, e in entries.items()
            if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}


def error_code(fut):
    """The KafkaError code a future fails with (fails the test if it succeeds)."""
    with pytest.raises(KafkaException) as info:
        fut.result(timeout=30)
    return info.value.args[0].code()


# --- item 3: legacy AlterConfigs (API 33) ---------------------------------------------

def test_alter_configs_replaces_the_whole_explicit_set(broker):
    admin = admin_for(broker.addr)
    topic = unique("alter")
    create(admin, topic, config={"retention.ms": "3600000"})
    assert explicit_configs(admin, topic) == {"retention.ms": "3600000"}

    # Sets one config: the previous one (not named) goes back to its default.
    res = ConfigResource("topic", topic, set_config={"cleanup.policy": "compact"})
    admin.alter_configs([res])[res].result(timeout=30)
    assert explicit_configs(admin, topic) == {"cleanup.policy": "compact"}

    # A second call without it removes it.
    res = ConfigResource("topic", topic, set_config={"segment.ms": "60000"})
    admin.alter_configs([res])[res].result(timeout=30)
    assert explicit_configs(admin, topic) == {"segment.ms": "60000"}

    # validate_only: accepted, nothing changes.
    res = ConfigResource("topic", topic, set_config={"retention.ms": "1000"})
    admin.alter_configs([res], validate_only=True)[res].result(timeout=30)
    assert explicit_configs(admin, topic) == {"segment.ms": "60000"}

    # A bad value (also with validate_only) is INVALID_CONFIG and changes nothing.
    for validate_only in (True, False):
        res = ConfigResource("topic", topic, set_config={"cleanup.policy": "shred"})
        fut = admin.alter_configs([res], validate_only=validate_only)[res]
        assert error_code(fut) == KafkaError.INVALID_CONFIG
    assert explicit_configs(admin, topic) == {"segment.ms": "60000"}

    # An unknown topic.
    res = ConfigResource("topic", unique("missing"), set_config={"retention.ms": "1000"})
    assert error_code(admin.alter_configs([res])[res]) == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_alter_configs_of_a_broker_refuses_static_configs(broker):
    admin = admin_for(broker.addr)
    # Sluice's broker settings are static, like Kafka's read-only ones: INVALID_REQUEST.
    res = ConfigResource("broker", "1", set_config={"log.dirs": "/elsewhere"})
    assert error_code(admin.alter_configs([res])[res]) == KafkaError.INVALID_REQUEST
    # Nothing to change is fine.
    res = ConfigResource("broker", "1")
    admin.alter_configs([res])[res].result(timeout=30)
    res = ConfigResource("broker", "1")
    entries = admin.describe_configs([res])[res].result(timeout=30)
    assert entries["log.dirs"].value == broker.data_dir


def _described(admin, kind, name):
    res = ConfigResource(kind, name)
    return admin.describe_configs([res])[res].result(timeout=30)


def test_described_topic_configs_written_back_change_nothing(broker):
    """Issue 43 item 1: what DescribeConfigs shows for a topic, written back whole with
    legacy AlterConfigs (what librdkafka's test helper, config-sync tools and
    Terraform-style providers do), enforces the same: an RF=1 topic still takes acks=all
    writes (it used to be described as min.insync.replicas=2 and then refused them)."""
    admin = admin_for(broker.addr)
    topic = unique("mv")
    create(admin, topic, config={"message.timestamp.difference.max.ms": "600000"})
    before = _described(admin, "topic", topic)
    assert before["min.insync.replicas"].value == "1"
    every = {n: e.value for n, e in before.items() if e.value is not None and not e.is_read_only}
    res = ConfigResource("topic", topic, set_config=every)
    admin.alter_configs([res])[res].result(timeout=30)
    after = _described(admin, "topic", topic)
    assert {n: e.value for n, e in after.items()} == {n: e.value for n, e in before.items()}

    p = Producer({"bootstrap.servers": broker.addr, "message.timeout.ms": 15000})
    delivered, errors = [], []
    # Now, five minutes old (inside the difference still in force) and an hour old
    # (outside it, refused as before the write-back); one batch each (a batch with a
    # bad timestamp fails whole).
    for value, age_ms in ((b"now", 0), (b"old", 300_000), (b"older", 3_600_000)):
        p.produce(topic, value=value, timestamp=int(time.time() * 1000) - age_ms,
                  on_delivery=lambda e, m: (errors if e else delivered).append(e or m))
        assert p.flush(30) == 0
    assert len(delivered) == 2, errors
    assert [e.code() for e in errors] == [KafkaError.INVALID_TIMESTAMP]


def test_kafka_broker_configs_are_known(broker):
    """Issue 43 item 3: every broker config Kafka defines is known to AlterConfigs and
    IncrementalAlterConfigs on a BROKER resource: a dynamic one Sluice has no use for is
    kept and described, a per-broker one set cluster-wide and a read-only one are
    INVALID_REQUEST as Kafka answers, and only a name Kafka does not define is unknown."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry
    admin = admin_for(broker.addr)
    relogin = "sasl.kerberos.min.time.before.relogin"
    res = ConfigResource("broker", "1", set_config={relogin: "58000"})
    admin.alter_configs([res])[res].result(timeout=30)
    inc = ConfigResource("broker", "1", incremental_configs=[
        ConfigEntry("sasl.kerberos.ticket.renew.jitter", "0.06", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([inc])[inc].result(timeout=30)
    described = _described(admin, "broker", "1")
    assert described[relogin].value == "58000"
    assert described[relogin].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert described["sasl.kerberos.ticket.renew.jitter"].value == "0.06"
    for name in ("zookeeper.connect", "advertised.listeners"):
        res = ConfigResource("broker", "1", set_config={name: "x"})
        assert error_code(admin.alter_configs([res])[res]) == KafkaError.INVALID_REQUEST, name
    # Cluster-wide (the empty broker name, which librdkafka does not send: a raw
    # IncrementalAlterConfigs v0): a per-broker config is refused, a cluster-wide one kept.
    from test_admin_apis import incremental_alter_broker_v0
    assert incremental_alter_broker_v0(broker.addr, "", [(relogin, "1")]) == KafkaError.INVALID_REQUEST
    assert incremental_alter_broker_v0(broker.addr, "", [("num.io.threads", "9")]) == 0
    res = ConfigResource("broker", "1", set_config={"no.such.broker.config": "1"})
    assert error_code(admin.alter_configs([res])[res]) == KafkaError.INVALID_CONFIG
    assert _described(admin, "broker", "1")[relogin].value == "58000"


# --- item 5: authorized operations (KIP-430) ------------------------------------------

TOPIC_OPS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
             AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
             AclOperation.ALTER_CONFIGS}
CLUSTER_OPS = {AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE,
               AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
               AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE}
GROUP_OPS = {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}


def test_authorized_operations_when_asked(broker):
    admin = admin_for(broker.addr)
    topic = unique("ops")
    create(admin, topic, partitions=2)

    desc = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[topic]
    assert set(desc.result(timeout=30).authorized_operations) == TOPIC_OPS
    desc = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30)
    assert not desc.authorized_operations, "not asked: not provided"

    cluster = admin.describe_cluster(include_authorized_operations=True).result(timeout=30)
    assert set(cluster.authorized_operations) == CLUSTER_OPS
    assert not admin.describe_cluster().result(timeout=30).authorized_operations

    # A real group, with a member, described by its coordinator.
    group = unique("group")
    c = Consumer({"bootstrap.servers": broker.addr, "group.id": group,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    try:
        c.subscribe([topic])
        wait_until(lambda: c.poll(0.2) is None and c.assignment(), timeout=30,
                   what="consumer assigned")
        g = admin.describe_consumer_groups([group], include_authorized_operations=True)[group]
        g = g.result(timeout=30)
        assert len(g.members) == 1
        assert set(g.authorized_operations) == GROUP_OPS
        g = admin.describe_consumer_groups([group])[group].result(timeout=30)
        assert not g.authorized_operations
    finally:
        c.close()


# --- item 4: manual replica assignments -----------------------------------------------
# librdkafka wants a manual assignment's partition count in NewTopic; on the wire it
# sends -1 for both the count and the replication factor, as Kafka requires.

def replicas(admin, topic, want_partitions, timeout=30):
    """{partition: [replica ids]} once the topic has `want_partitions` partitions, each
    led by its first replica (a new partition's leader)."""
    def ready():
        t = admin.list_topics(topic=topic, timeout=5).topics[topic]
        if t.error is not None or len(t.partitions) != want_partitions:
            return None
        if any(p.leader != p.replicas[0] for p in t.partitions.values()):
            return None
        return {i: list(p.replicas) for i, p in t.partitions.items()}
    return wait_until(ready, timeout=timeout, what=f"{topic}: {want_partitions} partitions led")


def create_topics_v2(topic, num_partitions, replication_factor, assignments, corr=5):
    """A CreateTopics v2 request for one topic with manual `assignments`
    [(partition index, [broker ids])] (what librdkafka cannot be made to send)."""
    body = kw.header(19, 2, corr) + struct.pack(">i", 1) + kw.string(topic)
    body += struct.pack(">ihi", num_partitions, replication_factor, len(assignments))
    for index, brokers in assignments:
        body += struct.pack(">ii", index, len(brokers)) + b"".join(struct.pack(">i", b) for b in brokers)
    body += struct.pack(">i", 0)  # configs
    body += struct.pack(">ib", 30000, 0)  # timeout, validate_only
    return kw.frame(body)


def create_topics_v2_error(addr, *args):
    """Sends create_topics_v2(*args) -> the topic's error code."""
    conn = kw.Conn(addr)
    try:
        conn.send(create_topics_v2(*args))
        corr, body = conn.recv()
        assert corr == 5
        _throttle, n = struct.unpack_from(">ii", body, 0)
        assert n == 1
        (ln,) = struct.unpack_from(">h", body, 8)
        (err,) = struct.unpack_from(">h", body, 10 + ln)
        return err
    finally:
        conn.close()


def test_manual_replica_assignments_on_a_cluster(cluster):
    admin = cluster.admin()
    topic = unique("manual")
    layout = [[2, 3], [3, 1], [1, 2]]
    admin.create_topics([NewTopic(topic, len(layout), replica_assignment=layout)])[topic].result(timeout=30)
    assert replicas(admin, topic, 3) == {0: [2, 3], 1: [3, 1], 2: [1, 2]}

    # Two more partitions, one replica list each.
    fut = admin.create_partitions([NewPartitions(topic, 5, replica_assignment=[[1, 3], [2, 1]])])[topic]
    fut.result(timeout=30)
    assert replicas(admin, topic, 5) == {0: [2, 3], 1: [3, 1], 2: [1, 2], 3: [1, 3], 4: [2, 1]}

    # Bad assignments: nothing is created.
    bad_topics = {
        "unregistered broker": [[1, 9]],
        "broker twice": [[2, 2]],
        "replication factors differ": [[1, 2], [3]],
    }
    for what, layout in bad_topics.items():
        name = unique("bad")
        fut = admin.create_topics([NewTopic(name, len(layout), replica_assignment=layout)])[name]
        assert error_code(fut) == KafkaError.INVALID_REPLICA_ASSIGNMENT, what
        assert name not in admin.list_topics(timeout=10).topics, what
    bad_partitions = {
        "replication factor differs from the topic's": (6, [[1]]),
        "unregistered broker": (6, [[1, 7]]),
        "broker twice": (6, [[3, 3]]),
    }
    for what, (count, layout) in bad_partitions.items():
        fut = admin.create_partitions([NewPartitions(topic, count, replica_assignment=layout)])[topic]
        assert error_code(fut) == KafkaError.INVALID_REPLICA_ASSIGNMENT, what
    assert len(admin.list_topics(topic=topic, timeout=10).topics[topic].partitions) == 5

    # What librdkafka will not send, on the wire.
    addr = cluster.addr(1)
    name = unique("wire")
    assert create_topics_v2_error(addr, name, 2, -1, [(0, [1]), (1, [2])]) == KafkaError.INVALID_REQUEST
    assert create_topics_v2_error(addr, name, -1, 1, [(0, [1]), (1, [2])]) == KafkaError.INVALID_REQUEST
    assert create_topics_v2_error(addr, name, -1, -1, [(0, [1]), (2, [2])]) == \
        KafkaError.INVALID_REPLICA_ASSIGNMENT, "indexes must be 0..n"
    assert create_topics_v2_error(addr, name, -1, -1, [(0, [1]), (0, [2])]) == \
        KafkaError.INVALID_REPLICA_ASSIGNMENT, "a partition twice"
    assert name not in admin.list_topics(timeout=10).topics
    # The same request shape, valid, creates the topic (indexes in any order).
    assert create_topics_v2_error(addr, name, -1, -1, [(1, [3]), (0, [2])]) == 0
    assert replicas(admin, name, 2) == {0: [2], 1: [3]}


def test_manual_replica_assignment_on_one_broker(broker):
    admin = admin_for(broker.addr)
    topic = unique("manual1")
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[1], [1]])])[topic].result(timeout=30)
    assert replicas(admin, topic, 2) == {0: [1], 1: [1]}
    admin.create_partitions([NewPartitions(topic, 3, replica_assignment=[[1]])])[topic].result(timeout=30)
    assert replicas(admin, topic, 3) == {0: [1], 1: [1], 2: [1]}
    name = unique("bad")
    fut = admin.create_topics([NewTopic(name, 1, replica_assignment=[[2]])])[name]
    assert error_code(fut) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    # validate_only: checked, not created.
    name = unique("dry")
    admin.create_topics([NewTopic(name, 2, replica_assignment=[[1], [1]])],
                        validate_only=True)[name].result(timeout=30)
    assert name not in admin.list_topics(timeout=10).topics
    fut = admin.create_topics([NewTopic(name, 1, replica_assignment=[[3]])], validate_only=True)[name]
    assert error_code(fut) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    fut = admin.create_partitions([NewPartitions(topic, 4, replica_assignment=[[2]])])[topic]
    assert error_code(fut) == KafkaError.INVALID_REPLICA_ASSIGNMENT


# --- item 6: compacted topics refuse keyless records (KIP-467 record errors) ----------

def produce_reports(addr, topic, records, **conf):
    """Produces [(key, value)] in one go (one batch when `linger.ms` allows) and flushes;
    -> [(key, value, error code or None)] in produce order."""
    p = Producer({"bootstrap.servers": addr, "enable.idempotence": False, **conf})
    # Learn the partition's leader first: records produced before the producer knows it
    # wait in librdkafka's unassigned queue, and one moved out of it when the metadata
    # arrives may be sent at once, alone, splitting what was meant as one batch (seen
    # once in a full run: [None, 87, 87]).
    p.list_topics(topic, timeout=30)
    reports = {}

    def cb(err, msg):
        reports[msg.value()] = err.code() if err is not None else None

    for k, v in records:
        p.produce(topic, key=k, value=v, on_delivery=cb)
    assert p.flush(30) == 0
    return [(k, v, reports[v]) for k, v in records]


def test_compacted_topic_refuses_keyless_records(broker):
    admin = admin_for(broker.addr)
    topic = unique("compacted")
    create(admin, topic, config={"cleanup.policy": "compact"})

    ok = produce_reports(broker.addr, topic, [(b"k1", b"v1"), (b"k2", b"v2")])
    assert [e for _, _, e in ok] == [None, None]
    keyless = produce_reports(broker.addr, topic, [(None, b"n1")])
    assert keyless[0][2] == KafkaError.INVALID_RECORD
    # One batch holding both: the whole batch fails (record_errors name the keyless
    # record, see test_record_errors_on_the_wire; librdkafka reports INVALID_RECORD for
    # every record of the batch).
    mixed = produce_reports(broker.addr, topic, [(b"k3", b"v3"), (None, b"n2"), (b"k4", b"v4")],
                            **{"linger.ms": 500})
    assert [e for _, _, e in mixed] == [KafkaError.INVALID_RECORD] * 3
    ok = produce_reports(broker.addr, topic, [(b"k5", b"v5")])
    assert ok[0][2] is None

    # Only the keyed records of the successful batches are in the log.
    c = Consumer({"bootstrap.servers": broker.addr, "group.id": unique("read"),
                  "auto.offset.reset": "earliest", "enable.partition.eof": True})
    got = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])

        def read_to_end():
            m = c.poll(0.5)
            if m is None:
                return False
            if m.error() is not None:
                return m.error().code() == KafkaError._PARTITION_EOF and len(got) >= 3
            got.append((m.offset(), m.key(), m.value()))
            return False
        wait_until(read_to_end, timeout=30, interval=0, what="the compacted topic read to its end")
    finally:
        c.close()
    assert got == [(0, b"k1", b"v1"), (1, b"k2", b"v2"), (2, b"k5", b"v5")]

    # A topic that is not compacted takes keyless records.
    plain = unique("plain")
    create(admin, plain)
    assert produce_reports(broker.addr, plain, [(None, b"n")])[0][2] is None


def keyed_batch(records):
    """An uncompressed v2 batch of [(key or None, value)] (no producer id)."""
    ts = int(time.time() * 1000)
    recs = b""
    for i, (k, v) in enumerate(records):
        key = kw.varint(-1) if k is None else kw.varint(len(k)) + k
        body = b"\x00" + kw.varint(0) + kw.varint(i) + key + kw.varint(len(v)) + v + kw.varint(0)
        recs += kw.varint(len(body)) + body
    after_crc = struct.pack(">hiqqqhii", 0, len(records) - 1, ts, ts, -1, -1, -1, len(records)) + recs
    after_len = struct.pack(">ibI", 0, 2, kw.crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(after_len)) + after_len


def produce_v8(topic, batches, corr=8):
    """Produce v8 (acks=all) of {partition: batch bytes} to one topic."""
    body = kw.header(0, 8, corr) + kw.string(None) + struct.pack(">hi", -1, 10000)
    body += struct.pack(">i", 1) + kw.string(topic) + struct.pack(">i", len(batches))
    for p, records in batches.items():
        body += struct.pack(">ii", p, len(records)) + records
    return kw.frame(body)


def read_string(buf, pos):
    (n,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    if n < 0:
        return None, pos
    return buf[pos:pos + n].decode(), pos + n


def parse_produce_v8(body):
    """-> {partition: (error code, base offset, [(batch index, message)], error message)}"""
    out = {}
    (n_topics,) = struct.unpack_from(">i", body, 0)
    pos = 4
    for _ in range(n_topics):
        _name, pos = read_string(body, pos)
        (n_parts,) = struct.unpack_from(">i", body, pos)
        pos += 4
        for _ in range(n_parts):
            p, err, base, _ts, _start = struct.unpack_from(">ihqqq", body, pos)
            pos += 30
            (n_errors,) = struct.unpack_from(">i", body, pos)
            pos += 4
            errors = []
            for _ in range(n_errors):
                (index,) = struct.unpack_from(">i", body, pos)
                msg, pos = read_string(body, pos + 4)
                errors.append((index, msg))
            message, pos = read_string(body, pos)
            out[p] = (err, base, errors, message)
    return out


def test_record_errors_on_the_wire(broker):
    admin = admin_for(broker.addr)
    topic = unique("kip467")
    create(admin, topic, partitions=2, config={"cleanup.policy": "compact"})
    conn = kw.Conn(broker.addr)
    try:
        # Partition 0's batch has two keyless records; partition 1's is fine.
        conn.send(produce_v8(topic, {
            0: keyed_batch([(b"a", b"1"), (None, b"2"), (None, b"3")]),
            1: keyed_batch([(b"b", b"1")]),
        }))
        corr, body = conn.recv()
        assert corr == 8
        parts = parse_produce_v8(body)
        err, base, errors, message = parts[0]
        assert err == KafkaError.INVALID_RECORD and base == -1
        assert [i for i, _ in errors] == [1, 2]
        assert all(f"{topic}-0" in m and "key" in m for _, m in errors), errors
        assert message and "2 record(s)" in message, message
        assert parts[1][:3] == (0, 0, [])

        # Before v8 the same refusal carries only the code.
        conn.send(kw.produce_v3(topic, 0, kw.record_batch([b"x"]), corr=9))
        corr, body = conn.recv()
        assert corr == 9
        assert kw.parse_produce_v3(body) == [(topic, 0, KafkaError.INVALID_RECORD, -1)]
    finally:
        conn.close()
    # Nothing of partition 0's refused batches was written.
    c = Consumer({"bootstrap.servers": broker.addr, "group.id": unique("wm")})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 0)
        assert c.get_watermark_offsets(TopicPartition(topic, 1), timeout=10) == (0, 1)
    finally:
        c.close()
