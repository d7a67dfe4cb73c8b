"""Tier: black-box over raw sockets and real clients. Incremental fetch sessions
(KIP-227): Fetch v7 on the wire (a full fetch opens a session, incremental fetches
answer only partitions with news, Kafka's session errors), kafka-python's consumer
(which uses sessions by default) and librdkafka's (which fetches without them) reading
many partitions while a producer keeps writing."""
import struct
import threading
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from conftest import check_consumer_error, http_get, wait_until
from kafka_wire import Conn, frame, header, produce_v3, record_batch, string

FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


def fetch_v7(session_id, epoch, parts, forgotten=(), corr=1, max_wait_ms=0, min_bytes=0):
    """parts: [(topic, partition, fetch_offset)]; forgotten: [(topic, partition)]."""
    body = header(1, 7, corr) + struct.pack(">iiiibii", -1, max_wait_ms, min_bytes, 50 << 20, 0,
                                            session_id, epoch)
    for items, enc in ((parts, lambda p: struct.pack(">iqqi", p[1], p[2], -1, 1 << 20)),
                       (forgotten, lambda p: struct.pack(">i", p[1]))):
        topics = {}
        for p in items:
            topics.setdefault(p[0], []).append(p)
        body += struct.pack(">i", len(topics))
        for t, ps in topics.items():
            body += string(t) + struct.pack(">i", len(ps)) + b"".join(enc(p) for p in ps)
    return frame(body)


def parse_fetch_v7(resp):
    """-> (error_code, session_id, {(topic, partition): (error, hw, records bytes)})"""
    _throttle, err, session = struct.unpack_from(">ihi", resp, 0)
    pos = 10
    (n_topics,) = struct.unpack_from(">i", resp, pos); pos += 4
    out = {}
    for _ in range(n_topics):
        (ln,) = struct.unpack_from(">h", resp, pos); pos += 2
        name = resp[pos:pos + ln].decode(); pos += ln
        (n_parts,) = struct.unpack_from(">i", resp, pos); pos += 4
        for _ in range(n_parts):
            p, perr, hw, _lso, _start = struct.unpack_from(">ihqqq", resp, pos); pos += 30
            (n_aborted,) = struct.unpack_from(">i", resp, pos); pos += 4
            pos += max(n_aborted, 0) * 16
            (rl,) = struct.unpack_from(">i", resp, pos); pos += 4
            out[(name, p)] = (perr, hw, resp[pos:pos + max(rl, 0)]); pos += max(rl, 0)
    return err, session, out


def create_topic(bootstrap, name, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=15)[name].result(timeout=20)


def produce_one(addr, topic, partition, value):
    c = Conn(addr)
    c.send(produce_v3(topic, partition, record_batch([value])))
    c.recv()
    c.close()


def fetch_sessions_metric(broker):
    status, text = http_get(broker.metrics_url + "/metrics")
    assert status == 200
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "sluice_fetch_sessions":
                return s.value
    raise AssertionError("no sluice_fetch_sessions sample")


def test_incremental_fetches_answer_only_changes_and_refuse_bad_epochs(broker):
    create_topic(broker.addr, "fs", 4)
    for p in range(4):
        produce_one(broker.addr, "fs", p, f"first-{p}".encode())
    c = Conn(broker.addr)
    # A full fetch with epoch 0 opens a session and answers every partition.
    c.send(fetch_v7(0, 0, [("fs", p, 0) for p in range(4)]))
    err, sid, parts = parse_fetch_v7(c.recv()[1])
    assert err == 0 and sid > 0
    assert sorted(parts) == [("fs", p) for p in range(4)]
    assert all(e == 0 and hw == 1 and f"first-{p}".encode() in recs
               for (_, p), (e, hw, recs) in parts.items())
    assert fetch_sessions_metric(broker) == 1
    # The consumer moves every offset past the record: nothing new, nothing answered.
    c.send(fetch_v7(sid, 1, [("fs", p, 1) for p in range(4)], corr=2))
    assert parse_fetch_v7(c.recv()[1]) == (0, sid, {})
    # A record on partition 2: only partition 2 is answered, from the session's offset.
    produce_one(broker.addr, "fs", 2, b"second")
    c.send(fetch_v7(sid, 2, [], corr=3))
    err, got_sid, parts = parse_fetch_v7(c.recv()[1])
    assert (err, got_sid, list(parts)) == (0, sid, [("fs", 2)])
    assert parts[("fs", 2)][1] == 2 and b"second" in parts[("fs", 2)][2]
    # A replayed epoch and an unknown session id are refused as a whole.
    c.send(fetch_v7(sid, 2, [], corr=4))
    assert parse_fetch_v7(c.recv()[1]) == (INVALID_FETCH_SESSION_EPOCH, 0, {})
    c.send(fetch_v7(sid + 1, 1, [], corr=5))
    assert parse_fetch_v7(c.recv()[1]) == (FETCH_SESSION_ID_NOT_FOUND, 0, {})
    # The session survived both: epoch 3 moves partition 2 past its new record, and
    # nothing else changed: nothing is answered.
    c.send(fetch_v7(sid, 3, [("fs", 2, 2)], corr=6))
    assert parse_fetch_v7(c.recv()[1]) == (0, sid, {})
    # Forgetting every partition closes the session.
    c.send(fetch_v7(sid, 4, [], forgotten=[("fs", p) for p in range(4)], corr=7))
    assert parse_fetch_v7(c.recv()[1]) == (0, 0, {})
    c.send(fetch_v7(sid, 5, [], corr=8))
    assert parse_fetch_v7(c.recv()[1])[0] == FETCH_SESSION_ID_NOT_FOUND
    assert fetch_sessions_metric(broker) == 0
    # Epoch -1: a full fetch without a session.
    c.send(fetch_v7(0, -1, [("fs", 0, 0)], corr=9))
    err, sid, parts = parse_fetch_v7(c.recv()[1])
    assert (err, sid, list(parts)) == (0, 0, [("fs", 0)])
    c.close()


