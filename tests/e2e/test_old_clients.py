"""Tier: black-box, old clients. Kafka 3.9 serves old protocol versions; these tests
hold Sluice to Kafka's answers for them: the answer to a version it does not serve
(wire tests), and old clients (librdkafka with `api.version.request=false`, kafka-python
pinned to an old `api_version`) producing and consuming."""
import os
import struct
import subprocess
import time
import zlib

import pytest

from conftest import wait_until
from kafka_wire import Conn, api_versions_v0, frame, header, parse_produce_v3, produce_v3, string

UNSUPPORTED_VERSION = 35


def test_api_versions_from_the_future_gets_kafkas_v0_answer(broker):
    """Kafka answers an ApiVersions request of a version it does not know as v0:
    UNSUPPORTED_VERSION and (KIP-511) only the ApiVersions range; the connection stays
    open and the client retries at a version both know."""
    c = Conn(broker.addr)
    for corr, version in [(8, 99), (9, 4), (10, -1)]:
        c.send(frame(header(18, version, corr)))
        got, body = c.recv()
        err, n = struct.unpack_from(">hi", body, 0)
        assert (got, err, n) == (corr, UNSUPPORTED_VERSION, 1)
        assert struct.unpack_from(">hhh", body, 6) == (18, 0, 3)
        assert len(body) == 6 + 6, "v0: no throttle time after the array"
    err, keys = api_versions_v0(c)
    assert err == 0 and 0 in keys and 1 in keys
    c.close()


def test_unsupported_version_of_any_other_api_closes_the_connection(broker):
    """Kafka refuses a request of an unknown API key or of a version it does not serve
    while parsing its header, and closes the connection without a response."""
    for key, version in [(999, 0), (0, 99), (1, 99), (3, 99), (3, -1)]:
        other = Conn(broker.addr)
        c = Conn(broker.addr)
        c.send(frame(header(key, version, 5)))
        wait_until(c.closed_by_peer, what=f"connection closed after key {key} v{version}")
        err, _ = api_versions_v0(other)
        assert err == 0, "other connections are unaffected"
        other.close()


def _partition_errors(body, per_partition):
    """Walks a v0 response of [topic [partition ...]]: `per_partition(body, pos)` reads
    one partition's fields after its index and returns (value, new pos)."""
    out = []
    pos = 0
    (n_topics,) = struct.unpack_from(">i", body, pos); pos += 4
    for _ in range(n_topics):
        (n,) = struct.unpack_from(">h", body, pos); pos += 2
        topic = body[pos:pos + n].decode(); pos += n
        (n_parts,) = struct.unpack_from(">i", body, pos); pos += 4
        for _ in range(n_parts):
            (p,) = struct.unpack_from(">i", body, pos); pos += 4
            value, pos = per_partition(body, pos)
            out.append((topic, p, value))
    assert pos == len(body), "the whole response was read"
    return out


