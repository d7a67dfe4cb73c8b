"""Tier: bad input. Each case gets a clear Kafka error or closes only its own
connection; the broker keeps serving and stored data is untouched."""
import os
import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import wait_until
from kafka_wire import (Conn, api_versions_v0, frame, header, parse_produce_v3, produce_v3,
                        record_batch)

def still_serving(addr):
    c = Conn(addr)
    err, keys = api_versions_v0(c)
    c.close()
    assert err == 0 and 0 in keys and 1 in keys
    return True


@pytest.mark.parametrize("size", [200 * 1024 * 1024, -1, 3, 0x7FFFFFFF])
def test_bad_frame_sizes_close_only_that_connection(broker, size):
    other = Conn(broker.addr)
    c = Conn(broker.addr)
    c.send(struct.pack(">i", size) + b"\x00" * 16)
    wait_until(c.closed_by_peer, what="connection closed")
    err, _ = api_versions_v0(other)
    assert err == 0, "the other connection is unaffected"
    assert still_serving(broker.addr)


def test_truncated_frame_and_garbage(broker):
    c = Conn(broker.addr)
    c.send(struct.pack(">i", 100) + b"\x00\x12\x00\x00")
    c.s.shutdown(1)  # SHUT_WR: the frame never completes
    wait_until(c.closed_by_peer, what="connection closed")
    # A known API with a body that does not decode: the connection is closed.
    c = Conn(broker.addr)
    c.send(frame(header(3, 1, 1) + struct.pack(">i", 5) + b"\x00\x10ab"))
    wait_until(c.closed_by_peer, what="connection closed")
    # Array lengths of two billion must not make the broker reserve memory for them.
    c = Conn(broker.addr)
    c.send(frame(header(3, 1, 1) + struct.pack(">i", 0x7FFFFFFF)))
    wait_until(c.closed_by_peer, what="connection closed")
    rnd = __import__("random").Random(1234)
    for _ in range(200):
        c = Conn(broker.addr)
        body = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(8, 300)))
        c.send(frame(body))
        c.close()
    assert still_serving(broker.addr)
    assert broker.alive()