def consume_all(consumer, want, deadline_s=90):
    """Polls until every value in `want` was seen; returns the values read."""
    got = set()
    deadline = time.monotonic() + deadline_s
    while not want <= got:
        assert time.monotonic() < deadline, f"{len(want - got)} records never read"
        got.update(consumer())
    return got


def test_consumers_read_many_partitions_while_producing(make_broker):
    broker = make_broker(cores=2)
    topic, partitions, per_round = "many", 48, 3
    create_topic(broker.addr, topic, partitions)
    producer = Producer({"bootstrap.servers": broker.addr, "acks": "all", "linger.ms": 5})
    produced, errors, stop = [], [], threading.Event()

    def keep_producing():
        n = 0
        while not stop.is_set():
            for p in range(partitions):
                for _ in range(per_round):
                    value = f"{p}-{n}".encode()
                    producer.produce(topic, value=value, partition=p,
                                     on_delivery=lambda err, msg: (errors if err else produced).append(
                                         err or msg.value()))
                    n += 1
            producer.flush(30)
            time.sleep(0.05)  # pacing of the load, not synchronisation

    writer = threading.Thread(target=keep_producing)
    writer.start()
    try:
        # kafka-python: incremental fetch sessions by default.
        from kafka import KafkaConsumer, TopicPartition

        def kafka_python():
            kc = KafkaConsumer(bootstrap_servers=broker.addr, enable_auto_commit=False,
                               auto_offset_reset="earliest", fetch_max_wait_ms=200)
            assert kc.config["enable_incremental_fetch_sessions"]
            kc.assign([TopicPartition(topic, p) for p in range(partitions)])
            kc.seek_to_beginning()

            def poll():
                out = []
                for records in kc.poll(timeout_ms=500).values():
                    out.extend(r.value for r in records)
                return out
            poll.close = kc.close
            return poll

        def librdkafka():
            cc = Consumer({"bootstrap.servers": broker.addr, "group.id": "fs-rdkafka",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False})
            cc.subscribe([topic])

            def poll():
                out = []
                for m in cc.consume(500, timeout=0.5):
                    if m.error() is None:
                        out.append(m.value())
                    else:
                        check_consumer_error(m.error())
                return out
            poll.close = cc.close
            return poll

        # Wait for some records, then read while the producer goes on.
        wait_until(lambda: len(produced) >= partitions * per_round * 3, timeout=60, what="records produced")
        want = set(produced)
        consumer = kafka_python()
        try:
            got = consume_all(consumer, want)
            # It read through an incremental fetch session (it holds it until closed).
            assert fetch_sessions_metric(broker) >= 1, "kafka-python holds no fetch session"
        finally:
            consumer.close()
        consumer = librdkafka()
        try:
            got2 = consume_all(consumer, set(produced))
        finally:
            consumer.close()
    finally:
        stop.set()
        writer.join()
    assert not errors, errors[:5]
    assert want <= got
    # Every record read is one that was produced (nothing invented or garbled).
    everything = set(produced)
    assert got <= everything and got2 <= everything


# --- Fetch v13 (flexible encoding, topics by id) -----------------------------------

