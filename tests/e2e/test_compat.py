"""Tier: black-box compatibility with real clients (issue 12): confluent-kafka
(librdkafka 2.16) admin calls and producers against real `sluice serve` processes, and
a wire-level check of what librdkafka does not expose.

Covered: legacy AlterConfigs (API 33), CreateTopics/CreatePartitions with manual
replica assignments, authorized operations (KIP-430), and compacted topics refusing
keyless records with KIP-467 record errors. Every wait is bounded.
"""
import struct
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection
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
    fut = admin.create_partitions([NewPartitions(topic, 4, replica_assignment=[[2]])])[topic]
    assert error_code(fut) == KafkaError.INVALID_REPLICA_ASSIGNMENT
