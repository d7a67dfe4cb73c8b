"""Tier: tiered storage (issue 44) end to end. Real `sluice serve` processes with
`--remote-storage` on a folder (file://) or on a real S3-compatible server (moto's
server mode, from PyPI, on loopback), real clients (confluent-kafka at its defaults,
kcat): a topic with remote.storage.enable=true and a small local window keeps only
that window on disk while every record from offset 0 reads back byte-identical, in
order, with its timestamp, from the object store; ListOffsets finds old timestamps
there; read_committed over remote segments drops exactly the aborted transactions;
remote retention and topic deletion delete the objects; a store that is down holds
nothing up but the uploads and remote reads, which resume by themselves, until the
segments waiting to upload pass the upload backlog budget, past which appends to the
tiered topic are refused (retriably: they land once the store is back); a leader
SIGKILLed mid-upload hands over without a gap, and the old one serves remote reads
after its restart; a leader elected uncleanly replaces what the old one uploaded past
where their logs part, so consumers read its records there, never the old one's."""
import os
import socket
import subprocess
import threading
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka import ElectionType
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

import kafka_wire as kw
from cluster import Cluster, free_ports
from conftest import SLUICE_BIN, wait_until

FAST = ["--log-retention-check-interval-ms", "200", "--remote-log-manager-task-interval-ms", "200"]
SEGMENT = 4096
WINDOW = 8192
T0 = int(time.time() * 1000) - 600_000  # the records' own timestamps: T0 + 10 ms per offset
TIERED = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT),
          "local.retention.bytes": str(WINDOW)}


def value(i):
    return (f"record-{i:06d}-" + "x" * 80).encode()


def produce(addr, topic, start, n, per_batch=20, timestamp=lambda i: T0 + 10 * i):
    """Records start..start+n, flushed every `per_batch` (so segments roll often);
    the producer at its defaults. Returns the offsets the delivery reports gave."""
    p = Producer({"bootstrap.servers": addr, "linger.ms": 5})
    offsets, errors = [], []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            offsets.append(msg.offset())
    for i in range(start, start + n):
        p.produce(topic, value=value(i), key=str(i).encode(), partition=0, timestamp=timestamp(i), on_delivery=cb)
        if (i - start) % per_batch == per_batch - 1:
            assert p.flush(30) == 0
    assert p.flush(30) == 0
    assert not errors, errors
    return sorted(offsets)


def consume(addr, topic, n, isolation="read_uncommitted", timeout=60, start=0):
    """Up to n records from offset `start`: [(offset, key, value, timestamp)]."""
    c = Consumer({"bootstrap.servers": addr, "group.id": f"tiered-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "isolation.level": isolation})
    c.assign([TopicPartition(topic, 0, start)])
    got = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                if m.error() is None:
                    got.append((m.offset(), m.key(), m.value(), m.timestamp()[1]))
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"consumer error {m.error()}")
    finally:
        c.close()
    return got


def assert_every_record(got, offsets):
    """`got` is exactly the records at `offsets`, in order, byte-identical."""
    assert [g[0] for g in got] == offsets, f"offsets {[g[0] for g in got][:5]}... of {len(got)}"
    for off, key, val, ts in got:
        i = int(key)
        assert (val, ts) == (value(i), T0 + 10 * i), f"record at {off}"


def local_logs(data_dir, topic):
    d = os.path.join(data_dir, f"{topic}-0")
    return sorted(f for f in os.listdir(d) if f.endswith(".log"))


def folder_objects(root, suffix=".log"):
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.join(d, f) for f in files if f.endswith(suffix) and not f.startswith(".")]
    return sorted(out)