def watermarks(addr, topic, p=0):
    c = Consumer({"bootstrap.servers": addr, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
    finally:
        c.close()


def test_bad_crc_is_corrupt_message_and_stores_nothing(broker):
    c = Conn(broker.addr)
    c.send(produce_v3("crc", 0, record_batch([b"good-1", b"good-2"])))
    _, body = c.recv()
    assert parse_produce_v3(body) == [("crc", 0, 0, 0)]
    c.send(produce_v3("crc", 0, record_batch([b"bad"], good_crc=False), corr=2))
    corr, body = c.recv()
    assert corr == 2 and parse_produce_v3(body)[0][2] == 2, "CORRUPT_MESSAGE"
    # Framing that does not parse as a batch at all.
    c.send(produce_v3("crc", 0, b"\x00" * 30, corr=3))
    _, body = c.recv()
    assert parse_produce_v3(body)[0][2] == 2
    assert watermarks(broker.addr, "crc") == (0, 2)
    c.send(produce_v3("crc", 0, record_batch([b"good-3"]), corr=4))
    _, body = c.recv()
    assert parse_produce_v3(body) == [("crc", 0, 0, 2)]
    c.close()


def test_lying_or_paired_batches_are_invalid_record_and_store_nothing(broker):
    """Kafka reads every record of a batch and takes one batch per partition from
    Produce v3 on; a batch with a good CRC whose header counts records it does not hold
    would be stored for consumers that cannot read it."""
    c = Conn(broker.addr)
    c.send(produce_v3("lie", 0, record_batch([b"a", b"b"])))
    _, body = c.recv()
    assert parse_produce_v3(body) == [("lie", 0, 0, 0)]
    for corr, records in [
        (2, record_batch([b"c", b"d"], count=3)),  # three counted, two held
        (3, record_batch([b"c", b"d", b"e"], count=2)),  # a record left over
        (4, record_batch([b"c"]) + record_batch([b"d"])),  # two batches
        (5, b""),  # none
    ]:
        c.send(produce_v3("lie", 0, records, corr=corr))
        got, body = c.recv()
        assert got == corr and parse_produce_v3(body)[0][2] == 87, ("INVALID_RECORD", corr)
    c.close()
    assert watermarks(broker.addr, "lie") == (0, 2)
    consumer = Consumer({"bootstrap.servers": broker.addr, "group.id": "lie",
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("lie", 0, 0)])
    values = []
    deadline = time.monotonic() + 30
    while len(values) < 2 and time.monotonic() < deadline:
        m = consumer.poll(1)
        if m is not None:
            assert m.error() is None, m.error()
            values.append(m.value())
    consumer.close()
    assert values == [b"a", b"b"]


def test_batch_over_max_message_bytes_is_message_too_large(broker):
    admin = AdminClient({"bootstrap.servers": broker.addr})
    admin.create_topics([NewTopic("small", 1, 1, config={"max.message.bytes": "2000"})])["small"].result(30)
    c = Conn(broker.addr)
    c.send(produce_v3("small", 0, record_batch([b"x" * 5000])))
    _, body = c.recv()
    assert parse_produce_v3(body)[0][2] == 10, "MESSAGE_TOO_LARGE"
    c.close()
    # And through a real client against the 1 MiB default.
    p = Producer({"bootstrap.servers": broker.addr, "message.max.bytes": 5_000_000, "compression.type": "none"})
    errors = []
    p.produce("big", value=os.urandom(2_000_000), on_delivery=lambda e, m: errors.append(e))
    p.flush(30)
    assert errors and errors[0] is not None and errors[0].code() == 10, errors
    assert watermarks(broker.addr, "small") == (0, 0)
    assert watermarks(broker.addr, "big") == (0, 0)


def test_unknown_topic_without_auto_creation(make_broker):
    b = make_broker(extra=["--auto-create-topics", "false"])
    c = Conn(b.addr)
    c.send(produce_v3("nope", 0, record_batch([b"x"])))
    _, body = c.recv()
    assert parse_produce_v3(body)[0][2] == 3, "UNKNOWN_TOPIC_OR_PARTITION"
    c.close()
    admin = AdminClient({"bootstrap.servers": b.addr})
    assert "nope" not in admin.list_topics(timeout=10).topics


def test_bad_topic_names_and_configs(broker):
    c = Conn(broker.addr)
    c.send(produce_v3("bad name!", 0, record_batch([b"x"])))
    _, body = c.recv()
    assert parse_produce_v3(body)[0][2] == 17, "INVALID_TOPIC_EXCEPTION"
    c.close()
    admin = AdminClient({"bootstrap.servers": broker.addr})
    with pytest.raises(KafkaException) as e:
        admin.create_topics([NewTopic("bad name!", 1, 1)])["bad name!"].result(30)
    assert e.value.args[0].code() == 17
    with pytest.raises(KafkaException) as e:
        admin.create_topics([NewTopic("t", 1, 1, config={"retention.ms": "soon"})])["t"].result(30)
    assert e.value.args[0].code() == 40 and "retention.ms" in e.value.args[0].str()
    with pytest.raises(KafkaException) as e:
        admin.create_topics([NewTopic("t", 1, 1, config={"no.such.thing": "1"})])["t"].result(30)
    assert e.value.args[0].code() == 40
    with pytest.raises(KafkaException) as e:
        admin.create_topics([NewTopic("t", 1, 3)])["t"].result(30)
    assert e.value.args[0].code() == 38, "INVALID_REPLICATION_FACTOR"
    assert "t" not in admin.list_topics(timeout=10).topics


def test_clients_cannot_write_to_internal_topics(broker):
    """Only the broker's coordinators append to __consumer_offsets and
    __transaction_state (records there are replayed as group offsets and transaction
    state): a client's produce is INVALID_TOPIC_EXCEPTION (17), as in Kafka."""
    for topic in ("__consumer_offsets", "__transaction_state"):
        c = Conn(broker.addr)
        c.send(produce_v3(topic, 0, record_batch([b"forged"])))
        _, body = c.recv()
        c.close()
        [(name, _, err, _)] = parse_produce_v3(body)
        assert (name, err) == (topic, 17), (name, err)


def test_an_acks_0_produce_that_fails_closes_its_connection(broker):
    """acks=0 gets no answer, so a failure (an unknown partition, a moved leader) is
    told by closing the connection, as Kafka does: the client refreshes its metadata.
    A successful one leaves the connection serving."""
    c = Conn(broker.addr)
    c.send(produce_v3("acks0", 0, record_batch([b"fine"]), acks=0))
    err, _ = api_versions_v0(c)
    assert err == 0, "a successful acks=0 produce keeps the connection"
    c.send(produce_v3("acks0", 7, record_batch([b"nowhere"]), acks=0))
    wait_until(c.closed_by_peer, what="connection closed after a failed acks=0 produce")
    c.close()
    assert still_serving(broker.addr)


def test_delete_records_on_a_compacted_topic_is_a_policy_violation(broker):
    """Kafka refuses DeleteRecords unless the topic's cleanup.policy deletes
    (POLICY_VIOLATION): a compacted log keeps the latest record per key."""
    from confluent_kafka import KafkaError
    a = AdminClient({"bootstrap.servers": broker.addr})
    a.create_topics([NewTopic("compacted", 1, 1, config={"cleanup.policy": "compact"})])[
        "compacted"].result(timeout=30)
    p = Producer({"bootstrap.servers": broker.addr})
    for i in range(5):
        p.produce("compacted", key=b"k%d" % i, value=b"v", partition=0)
    assert p.flush(30) == 0
    tp = TopicPartition("compacted", 0, 3)
    with pytest.raises(KafkaException) as e:
        a.delete_records([tp])[tp].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.POLICY_VIOLATION, e.value
    c = Consumer({"bootstrap.servers": broker.addr, "group.id": "dr"})
    assert c.get_watermark_offsets(TopicPartition("compacted", 0), timeout=10) == (0, 5)
    c.close()


def test_topic_names_that_collide_in_metric_names_are_refused(broker):
    """'.' and '_' are the same character in metric names (Kafka's
    Topic.hasCollision): with a.b there, a_b is INVALID_TOPIC_EXCEPTION."""
    from confluent_kafka import KafkaError
    a = AdminClient({"bootstrap.servers": broker.addr})
    a.create_topics([NewTopic("a.b", 1, 1)])["a.b"].result(timeout=30)
    with pytest.raises(KafkaException) as e:
        a.create_topics([NewTopic("a_b", 1, 1)])["a_b"].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, e.value
    assert "collides" in e.value.args[0].str()
