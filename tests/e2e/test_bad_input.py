"""Tier: bad input. Each case gets a clear Kafka error or closes only its own
connection; the broker keeps serving and stored data is untouched."""
import os
import struct

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