def watermarks(addr, topic):
    c = Consumer({"bootstrap.servers": addr, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        c.close()


def offset_for_time(addr, topic, ts):
    c = Consumer({"bootstrap.servers": addr, "group.id": "times"})
    try:
        return c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)[0].offset
    finally:
        c.close()


def create(addr, name, config, rf=1):
    admin = AdminClient({"bootstrap.servers": addr})
    admin.create_topics([NewTopic(name, 1, rf, config=config)])[name].result(timeout=30)
    return admin


def wait_tiered(data_dirs, topic, remote_logs, at_least, deadline=60):
    """Until the local directories hold only their window and the store at least
    `at_least` segments."""
    def done():
        local = max(len(local_logs(d, topic)) for d in data_dirs)
        return local <= WINDOW // SEGMENT + 2 and len(remote_logs()) >= at_least
    wait_until(done, deadline, what=f"{topic}: local window only, {at_least}+ remote segments")


def test_a_tiered_topic_keeps_its_local_window_and_serves_every_record_from_the_store(make_broker, tmp_path):
    remote = tmp_path / "remote"
    b = make_broker(extra=["--remote-storage", f"file://{remote}"] + FAST)
    create(b.addr, "tiered", TIERED)
    offsets = produce(b.addr, "tiered", 0, 1000)
    assert offsets == list(range(1000))
    wait_tiered([b.data_dir], "tiered", lambda: folder_objects(remote), 20)
    # The oldest records are on no local disk any more.
    first_local = int(local_logs(b.data_dir, "tiered")[0].split(".")[0])
    assert first_local > 500
    assert_every_record(consume(b.addr, "tiered", 1000), offsets)
    # Clients see the remote start; ListOffsets finds an old timestamp remotely.
    assert watermarks(b.addr, "tiered") == (0, 1000)
    # Earliest-local (-4) is the leader's disk, latest-tiered (-5) the store's end.
    conn = kw.Conn(b.addr)
    conn.send(kw.list_offsets_v1("tiered", [0], timestamp=-4))
    assert kw.parse_list_offsets_v1(conn.recv()[1]) == {0: (0, first_local)}
    active_base = int(local_logs(b.data_dir, "tiered")[-1].split(".")[0])

    def latest_tiered():
        conn.send(kw.list_offsets_v1("tiered", [0], timestamp=-5, corr=2))
        return kw.parse_list_offsets_v1(conn.recv()[1])
    wait_until(lambda: latest_tiered() == {0: (0, active_base - 1)}, 20, what="every closed segment uploaded")
    conn.close()
    assert offset_for_time(b.addr, "tiered", T0 + 10 * 123) == 123
    assert offset_for_time(b.addr, "tiered", T0 + 10 * 123 - 5) == 123
    # kcat reads them all too.
    out = subprocess.run(["kcat", "-C", "-b", b.addr, "-t", "tiered", "-o", "beginning", "-e", "-q",
                          "-f", "%o %s\n"], capture_output=True, timeout=60, check=True).stdout.decode()
    lines = out.splitlines()
    assert len(lines) == 1000 and lines[0] == f"0 {value(0).decode()}" and lines[-1].startswith("999 ")
    # `sluice cluster describe` shows the bytes in the store beside the local ones
    # (DescribeLogDirs' entry for the store).
    out = subprocess.run([SLUICE_BIN, "cluster", "describe", "--bootstrap-server", b.addr],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    section = out.stdout.split(f"Tiered storage (file://{remote})", 1)[1]
    row = [ln.split() for ln in section.splitlines() if ln.split()[:1] == ["tiered"]]
    assert row and row[0][1] == "1" and row[0][-1] in ("KiB", "MiB"), section
    # The metrics count the uploads and the remote reads.
    metrics = urllib.request.urlopen(b.metrics_url + "/metrics", timeout=10).read().decode()

    def total(name):
        return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + "{"))
    assert total("sluice_remote_uploaded_segments_total") >= 20
    assert total("sluice_remote_fetches_total") > 0
    assert total("sluice_remote_fetch_bytes_total") > 0
    assert total("sluice_remote_upload_errors_total") == 0
    # After a SIGKILL the remote log is still known: reads from 0 are the same. An
    # upload the kill cut short leaves objects no segment names (made here by copying
    # one under another id): the restarted leader deletes them, and only them.
    named = folder_objects(remote, "")
    folder = os.path.dirname(named[0])
    orphan = os.path.join(folder, "00000000000000000000-" + "ab" * 16 + ".log")
    with open(named[0], "rb") as src, open(orphan, "wb") as dst:
        dst.write(src.read())
    b.kill()
    b.start()
    assert_every_record(consume(b.addr, "tiered", 1000), offsets)
    wait_until(lambda: not os.path.exists(orphan), 60, what="the orphaned object deleted")
    assert folder_objects(remote, "") == named


