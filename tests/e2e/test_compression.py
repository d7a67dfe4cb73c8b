"""Tier: black-box compression with real clients (issue 12 item 2): the topic config
`compression.type` makes the leader store every batch with the topic's codec, whatever
the producer used (broker-side recompression, as Kafka); `producer` keeps the
producer's codec. Old clients (message formats v0/v1) produce and read snappy and lz4
message sets. The codec a batch is stored with is read from the partition's segment
file (attribute bits 0..2 of each v2 batch header). Every wait is bounded.
"""
import glob
import os
import struct
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewTopic)

import kafka_wire as kw
from conftest import read_all, check_consumer_error, wait_until

CODEC_IDS = {"none": 0, "uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PRODUCER_CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
TOPIC_CODECS = ["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"]
UNSUPPORTED_COMPRESSION_TYPE = 76


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create(admin, name, config=None):
    admin.create_topics([NewTopic(name, 1, 1, config=config or {})])[name].result(timeout=30)


def stored_codecs(broker, topic, batches):
    """The codec id of every batch in partition 0's segment files, in offset order, once
    they hold at least `batches` batches: the shard journal writes a partition's
    segment file behind the acknowledgement (within about a second of its last append,
    docs/architecture.md, "The shard journal")."""
    return wait_until(lambda: (lambda c: c if len(c) >= batches else None)(codecs_on_disk(broker, topic)),
                      timeout=20, what=f"{batches} batches of {topic}-0 in its segment files")


def codecs_on_disk(broker, topic):
    files = sorted(glob.glob(os.path.join(broker.data_dir, "**", f"{topic}-0", "*.log"), recursive=True))
    assert files, f"no segment of {topic}-0 under {broker.data_dir}"
    codecs = []
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + 61 <= len(data):
            (length,) = struct.unpack_from(">i", data, pos + 8)
            if length <= 0:  # preallocated zeros after the last batch
                break
            assert data[pos + 16] == 2, "v2 batch"
            (attributes,) = struct.unpack_from(">h", data, pos + 21)
            codecs.append(attributes & 7)
            pos += 12 + length
    return codecs


def produce(addr, topic, codec, n, tag):
    """n records (key, value, header, timestamp) with librdkafka's `codec`, one batch."""
    p = Producer({"bootstrap.servers": addr, "compression.type": codec, "linger.ms": 50,
                  "enable.idempotence": True})
    sent = []
    for i in range(n):
        key = f"{tag}-k{i}".encode()
        value = (f"{tag} value {i} " * 20).encode()  # compressible
        ts = 1_700_000_000_000 + i
        p.produce(topic, value, key, partition=0, timestamp=ts, headers=[("codec", codec.encode())])
        sent.append((key, value, [("codec", codec.encode())], ts))
    assert p.flush(30) == 0
    return sent


def consume_all(addr, topic, n):
    c = Consumer({"bootstrap.servers": addr, "group.id": unique("g"), "enable.auto.commit": False,
                  "enable.partition.eof": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        def more():
            m = c.poll(0.5)
            if m is not None:
                if m.error():
                    check_consumer_error(m.error())
                else:
                    got.append((m.key(), m.value(), m.headers() or [], m.timestamp()[1]))
            return len(got) >= n
        wait_until(more, timeout=60, what=f"{n} records of {topic}")
    finally:
        c.close()
    return got


def kcat(*args, input=None, timeout=60):
    r = subprocess.run(["kcat", *args], input=input, capture_output=True, timeout=timeout)
    assert r.returncode == 0, f"kcat {args} failed: {r.stderr.decode(errors='replace')}"
    return r.stdout.decode()


def old(fallback):
    """librdkafka as a client of `fallback` brokers. Only fallbacks before 0.10 stay
    old: from 0.10.0 on librdkafka asks ApiVersions and speaks the broker's versions."""
    return ["-X", "api.version.request=false", "-X", f"broker.version.fallback={fallback}"]


def test_every_producer_codec_on_every_topic_codec(broker):
    """Each producer codec x each topic codec: the records read back (by confluent-kafka
    and kcat) are the ones sent, with keys, headers and timestamps; the stored batches
    have the topic's codec (the producer's under `producer`)."""
    admin = AdminClient({"bootstrap.servers": broker.addr})
    for topic_codec in TOPIC_CODECS:
        topic = unique(f"c-{topic_codec}")
        create(admin, topic, {"compression.type": topic_codec})
        sent = []
        for codec in PRODUCER_CODECS:
            sent += produce(broker.addr, topic, codec, 5, codec)
        got = consume_all(broker.addr, topic, len(sent))
        assert got == sent, topic_codec
        lines = kcat("-b", broker.addr, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
                     "-f", "%k=%s\n").splitlines()
        assert lines == [f"{k.decode()}={v.decode()}" for k, v, _, _ in sent], topic_codec
        codecs = stored_codecs(broker, topic, len(PRODUCER_CODECS))
        assert len(codecs) == len(PRODUCER_CODECS), codecs
        if topic_codec == "producer":
            assert codecs == [CODEC_IDS[c] for c in PRODUCER_CODECS]
        else:
            assert codecs == [CODEC_IDS[topic_codec]] * len(PRODUCER_CODECS), topic_codec


def test_zstd_producer_on_an_lz4_topic_read_by_kcat(broker):
    """The issue's case: a zstd producer, an lz4 topic, kcat reads it; the batch on disk
    is lz4."""
    admin = AdminClient({"bootstrap.servers": broker.addr})
    topic = unique("zstd-on-lz4")
    create(admin, topic, {"compression.type": "lz4"})
    sent = produce(broker.addr, topic, "zstd", 50, "z")
    out = kcat("-b", broker.addr, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k %s %T\n")
    assert out.splitlines() == [f"{k.decode()} {v.decode()} {ts}" for k, v, _, ts in sent]
    assert stored_codecs(broker, topic, 1) == [CODEC_IDS["lz4"]]


def test_fetch_before_v10_of_a_zstd_topic_is_unsupported_compression(broker):
    """KIP-110, as Kafka: a topic with compression.type=zstd answers Fetch v0-v9
    UNSUPPORTED_COMPRESSION_TYPE; modern clients read it."""
    admin = AdminClient({"bootstrap.servers": broker.addr})
    topic = unique("zstd-topic")
    create(admin, topic, {"compression.type": "zstd"})
    produce(broker.addr, topic, "none", 3, "n")
    c = kw.Conn(broker.addr)
    try:
        c.send(kw.fetch_v4(topic, 0, 0, max_wait_ms=0))
        _, body = c.recv()
        [(_, _, err, _, recs)] = kw.parse_fetch_v4(body)
    finally:
        c.close()
    assert (err, recs) == (UNSUPPORTED_COMPRESSION_TYPE, b"")
    assert len(consume_all(broker.addr, topic, 3)) == 3


@pytest.mark.parametrize("codec", ["snappy", "lz4"])
def test_old_clients_produce_and_read_compressed_message_sets(broker, codec):
    """Message format v0 (kcat as a 0.9 client; its lz4 frames carry Kafka's old header
    checksum) and v1 (kafka-python as a 0.10.1 client) with snappy/lz4 wrappers: stored
    as batches of the same codec, read back by old and modern clients, together with a
    modern producer's batches of that codec."""
    from kafka import KafkaConsumer, KafkaProducer
    topic = unique(f"old-{codec}")
    lines = [f"k{i % 3}:v{i} " + "x" * 40 for i in range(100)]
    payload = "\n".join(lines).encode() + b"\n"
    kcat("-b", broker.addr, *old("0.9.0"), "-P", "-t", topic, "-p", "0", "-K", ":", "-z", codec,
         input=payload)
    p = KafkaProducer(bootstrap_servers=broker.addr, api_version=(0, 10, 1), compression_type=codec,
                      linger_ms=50)
    for line in lines:
        k, v = line.split(":", 1)
        p.send(topic, v.encode(), k.encode(), partition=0)
    p.flush(30)
    p.close()
    kcat("-b", broker.addr, "-P", "-t", topic, "-p", "0", "-K", ":", "-z", codec, input=payload)
    want = [f"{i} {line}" for i, line in enumerate(lines * 3)]
    for client in [old("0.9.0"), []]:
        out = kcat("-b", broker.addr, *client, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
                   "-f", "%o %k:%s\n")
        assert out.splitlines() == want, client
    c = KafkaConsumer(bootstrap_servers=broker.addr, api_version=(0, 10, 1), auto_offset_reset="earliest",
                      enable_auto_commit=False, consumer_timeout_ms=10_000)
    c.assign([__import__("kafka").TopicPartition(topic, 0)])
    got = []
    for m in c:
        got.append(f"{m.offset} {m.key.decode()}:{m.value.decode()}")
        if len(got) == len(want):
            break
    c.close()
    assert got == want
    codecs = stored_codecs(broker, topic, 3)
    assert len(codecs) >= 3 and set(codecs) == {CODEC_IDS[codec]}, codecs


def test_old_client_cannot_read_zstd_batches(broker):
    """zstd exists only in v2 batches: an old consumer's Fetch (v3 here, kafka-python as a
    0.10.1 client) of zstd data gets UNSUPPORTED_COMPRESSION_TYPE, as from Kafka, and a
    modern one reads it."""
    admin = AdminClient({"bootstrap.servers": broker.addr})
    topic = unique("old-zstd")
    create(admin, topic)
    produce(broker.addr, topic, "zstd", 3, "z")
    assert stored_codecs(broker, topic, 1) == [CODEC_IDS["zstd"]]
    c = kw.Conn(broker.addr)
    try:
        # Fetch v3: v4's layout without isolation level; records as message sets (magic 1).
        body = kw.header(1, 3, 5) + struct.pack(">iiii", -1, 0, 1, 1 << 20)
        body += struct.pack(">i", 1) + kw.string(topic) + struct.pack(">i", 1)
        body += struct.pack(">iqi", 0, 0, 1 << 20)
        c.send(kw.frame(body))
        _, resp = c.recv()
    finally:
        c.close()
    # throttle, topics, name, partitions, partition, error
    pos = 4 + 4 + 2 + len(topic) + 4
    _partition, err = struct.unpack_from(">ih", resp, pos)
    assert err == UNSUPPORTED_COMPRESSION_TYPE
    assert len(consume_all(broker.addr, topic, 3)) == 3


def test_incremental_alter_configs_sets_compression_type(broker):
    """compression.type through IncrementalAlterConfigs: described back, applied to the
    next batches; a codec Kafka does not know is INVALID_CONFIG."""
    admin = AdminClient({"bootstrap.servers": broker.addr})
    topic = unique("alter-codec")
    create(admin, topic)
    produce(broker.addr, topic, "gzip", 3, "before")

    def alter(value):
        res = ConfigResource("topic", topic, incremental_configs=[
            ConfigEntry("compression.type", value, incremental_operation=AlterConfigOpType.SET)])
        return admin.incremental_alter_configs([res])[res]

    alter("zstd").result(timeout=30)
    res = ConfigResource("topic", topic)
    entries = admin.describe_configs([res])[res].result(timeout=30)
    assert entries["compression.type"].value == "zstd"
    produce(broker.addr, topic, "snappy", 3, "after")
    assert stored_codecs(broker, topic, 2) == [CODEC_IDS["gzip"], CODEC_IDS["zstd"]]
    with pytest.raises(KafkaException) as info:
        alter("brotli").result(timeout=30)
    assert info.value.args[0].code() == 40, "INVALID_CONFIG"
    assert "brotli" in info.value.args[0].str()
    assert len(consume_all(broker.addr, topic, 6)) == 6


def test_compaction_of_lz4_batches_keeps_one_record_per_key(make_broker):
    """A compacted topic fed by an lz4 producer: batches of 20 records whose key sets
    overlap from one batch to the next, so cleaning must rewrite batches (drop some of
    their records) and not only drop whole ones. After the cleaner has run (500 ms
    interval), reading from the beginning gives one record per key — its latest value,
    at the offset it was written at — and every stored batch is still lz4."""
    b = make_broker(extra=["--log-cleaner-backoff-ms", "500"])
    admin = AdminClient({"bootstrap.servers": b.addr})
    topic = unique("lz4compact")
    create(admin, topic, {"cleanup.policy": "compact", "segment.bytes": "4096",
                          "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"})
    p = Producer({"bootstrap.servers": b.addr, "compression.type": "lz4", "linger.ms": 20,
                  "acks": "all"})
    produced, latest = {}, {}

    def on_delivery(err, msg):
        assert err is None, err
        k, v = msg.key().decode(), msg.value().decode()
        produced[msg.offset()] = (k, v)
        if k != "filler":
            latest[k] = (msg.offset(), v)

    for round_ in range(12):
        for i in range(20):
            key = f"k{(round_ * 7 + i) % 30}"
            p.produce(topic, f"value {key} round {round_} ".encode() * 3, key.encode(),
                      partition=0, on_delivery=on_delivery)
        assert p.flush(30) == 0  # one batch per round
    for i in range(80):  # rolls the segments holding the rounds: they become cleanable
        p.produce(topic, f"f{i}".encode(), b"filler", partition=0, on_delivery=on_delivery)
        assert p.flush(30) == 0
    total = len(produced)
    assert total == 12 * 20 + 80

    def compacted():
        recs = read_all(b.addr, topic)
        keyed = [k for (_, k, _) in recs if k != "filler"]
        return len(recs) < total and len(keyed) == 30 and len(set(keyed)) == 30 and recs

    recs = wait_until(compacted, timeout=60, interval=0.5, what="the cleaner to compact lz4 batches")
    by_key = {k: (o, v) for (o, k, v) in recs if k != "filler"}
    assert by_key == latest, "the latest value of every key, at its original offset"
    assert all(produced[o] == (k, v) for (o, k, v) in recs), "records are what was written there"
    offsets = [o for (o, _, _) in recs]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    # The batches holding the keyed records are still lz4 (librdkafka sends the
    # one-record filler batches uncompressed: lz4 does not shrink them).
    spans = stored_batch_spans(b, topic)
    for (o, k, _) in recs:
        if k != "filler":
            codec = [c for (lo, hi, c) in spans if lo <= o <= hi]
            assert codec == [CODEC_IDS["lz4"]], (o, k, codec)


def stored_batch_spans(broker, topic):
    """(base offset, last offset, codec id) of every batch in partition 0's segments."""
    files = sorted(glob.glob(os.path.join(broker.data_dir, "**", f"{topic}-0", "*.log"), recursive=True))
    spans = []
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + 61 <= len(data):
            (base, length) = struct.unpack_from(">qi", data, pos)
            if length <= 0:  # preallocated zeros after the last batch
                break
            (attributes, last_delta) = struct.unpack_from(">hi", data, pos + 21)
            spans.append((base, base + last_delta, attributes & 7))
            pos += 12 + length
    return spans