def test_offset_commit_and_fetch_v0_are_unsupported_as_in_kafka_without_zookeeper(broker):
    """v0 group offsets lived in ZooKeeper; Kafka 3.9 without ZooKeeper answers
    UNSUPPORTED_VERSION for every partition (in a response, connection open)."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": broker.addr})
    p.produce("oc0", b"x")
    p.flush(30)
    c = Conn(broker.addr)
    commit = header(8, 0, 21) + string("g0") + struct.pack(">i", 1) + string("oc0")
    commit += struct.pack(">iiq", 1, 0, 1) + string("")
    c.send(frame(commit))
    corr, body = c.recv()
    got = _partition_errors(body, lambda b, pos: (struct.unpack_from(">h", b, pos)[0], pos + 2))
    assert corr == 21 and got == [("oc0", 0, UNSUPPORTED_VERSION)]
    fetch = header(9, 0, 22) + string("g0") + struct.pack(">i", 1) + string("oc0")
    fetch += struct.pack(">ii", 1, 0)

    def partition(b, pos):
        offset, n = struct.unpack_from(">qh", b, pos)
        pos += 10 + max(n, 0)
        return (offset, struct.unpack_from(">h", b, pos)[0]), pos + 2

    c.send(frame(fetch))
    corr, body = c.recv()
    assert corr == 22 and _partition_errors(body, partition) == [("oc0", 0, (-1, UNSUPPORTED_VERSION))]
    # v1 is served: a commit through v1 is read back through v1.
    commit = header(8, 1, 23) + string("g0") + struct.pack(">i", -1) + string("")
    commit += struct.pack(">i", 1) + string("oc0") + struct.pack(">iiqq", 1, 0, 1, -1) + string("m")
    c.send(frame(commit))
    _, body = c.recv()
    assert _partition_errors(body, lambda b, pos: (struct.unpack_from(">h", b, pos)[0], pos + 2)) == [
        ("oc0", 0, 0)]
    c.send(frame(header(9, 1, 24) + fetch[len(header(9, 0, 22)):]))
    _, body = c.recv()
    assert _partition_errors(body, partition) == [("oc0", 0, (1, 0))]
    c.close()


def test_list_offsets_v0_answers_an_offsets_array(broker):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": broker.addr})
    for i in range(5):
        p.produce("lo0", f"v{i}".encode())
    p.flush(30)
    c = Conn(broker.addr)

    def offsets(b, pos):
        err, n = struct.unpack_from(">hi", b, pos)
        pos += 6
        return (err, list(struct.unpack_from(f">{n}q", b, pos))), pos + 8 * n

    for ts, want in [(-1, [5]), (-2, [0])]:
        req = header(2, 0, 31) + struct.pack(">i", -1) + struct.pack(">i", 1) + string("lo0")
        req += struct.pack(">iiqi", 1, 0, ts, 1)
        c.send(frame(req))
        corr, body = c.recv()
        assert corr == 31 and _partition_errors(body, offsets) == [("lo0", 0, (0, want))]
    req = header(2, 0, 32) + struct.pack(">i", -1) + struct.pack(">i", 1) + string("lo0")
    req += struct.pack(">iiqi", 1, 7, -1, 1)
    c.send(frame(req))
    _, body = c.recv()
    assert _partition_errors(body, offsets) == [("lo0", 7, (3, []))], "UNKNOWN_TOPIC_OR_PARTITION, no offsets"
    c.close()


def _list_offsets_v0(c, topic, parts, replica_id=-1, corr=40):
    """One ListOffsets v0 request for `topic`'s [(partition, timestamp, max_num_offsets)]:
    -> [(partition, error_code, [offsets])] as the broker answered."""
    req = header(2, 0, corr) + struct.pack(">i", replica_id) + struct.pack(">i", 1) + string(topic)
    req += struct.pack(">i", len(parts))
    for p, ts, n in parts:
        req += struct.pack(">iqi", p, ts, n)
    c.send(frame(req))
    got, body = c.recv()
    assert got == corr

    def offsets(b, pos):
        err, n = struct.unpack_from(">hi", b, pos)
        pos += 6
        return (err, list(struct.unpack_from(f">{n}q", b, pos))), pos + 8 * n
    return [(p, err, offs) for _, p, (err, offs) in _partition_errors(body, offsets)]


def _segment_times(data_dir, topic):
    """[(base offset, modification time in ms)] of `topic`-0's segment files, oldest first."""
    d = os.path.join(str(data_dir), f"{topic}-0")
    return sorted((int(f[:-4]), os.stat(os.path.join(d, f)).st_mtime_ns // 1_000_000)
                  for f in os.listdir(d) if f.endswith(".log"))


def test_list_offsets_v0_lists_segment_base_offsets_before_a_time(make_broker, tmp_path):
    """Kafka's "offsets before" (ListOffsets v0 with max_num_offsets): up to that many
    offsets, newest first, from the segment base offsets and the log end; by time, from
    the newest segment whose file was last modified at or before it. Small segments roll
    in two rounds of writes a clock tick apart, so a time between them splits the log."""
    from confluent_kafka import Producer
    from test_confluent import create_topic
    data = tmp_path / "lob-data"
    b = make_broker(data_dir=data)
    topic = "lob"
    create_topic(b.addr, topic, 1, {"segment.bytes": "4096"})
    p = Producer({"bootstrap.servers": b.addr, "linger.ms": 0, "acks": "all"})

    def produce(n):
        for _ in range(n):
            p.produce(topic, b"x" * 1500, partition=0)
            assert p.flush(30) == 0
    produce(8)
    first = _segment_times(data, topic)
    # Every file of the first round is older than `mid` and everything written from now
    # on newer: wait for the clock (file times lag it by a tick at most) to pass it.
    mid = max(t for _, t in first)
    wait_until(lambda: time.time() * 1000 > mid + 50, what="the clock to pass the first round")
    produce(8)
    p.flush(30)
    end = 16
    c = Conn(b.addr)
    segs = _segment_times(data, topic)
    bases = [base for base, _ in segs]
    assert len(bases) >= 5 and bases[0] == 0, f"several segments rolled: {bases}"
    newest_first = sorted(bases, reverse=True)
    got = _list_offsets_v0(c, topic, [(0, -1, 1), (0, -1, 1000), (0, -1, 3), (0, -2, 1), (0, -2, 1000),
                                      (0, -1, 0), (0, -3, 1000), (0, -1, -1), (7, -1, 1)])
    assert got == [
        (0, 0, [end]),
        (0, 0, [end] + newest_first),
        (0, 0, [end] + newest_first[:2]),
        (0, 0, [0]),
        (0, 0, [0]),
        (0, 0, []),
        (0, 0, []),  # no file was modified before -3 (max-timestamp is v7+)
        (0, -1, []),  # UNKNOWN_SERVER_ERROR: Kafka cannot size a negative array
        (7, 3, []),  # UNKNOWN_TOPIC_OR_PARTITION
    ]
    assert _list_offsets_v0(c, "no-such-topic", [(0, -1, 1)]) == [(0, 3, [])]
    # By time: `mid` is after the first round's closed segments and before everything of
    # the second round (the active segment of the first round was written again).
    def before(times):
        return sorted((base for base, t in times if t <= mid), reverse=True)
    hour_later = int(time.time() * 1000) + 3600 * 1000
    got = _list_offsets_v0(c, topic, [(0, mid, 1000), (0, mid, 1), (0, 0, 1000), (0, hour_later, 1000)])
    before_mid = before(segs)
    assert before(_segment_times(data, topic)) == before_mid, "no segment crossed mid while asked"
    assert set(base for base, _ in first[:-1]) <= set(before_mid) <= set(base for base, _ in first), \
        f"mid splits the log between the rounds: {first} then {segs}, mid {mid}"
    assert 0 < len(before_mid) < len(bases)
    assert got == [
        (0, 0, before_mid),
        (0, 0, before_mid[:1]),
        (0, 0, []),
        (0, 0, [end] + newest_first),  # the log end counts as modified now
    ]
    c.close()


def kcat(*args, input=None, timeout=60):
    r = subprocess.run(["kcat", *args], input=input, capture_output=True, timeout=timeout)
    assert r.returncode == 0, f"kcat {args} failed: {r.stderr.decode(errors='replace')}"
    return r.stdout.decode()


def old(fallback):
    """librdkafka settings of a client that speaks only what `fallback` brokers spoke:
    0.10.0 → Produce/Fetch v2 with message format v1, 0.9 → v1 with format v0, 0.8.2 → v0."""
    return ["-X", "api.version.request=false", "-X", f"broker.version.fallback={fallback}"]


FALLBACKS = ["0.10.0.0", "0.9.0", "0.8.2"]


@pytest.mark.parametrize("fallback", FALLBACKS)
def test_old_kcat_round_trip_and_modern_reads_it(broker, fallback):
    topic = "old-w-" + fallback.replace(".", "")
    lines = [f"k{i % 7}:v{i}" for i in range(300)]
    kcat("-b", broker.addr, *old(fallback), "-P", "-t", topic, "-p", "0", "-K", ":",
         input="\n".join(lines).encode() + b"\n")
    fmt = ["-f", "%o %k:%s\n"]
    want = [f"{i} {line}" for i, line in enumerate(lines)]
    out = kcat("-b", broker.addr, *old(fallback), "-C", "-t", topic, "-p", "0", "-o", "beginning",
               "-e", "-q", *fmt)
    assert out.splitlines() == want
    out = kcat("-b", broker.addr, "-C", "-t", topic, "-o", "beginning", "-e", "-q", *fmt)
    assert out.splitlines() == want, "a modern client reads what the old one wrote"
    stamps = kcat("-b", broker.addr, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%T\n")
    stamps = [int(t) for t in stamps.split()]
    if fallback.startswith("0.10"):
        assert all(t > 1_500_000_000_000 for t in stamps), "message format v1 keeps create times"
    else:
        assert all(t == -1 for t in stamps), "message format v0 has no timestamps (Kafka keeps none)"


@pytest.mark.parametrize("fallback", FALLBACKS)
def test_old_kcat_reads_what_a_modern_client_wrote(broker, fallback):
    topic = "old-r-" + fallback.replace(".", "")
    lines = [f"k{i % 5}:v{i}" for i in range(300)]
    kcat("-b", broker.addr, "-P", "-t", topic, "-p", "0", "-K", ":", "-z", "none",
         input="\n".join(lines).encode() + b"\n")
    out = kcat("-b", broker.addr, *old(fallback), "-C", "-t", topic, "-p", "0", "-o", "beginning",
               "-e", "-q", "-f", "%o %k:%s\n")
    assert out.splitlines() == [f"{i} {line}" for i, line in enumerate(lines)]
    # From the middle of a batch: records before the fetch offset are not returned.
    out = kcat("-b", broker.addr, *old(fallback), "-C", "-t", topic, "-p", "0", "-o", "123",
               "-e", "-q", "-f", "%o\n")
    assert [int(x) for x in out.split()] == list(range(123, 300))


def test_old_consumer_skips_transaction_markers_and_reads_uncommitted(broker):
    """Old consumers know no control batches and read uncommitted (Kafka's
    down-conversion): markers vanish, offsets jump over them, aborted records show."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.addr})
    admin.create_topics([NewTopic("old-tx", 1, 1)])["old-tx"].result(30)
    tx = Producer({"bootstrap.servers": broker.addr, "transactional.id": "old-tx"})
    tx.init_transactions(30)
    tx.begin_transaction()
    tx.produce("old-tx", b"committed", partition=0)
    tx.commit_transaction(30)
    tx.begin_transaction()
    tx.produce("old-tx", b"aborted", partition=0)
    tx.flush(30)  # abort_transaction drops what was not sent yet
    tx.abort_transaction(30)
    plain = Producer({"bootstrap.servers": broker.addr})
    plain.produce("old-tx", b"after", partition=0)
    plain.flush(30)
    # librdkafka drops the aborted record itself unless told to read uncommitted.
    for fallback in ["0.10.0.0", "0.9.0"]:
        out = kcat("-b", broker.addr, *old(fallback), "-X", "isolation.level=read_uncommitted", "-C",
                   "-t", "old-tx", "-p", "0", "-o", "beginning", "-e", "-q", "-f", "%o %s\n")
        assert out.splitlines() == ["0 committed", "2 aborted", "4 after"], fallback


@pytest.mark.parametrize("api_version", [(0, 10, 1), (0, 10, 0), (0, 9), (0, 8, 2)])
def test_kafka_python_pinned_to_an_old_broker_version(broker, api_version):
    """kafka-python speaking only what `api_version` brokers spoke: message formats v1
    (0.10) and v0 (0.9, 0.8.2), old Produce/Fetch/ListOffsets, group membership (0.9+)
    and offset commits (OffsetCommit v1/v2, OffsetFetch v1)."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    topic = "kp-" + "".join(map(str, api_version))
    extra = {"enable_idempotence": False} if api_version >= (0, 10) else {}
    p = KafkaProducer(bootstrap_servers=broker.addr, api_version=api_version, acks="all", **extra)
    futs = [p.send(topic, key=b"k%d" % i, value=b"v%d" % i) for i in range(50)]
    p.flush()
    assert [f.get(timeout=30).offset for f in futs] == list(range(50))
    p.close()
    group = topic + "-g"
    c = KafkaConsumer(topic, bootstrap_servers=broker.addr, api_version=api_version, group_id=group,
                      enable_auto_commit=False, auto_offset_reset="earliest", consumer_timeout_ms=10000)
    got = []
    for r in c:
        got.append(r)
        if len(got) == 50:
            break
    assert [(r.offset, r.key, r.value) for r in got] == [(i, b"k%d" % i, b"v%d" % i) for i in range(50)]
    if api_version >= (0, 10):
        assert all(r.timestamp > 1_500_000_000_000 for r in got), "message format v1 keeps create times"
    else:
        assert all(r.timestamp in (None, -1) for r in got), "message format v0 has no timestamps"
    c.commit()
    c.close()
    c = KafkaConsumer(bootstrap_servers=broker.addr, api_version=api_version, group_id=group,
                      enable_auto_commit=False)
    assert c.committed(TopicPartition(topic, 0)) == 50
    c.close()


def test_downconversion_disabled_answers_old_fetchers_unsupported_version(broker):
    """message.downconversion.enable=false: Kafka answers Fetch v0–v3 for the topic with
    UNSUPPORTED_VERSION (and no data); newer fetchers read it as usual."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.addr})
    admin.create_topics([NewTopic("no-down", 1, 1, config={"message.downconversion.enable": "false"})])[
        "no-down"].result(30)
    kcat("-b", broker.addr, "-P", "-t", "no-down", "-p", "0", input=b"a\nb\n")
    c = Conn(broker.addr)

    def partition(b, pos):
        err, hw, n = struct.unpack_from(">hqi", b, pos)
        return (err, hw, n), pos + 14 + n

    for version in range(4):
        req = header(1, version, 41) + struct.pack(">iii", -1, 100, 1)
        if version == 3:
            req += struct.pack(">i", 1 << 20)
        req += struct.pack(">i", 1) + string("no-down") + struct.pack(">i", 1) + struct.pack(">iqi", 0, 0, 1 << 20)
        c.send(frame(req))
        corr, body = c.recv()
        if version >= 1:
            body = body[4:]  # throttle time
        assert corr == 41 and _partition_errors(body, partition) == [("no-down", 0, (UNSUPPORTED_VERSION, -1, 0))]
    c.close()
    out = kcat("-b", broker.addr, "-C", "-t", "no-down", "-o", "beginning", "-e", "-q")
    assert out.splitlines() == ["a", "b"]


@pytest.mark.parametrize("fallback", ["0.10.0.0", "0.9.0"])
def test_gzip_message_sets_both_ways(broker, fallback):
    """gzip-compressed message sets from an old producer are stored as a v2 batch of the
    same records; gzip batches from a modern producer reach an old consumer."""
    topic = "old-gz-" + fallback.replace(".", "")
    lines = [f"k{i % 3}:v{i}" for i in range(200)]
    kcat("-b", broker.addr, *old(fallback), "-P", "-t", topic, "-p", "0", "-K", ":", "-z", "gzip",
         input="\n".join(lines).encode() + b"\n")
    kcat("-b", broker.addr, "-P", "-t", topic, "-p", "0", "-K", ":", "-z", "gzip",
         input="\n".join(lines).encode() + b"\n")
    want = [f"{i} {line}" for i, line in enumerate(lines + lines)]
    for client in [old(fallback), []]:
        out = kcat("-b", broker.addr, *client, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
                   "-f", "%o %k:%s\n")
        assert out.splitlines() == want, client


def message_v1(value, timestamp=1_700_000_000_000):
    """One uncompressed message of format v1 (magic 1), offset 0, null key."""
    body = struct.pack(">bbq", 1, 0, timestamp) + struct.pack(">i", -1) + struct.pack(">i", len(value)) + value
    crc = zlib.crc32(body)
    return struct.pack(">qiI", 0, 4 + len(body), crc) + body


def test_produce_v3_refuses_message_sets_v2_takes_them(broker):
    """From Produce v3 on only v2 batches are valid (Kafka: INVALID_RECORD); Produce v2
    takes the same message set."""
    c = Conn(broker.addr)
    c.send(produce_v3("ms", 0, message_v1(b"old")))
    _, body = c.recv()
    assert parse_produce_v3(body)[0][2] == 87, "INVALID_RECORD"
    req = header(0, 2, 5) + struct.pack(">hi", -1, 10000) + struct.pack(">i", 1) + string("ms")
    records = message_v1(b"old")
    req += struct.pack(">i", 1) + struct.pack(">ii", 0, len(records)) + records
    c.send(frame(req))
    corr, body = c.recv()
    # v2 response: topic, partition, error, base offset, log-append time; throttle time.
    got = _partition_errors(body[:-4], lambda b, pos: (struct.unpack_from(">hqq", b, pos), pos + 18))
    assert corr == 5 and got == [("ms", 0, (0, 0, -1))]
    c.close()
    out = kcat("-b", broker.addr, "-C", "-t", "ms", "-o", "beginning", "-e", "-q", "-f", "%o %s %T\n")
    assert out.splitlines() == ["0 old 1700000000000"]
