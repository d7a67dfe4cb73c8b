"""Tier: black-box with kafka-python 3 (pure Python, its own protocol code)."""
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from conftest import wait_until


def read_from_start(addr, partitions, n, timeout):
    """Reads `partitions` from their beginning with kafka-python until `n` records came
    (bounded wait); returns them in arrival order."""
    c = KafkaConsumer(bootstrap_servers=addr, enable_auto_commit=False, auto_offset_reset="earliest")
    c.assign(partitions)
    c.seek_to_beginning()
    got = []

    def more():
        for recs in c.poll(timeout_ms=500).values():
            got.extend(recs)
        return len(got) >= n

    try:
        wait_until(more, timeout=timeout, interval=0, what=f"{n} records")
    finally:
        c.close()
    return got


def test_round_trip(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.addr)
    admin.create_topics([NewTopic("kp", num_partitions=3, replication_factor=1)])
    admin.close()
    # kafka-python 3's defaults: idempotence on (InitProducerId, sequenced batches), up
    # to 5 requests in flight. The per-key order checked below holds through retries
    # only with idempotence: without it a retried batch lands after later ones, as
    # Kafka documents (one make test run under load saw exactly that).
    p = KafkaProducer(bootstrap_servers=broker.addr, acks="all")
    futs = [p.send("kp", key=f"k{i % 5}".encode(), value=f"v{i}".encode()) for i in range(3000)]
    p.flush()
    meta = [f.get(timeout=30) for f in futs]
    p.close()
    got = read_from_start(broker.addr, [TopicPartition("kp", i) for i in range(3)], 3000, timeout=60)
    assert len(got) == 3000
    sent = {(m.partition, m.offset) for m in meta}
    assert {(r.partition, r.offset) for r in got} == sent
    values = sorted(int(r.value.decode()[1:]) for r in got)
    assert values == list(range(3000))
    for k in range(5):
        mine = [int(r.value.decode()[1:]) for r in sorted(got, key=lambda r: (r.partition, r.offset))
                if r.key == f"k{k}".encode()]
        assert mine == sorted(mine)


def test_auto_created_topic_and_end_offsets(broker):
    p = KafkaProducer(bootstrap_servers=broker.addr, acks=1, enable_idempotence=False)
    for i in range(10):
        p.send("auto-kp", value=b"x%d" % i).get(timeout=30)
    p.close()
    c = KafkaConsumer(bootstrap_servers=broker.addr)
    tp = TopicPartition("auto-kp", 0)
    assert c.end_offsets([tp])[tp] == 10
    assert c.beginning_offsets([tp])[tp] == 0
    c.close()


def test_default_idempotent_producer_round_trip(broker):
    """A KafkaProducer with kafka-python 3's defaults (enable_idempotence=True, acks=all):
    it asks for a producer id (InitProducerId) and sends sequenced batches."""
    admin = KafkaAdminClient(bootstrap_servers=broker.addr)
    admin.create_topics([NewTopic("kp-idem", num_partitions=1, replication_factor=1)])
    admin.close()
    p = KafkaProducer(bootstrap_servers=broker.addr)
    assert p.config["enable_idempotence"] and p.config["acks"] == -1, "not the defaults this test is about"
    try:
        meta = [p.send("kp-idem", key=b"k", value=b"v%d" % i).get(timeout=30) for i in range(10)]
    finally:
        p.close(timeout=10)
    assert [m.offset for m in meta] == list(range(10))
    got = read_from_start(broker.addr, [TopicPartition("kp-idem", 0)], 10, timeout=30)
    assert [(r.offset, r.value) for r in got] == [(i, b"v%d" % i) for i in range(10)]