def test_delete_records_below_the_local_start_moves_the_remote_start(make_broker, tmp_path):
    remote = tmp_path / "remote"
    b = make_broker(extra=["--remote-storage", f"file://{remote}"] + FAST)
    admin = create(b.addr, "dr", TIERED)
    offsets = produce(b.addr, "dr", 0, 1000)
    wait_tiered([b.data_dir], "dr", lambda: folder_objects(remote), 20)
    before = len(folder_objects(remote))
    local_start = int(local_logs(b.data_dir, "dr")[0].split(".")[0])
    assert local_start > 300
    [res] = admin.delete_records([TopicPartition("dr", 0, 300)]).values()
    assert res.result(timeout=30).low_watermark == 300
    assert watermarks(b.addr, "dr") == (300, 1000)
    # The segments wholly below 300 are gone from the store; the one holding it stays.
    assert 0 < len(folder_objects(remote)) < before
    assert_every_record(consume(b.addr, "dr", 700, start=300), offsets[300:])
    # A consumer asking for less is out of range (and resets: here to the earliest).
    c = Consumer({"bootstrap.servers": b.addr, "group.id": "dr", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.assign([TopicPartition("dr", 0, 100)])
    first = None
    deadline = time.monotonic() + 30
    while first is None and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            first = m.offset()
    c.close()
    assert first == 300
    # remote.log.copy.disable: nothing more is uploaded (the latest tiered offset stays),
    # the local log keeps what retention.* keeps, and old data still reads remotely.
    def latest_tiered():
        conn = kw.Conn(b.addr)
        conn.send(kw.list_offsets_v1("dr", [0], timestamp=-5))
        try:
            return kw.parse_list_offsets_v1(conn.recv()[1])[0]
        finally:
            conn.close()
    res = ConfigResource("topic", "dr", set_config={**TIERED, "remote.log.copy.disable": "true"})
    admin.alter_configs([res])[res].result(timeout=30)
    tiered_end = latest_tiered()
    more = produce(b.addr, "dr", 1000, 400)
    wait_until(lambda: len(local_logs(b.data_dir, "dr")) > WINDOW // SEGMENT + 8, 30,
               what="closed segments staying local")
    assert latest_tiered() == tiered_end
    assert_every_record(consume(b.addr, "dr", 1100, start=300), offsets[300:] + more)
    # A topic with segments in the store cannot stop being tiered (as Kafka before 3.9).
    res = ConfigResource("topic", "dr", set_config={**TIERED, "remote.storage.enable": "false"})
    with pytest.raises(Exception) as e:
        admin.alter_configs([res])[res].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_tiering_is_refused_without_a_store_and_on_compacted_topics(make_broker, tmp_path):
    plain = make_broker()
    admin = AdminClient({"bootstrap.servers": plain.addr})
    fut = admin.create_topics([NewTopic("t", 1, 1, config={"remote.storage.enable": "true"})])["t"]
    with pytest.raises(Exception) as e:
        fut.result(timeout=30)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "Tiered Storage" in str(e.value)
    tiered = make_broker(extra=["--remote-storage", f"file://{tmp_path / 'remote'}"])
    admin = AdminClient({"bootstrap.servers": tiered.addr})
    fut = admin.create_topics([NewTopic("c", 1, 1, config={"remote.storage.enable": "true",
                                                            "cleanup.policy": "compact"})])["c"]
    with pytest.raises(Exception) as e:
        fut.result(timeout=30)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_read_committed_over_remote_segments_drops_exactly_the_aborted_transactions(make_broker, tmp_path):
    remote = tmp_path / "remote"
    b = make_broker(extra=["--remote-storage", f"file://{remote}"] + FAST)
    create(b.addr, "txn", TIERED)
    p = Producer({"bootstrap.servers": b.addr, "transactional.id": "tiered-txn"})
    p.init_transactions(30)
    committed, i = [], 0
    for t in range(60):
        p.begin_transaction()
        batch = []
        for _ in range(15):
            p.produce("txn", value=value(i), key=str(i).encode(), partition=0, timestamp=T0 + 10 * i)
            batch.append(i)
            i += 1
        # Flushed first: an abort purges what the producer has not sent yet, and the
        # aborted records must reach the log for this test to mean anything.
        p.flush(30)
        if t % 3 == 2:
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
            committed += batch
    wait_tiered([b.data_dir], "txn", lambda: folder_objects(remote), 10)
    assert os.path.exists(folder_objects(remote, ".txnindex")[0])
    got = consume(b.addr, "txn", len(committed), isolation="read_committed")
    assert [int(k) for _, k, _, _ in got] == committed
    assert all(v == value(int(k)) for _, k, v, _ in got)
    # read_uncommitted sees the aborted records as well.
    everything = consume(b.addr, "txn", i)
    assert sorted(int(k) for _, k, _, _ in everything) == list(range(i))


class Gate:
    """A TCP forwarder on 127.0.0.1:<port> to an upstream port that can be shut (the
    listener closed and every connection cut: the store is unreachable) and opened
    again on the same port."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.port = free_ports(1)[0]
        self.holding = False  # accept, and answer nothing: a store that hangs
        self.conns = []
        self.lock = threading.Lock()
        self.open()

    def open(self):
        self.listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def shut(self):
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self.listener.close()
        self.cut()

    def hang(self):
        """From now on connections are taken and never answered."""
        self.holding = True
        self.cut()

    def cut(self):
        with self.lock:
            for s in self.conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self.conns.clear()

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self.holding:
                with self.lock:
                    self.conns.append(client)
                continue
            up = socket.create_connection(("127.0.0.1", self.upstream))
            with self.lock:
                self.conns += [client, up]
            for a, z in ((client, up), (up, client)):
                threading.Thread(target=self._pipe, args=(a, z), daemon=True).start()

    @staticmethod
    def _pipe(a, z):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                z.sendall(data)
        except OSError:
            pass
        for s in (a, z):
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def s3(tmp_path):
    """A moto S3 server on loopback with one bucket; yields (boto3 client, endpoint
    port, bucket)."""
    import boto3
    port = free_ports(1)[0]
    log = open(tmp_path / "moto.log", "wb")
    proc = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")

    def up():
        try:
            client.create_bucket(Bucket="sluice")
            return True
        except Exception as e:  # noqa: BLE001 - not listening yet
            if proc.poll() is not None:
                raise AssertionError(f"moto_server exited: {e}")
            return False
    wait_until(up, 60, what="moto S3 server answering")
    yield client, port, "sluice"
    proc.terminate()
    proc.wait(10)


def s3_env(port):
    return {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


def s3_keys(client, bucket, suffix=".log"):
    keys, token = [], None
    while True:
        kw = {"Bucket": bucket, "Prefix": "cluster-a/"}
        if token:
            kw["ContinuationToken"] = token
        r = client.list_objects_v2(**kw)
        keys += [o["Key"] for o in r.get("Contents", []) if o["Key"].endswith(suffix)]
        if not r.get("IsTruncated"):
            return sorted(keys)
        token = r["NextContinuationToken"]


def test_s3_store_remote_retention_and_topic_deletion_delete_objects(make_broker, s3):
    client, port, bucket = s3
    b = make_broker(extra=["--remote-storage", f"s3://{bucket}/cluster-a"] + FAST, env=s3_env(port))
    admin = create(b.addr, "s3t", TIERED)
    # The first 400 records are two hours old, the rest are new.
    now = int(time.time() * 1000)
    old = produce(b.addr, "s3t", 0, 400, timestamp=lambda i: now - 2 * 3600 * 1000 + i)
    new = produce(b.addr, "s3t", 400, 600, timestamp=lambda i: now + i)
    assert old + new == list(range(1000))
    wait_tiered([b.data_dir], "s3t", lambda: s3_keys(client, bucket), 20)
    got = consume(b.addr, "s3t", 1000)
    assert [g[0] for g in got] == list(range(1000))
    assert all(v == value(int(k)) for _, k, v, _ in got)
    before = len(s3_keys(client, bucket))
    # retention.ms of an hour: the old records' segments go from the store too.
    res = ConfigResource("topic", "s3t", set_config={**TIERED, "retention.ms": "3600000"})
    admin.alter_configs([res])[res].result(timeout=30)
    wait_until(lambda: watermarks(b.addr, "s3t")[0] >= 380, 60, what="log start past the expired records")
    start = watermarks(b.addr, "s3t")[0]
    assert start <= 400
    wait_until(lambda: len(s3_keys(client, bucket)) < before, 30, what="expired objects deleted")
    got = consume(b.addr, "s3t", 1000 - start, start=start)
    assert [g[0] for g in got] == list(range(start, 1000))
    # Deleting the topic empties its folder in the bucket.
    admin.delete_topics(["s3t"])["s3t"].result(timeout=30)
    wait_until(lambda: s3_keys(client, bucket, suffix="") == [], 30, what="deleted topic's objects gone")


def test_a_store_that_is_down_delays_only_uploads_and_remote_reads(make_broker, s3):
    client, port, bucket = s3
    gate = Gate(port)
    b = make_broker(extra=["--remote-storage", f"s3://{bucket}/cluster-a"] + FAST, env=s3_env(gate.port))
    create(b.addr, "down", TIERED)
    first = produce(b.addr, "down", 0, 400)
    wait_tiered([b.data_dir], "down", lambda: s3_keys(client, bucket), 8)
    gate.shut()
    # Produce goes on; nothing is uploaded, so nothing more leaves the local disk.
    second = produce(b.addr, "down", 400, 600)
    assert first + second == list(range(1000))
    wait_until(lambda: len(local_logs(b.data_dir, "down")) > WINDOW // SEGMENT + 6, 30,
               what="segments kept locally while the store is down")
    # A remote read fails (retriably: the client keeps trying), a local one works.
    c = Consumer({"bootstrap.servers": b.addr, "group.id": "down", "enable.auto.commit": False})
    c.assign([TopicPartition("down", 0, 0)])
    assert [m for m in c.consume(10, 3.0) if m.error() is None] == []
    c.close()
    local_start = int(local_logs(b.data_dir, "down")[0].split(".")[0])
    assert local_start > 0
    gate.open()
    wait_tiered([b.data_dir], "down", lambda: s3_keys(client, bucket), 30)
    assert_every_record(consume(b.addr, "down", 1000), list(range(1000)))


def refused_for_backlog(broker):
    """sluice_remote_backlog_appends_refused_total, summed over the shards."""
    from conftest import http_get
    status, text = http_get(broker.metrics_url + "/metrics")
    assert status == 200, text[:300]
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("sluice_remote_backlog_appends_refused_total"))


def test_uploads_waiting_on_a_down_store_are_bounded_by_the_backlog_budget(make_broker, s3):
    """With the store down, closed segments wait locally; past
    --remote-upload-backlog-max-bytes appends to the tiered topic are refused
    (retriable), while a plain topic keeps taking records; once the store is back the
    producer's retries land and nothing is lost or doubled."""
    client, port, bucket = s3
    gate = Gate(port)
    budget = 6 * SEGMENT
    b = make_broker(extra=["--remote-storage", f"s3://{bucket}/budget",
                           "--remote-upload-backlog-max-bytes", str(budget)] + FAST,
                    env=s3_env(gate.port))
    create(b.addr, "budget", TIERED)
    create(b.addr, "plain", {"segment.bytes": str(SEGMENT)})
    gate.shut()
    p = Producer({"bootstrap.servers": b.addr, "linger.ms": 5})  # defaults otherwise
    acked, errors = [], []

    def cb(err, msg):
        (errors if err is not None else acked).append(err or msg.offset())

    def send(lo, hi):
        for i in range(lo, hi):
            p.produce("budget", value=value(i), key=str(i).encode(), partition=0,
                      timestamp=T0 + 10 * i, on_delivery=cb)
    n = 40 * SEGMENT // len(value(0))  # about 40 segments' worth: far past the budget
    # Small batches, each acknowledged before the next (segments roll at batch
    # boundaries), until the broker starts refusing.
    sent = 0
    while sent < n and refused_for_backlog(b) == 0:
        send(sent, min(sent + 20, n))
        sent = min(sent + 20, n)
        wait_until(lambda: p.poll(0.02) >= 0 and (len(acked) >= sent or refused_for_backlog(b) > 0),
                   30, what="a batch acknowledged or refused")
    assert sent < n, "the budget never refused an append"
    assert "appends to tiered topics are refused until uploads catch up" in b.read_log()

    def closed_bytes():
        """The closed segments' bytes (the active one's file is preallocated)."""
        logs = local_logs(b.data_dir, "budget")[:-1]
        return sum(os.path.getsize(os.path.join(b.data_dir, "budget-0", f)) for f in logs)
    assert closed_bytes() > budget, (closed_bytes(), budget)
    held = watermarks(b.addr, "budget")[1]
    # The rest is refused (the producer keeps retrying): the log stops growing.
    send(sent, n)
    end = time.monotonic() + 2
    while time.monotonic() < end:
        p.poll(0.1)
    assert watermarks(b.addr, "budget")[1] <= held + 20, (held, n)
    assert len(acked) < n
    # A topic without tiered storage is not held back.
    assert produce(b.addr, "plain", 0, 100) == list(range(100))
    gate.open()
    assert p.flush(120) == 0
    assert not errors, errors[:3]
    assert sorted(acked) == list(range(n)), "every offset acknowledged once"
    # Retried batches may land in another order (the producer is not idempotent by
    # default): every record is there once, byte-identical.
    got = consume(b.addr, "budget", n)
    assert [g[0] for g in got] == list(range(n))
    assert sorted(int(key) for (_, key, _, _) in got) == list(range(n))
    for _, key, val, ts in got:
        assert (val, ts) == (value(int(key)), T0 + 10 * int(key))
    wait_until(lambda: "appends to tiered topics resume" in b.read_log(), 30,
               what="the broker saying appends resume")


def test_a_hanging_store_does_not_hold_up_the_other_partitions_of_a_fetch(make_broker, s3):
    client, port, bucket = s3
    gate = Gate(port)
    b = make_broker(extra=["--remote-storage", f"s3://{bucket}/cluster-a"] + FAST, env=s3_env(gate.port))
    create(b.addr, "old", TIERED)
    create(b.addr, "new", {})
    produce(b.addr, "old", 0, 400)
    wait_tiered([b.data_dir], "old", lambda: s3_keys(client, bucket), 8)
    # The store now takes connections and never answers.
    gate.hang()
    c = Consumer({"bootstrap.servers": b.addr, "group.id": "hang", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 100})
    c.assign([TopicPartition("old", 0, 0), TopicPartition("new", 0, 0)])
    c.poll(1.0)
    produce(b.addr, "new", 0, 20)
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 20 and time.monotonic() < deadline:
        got += [m for m in c.consume(100, 0.5) if m.error() is None and m.topic() == "new"]
    c.close()
    # Each Fetch waited at most ~0.5 s for the store, not its 60 s read timeout.
    assert len(got) == 20


def test_a_leader_killed_mid_upload_hands_over_without_gap_or_duplicate(tmp_path):
    remote = tmp_path / "remote"
    c = Cluster(tmp_path / "c", n=3, extra=["--remote-storage", f"file://{remote}"] + FAST).start()
    try:
        c.create_topic("ha", partitions=1, rf=3, configs={**TIERED, "min.insync.replicas": "2"})
        acked = produce(c.bootstrap, "ha", 0, 600)
        wait_until(lambda: len(folder_objects(remote)) >= 5, 30, what="first uploads")
        old = c.leader_of("ha", 0)
        c.kill(old)
        c.wait_until(lambda: c.leader_of("ha", 0) not in (-1, old), 30, what="a new leader")
        acked += produce(c.bootstrap, "ha", 600, 600)
        assert acked == list(range(1200))
        dirs = [c.data_dir(i) for i in c.ids if i != old]
        wait_tiered(dirs, "ha", lambda: folder_objects(remote), 40)
        assert_every_record(consume(c.bootstrap, "ha", 1200), acked)
        # The old leader (the preferred replica) comes back and, once it leads again,
        # serves remote reads too.
        c.restart(old)
        c.wait_until(lambda: c.isr_of("ha", 0) == sorted(c.ids), 60, what="full ISR")
        assert c.replicas_of("ha", 0)[0] == old

        def elected():
            if c.leader_of("ha", 0) != old:
                fut = c.admin().elect_leaders(ElectionType.PREFERRED, [TopicPartition("ha", 0)])
                try:
                    fut.result(timeout=10)
                except Exception:  # noqa: BLE001 - ELECTION_NOT_NEEDED and retriable ones
                    pass
            return c.leader_of("ha", 0) == old
        c.wait_until(elected, 30, what="the old leader leads again")
        assert_every_record(consume(c.addr(old), "ha", 1200, timeout=60), acked)
    finally:
        c.stop()


def remote_bases(root):
    """The base offsets of the remote log objects in the store folder."""
    return sorted(int(os.path.basename(f).split("-")[0]) for f in folder_objects(root))


def test_an_unclean_leader_takes_over_the_remote_offsets_its_log_does_not_share(tmp_path):
    """b falls out of the ISR; a alone acknowledges and uploads far past b's log end;
    a dies and b is elected uncleanly. The records b then acknowledges at those offsets
    are what every consumer reads, from b's disk and, once b's retention has moved them
    to the store, from there: b forgets the segments a uploaded past where their logs
    part (and their objects) before it uploads its own."""
    remote = tmp_path / "remote"
    c = Cluster(tmp_path / "c", n=3, extra=["--remote-storage", f"file://{remote}"] + FAST).start()
    try:
        c.create_topic("parted", partitions=1, rf=2, configs={
            **TIERED, "min.insync.replicas": "1", "unclean.leader.election.enable": "true"})
        a, b = c.replicas_of("parted", 0)
        c.wait_until(lambda: c.leader_of("parted", 0) == a
                     and c.isr_of("parted", 0) == sorted([a, b]), 30, what="both in the ISR")
        shared = produce(c.bootstrap, "parted", 0, 200)
        assert shared == list(range(200))
        c.kill(b)
        c.wait_until(lambda: c.isr_of("parted", 0) == [a], 30, what=f"an ISR without broker {b}")
        assert produce(c.bootstrap, "parted", 1000, 600) == list(range(200, 800))
        wait_until(lambda: remote_bases(remote) and remote_bases(remote)[-1] >= 500, 60,
                   what="a's uploads well past b's log end")
        c.kill(a)
        c.restart(b)
        c.wait_until(lambda: c.leader_of("parted", 0) == b, 40, what=f"broker {b} elected uncleanly")
        assert produce(c.bootstrap, "parted", 2000, 600) == list(range(200, 800))
        # b uploads its own records and keeps only its window locally.
        wait_tiered([c.data_dir(b)], "parted", lambda: folder_objects(remote), 10)
        got = consume(c.bootstrap, "parted", 800)
        assert [int(k) for _, k, _, _ in got] == list(range(200)) + list(range(2000, 2600))
        assert_every_record(got, list(range(800)))

        # No object in the store holds a record only a had.
        def a_gone():
            return not [f for f in folder_objects(remote) if b"record-001" in open(f, "rb").read()]
        wait_until(a_gone, 30, what="a's diverging segments deleted from the store")
    finally:
        c.stop()