def uvarint_(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def read_uvarint(buf, pos):
    n = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, pos


def topic_id_of(bootstrap, name):
    from confluent_kafka import TopicCollection
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_topics(TopicCollection([name]))[name].result(timeout=20)
    u = desc.topic_id
    mask = (1 << 64) - 1
    return struct.pack(">QQ", u.get_most_significant_bits() & mask, u.get_least_significant_bits() & mask)


def fetch_v13(session_id, epoch, parts, forgotten=(), corr=1):
    """parts: [(topic id bytes, partition, fetch_offset)]; forgotten: [(topic id, partition)]."""
    body = struct.pack(">hhi", 1, 13, corr) + string("e2e") + b"\x00"
    body += struct.pack(">iiiibii", -1, 0, 0, 50 << 20, 0, session_id, epoch)
    for items, enc in ((parts, lambda p: struct.pack(">iiqiqi", p[1], -1, p[2], -1, -1, 1 << 20) + b"\x00"),
                       (forgotten, lambda p: struct.pack(">i", p[1]))):
        topics = {}
        for p in items:
            topics.setdefault(p[0], []).append(p)
        body += uvarint_(len(topics) + 1)
        for t, ps in topics.items():
            body += t + uvarint_(len(ps) + 1) + b"".join(enc(p) for p in ps) + b"\x00"
    body += uvarint_(1) + b"\x00"  # rack_id "", tagged fields
    return frame(body)


def skip_tags(buf, pos):
    n, pos = read_uvarint(buf, pos)
    for _ in range(n):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    return pos


def parse_fetch_v13(resp):
    """resp: after the v0 header's correlation id. -> (error, session, {(topic id, partition):
    (error, hw, records)})"""
    pos = skip_tags(resp, 0)
    _throttle, err, session = struct.unpack_from(">ihi", resp, pos); pos += 10
    n_topics, pos = read_uvarint(resp, pos)
    out = {}
    for _ in range(n_topics - 1):
        tid = resp[pos:pos + 16]; pos += 16
        n_parts, pos = read_uvarint(resp, pos)
        for _ in range(n_parts - 1):
            p, perr, hw, _lso, _start = struct.unpack_from(">ihqqq", resp, pos); pos += 30
            n_aborted, pos = read_uvarint(resp, pos)
            for _ in range(max(n_aborted - 1, 0)):
                pos += 16
                pos = skip_tags(resp, pos)
            pos += 4  # preferred read replica
            rl, pos = read_uvarint(resp, pos)
            recs = resp[pos:pos + max(rl - 1, 0)]; pos += max(rl - 1, 0)
            pos = skip_tags(resp, pos)
            out[(tid, p)] = (perr, hw, recs)
        pos = skip_tags(resp, pos)
    return err, session, out


FETCH_SESSION_TOPIC_ID_ERROR = 106
UNKNOWN_TOPIC_ID = 100


def test_fetch_v13_sessions_key_topics_by_id(broker):
    create_topic(broker.addr, "ids", 2)
    for p in range(2):
        produce_one(broker.addr, "ids", p, f"id-{p}".encode())
    tid = topic_id_of(broker.addr, "ids")
    c = Conn(broker.addr)
    c.send(fetch_v13(0, 0, [(tid, 0, 0), (tid, 1, 0)]))
    err, sid, parts = parse_fetch_v13(c.recv()[1])
    assert err == 0 and sid > 0 and sorted(parts) == [(tid, 0), (tid, 1)]
    assert all(e == 0 and hw == 1 and f"id-{p}".encode() in recs for (_, p), (e, hw, recs) in parts.items())
    # Offsets moved past the records: nothing to answer.
    c.send(fetch_v13(sid, 1, [(tid, 0, 1), (tid, 1, 1)], corr=2))
    assert parse_fetch_v13(c.recv()[1]) == (0, sid, {})
    # The same session through Fetch v7 (topics by name) is refused.
    c.send(fetch_v7(sid, 2, [], corr=3))
    assert parse_fetch_v7(c.recv()[1]) == (FETCH_SESSION_TOPIC_ID_ERROR, 0, {})
    # New data on partition 1 only.
    produce_one(broker.addr, "ids", 1, b"again")
    c.send(fetch_v13(sid, 2, [], corr=4))
    err, got, parts = parse_fetch_v13(c.recv()[1])
    assert (err, got, list(parts)) == (0, sid, [(tid, 1)]) and b"again" in parts[(tid, 1)][2]
    # Forgetting by id closes the session; an unknown topic id is UNKNOWN_TOPIC_ID.
    c.send(fetch_v13(sid, 3, [], forgotten=[(tid, 0), (tid, 1)], corr=5))
    assert parse_fetch_v13(c.recv()[1]) == (0, 0, {})
    bogus = bytes(15) + b"\x01"
    c.send(fetch_v13(0, -1, [(bogus, 0, 0)], corr=6))
    err, sid, parts = parse_fetch_v13(c.recv()[1])
    assert (err, sid) == (0, 0) and parts[(bogus, 0)][0] == UNKNOWN_TOPIC_ID
    c.close()
