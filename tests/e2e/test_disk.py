"""Disk full and I/O errors (issue 15): a broker whose data disk fills refuses appends
at once with KAFKA_STORAGE_ERROR and keeps serving everything else, and resumes by
itself when space returns; an I/O error on one partition's files takes only that
partition offline until its files can be read again; a failed metadata journal write
ends the process with a clear message and a non-zero code.

The full disk is a small ext4 file system on a loop device this test creates (the
tests run as root; nothing else here needs it). I/O errors come from the storage
crate's fault layer (`--fault-rules FILE`, a test-only flag): this kernel has no
device-mapper, and io_uring bypasses LD_PRELOAD.
"""
import os
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition, OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_wire as kw
from conftest import SLUICE_BIN, Broker, check_brokers, wait_until

KAFKA_STORAGE_ERROR = 56
RECORD = 4096


@pytest.fixture
def small_fs(tmp_path):
    """A 128 MiB ext4 file system mounted on a loop device; unmounted afterwards."""
    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "128M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, f"mounting a loop file system needs root: {r.stderr.strip()}"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def admin(addr):
    return AdminClient({"bootstrap.servers": addr})


def create_topic(addr, name, partitions=1, deadline=30):
    a = admin(addr)  # kept alive until the answer: its futures do not hold it
    a.create_topics([NewTopic(name, partitions, 1)], request_timeout=15)[name].result(timeout=deadline)


def values(start, n):
    return [f"{i:08d}".encode().ljust(RECORD, b"x") for i in range(start, start + n)]


def produce(conn, topic, partition, vals, corr=[0]):
    """One acks=all produce request on a wire connection -> (error code, base offset)."""
    corr[0] += 1
    conn.send(kw.produce_v3(topic, partition, kw.record_batch(vals), acks=-1, corr=corr[0]))
    _, body = conn.recv()
    [(_, _, err, base)] = kw.parse_produce_v3(body)
    return err, base


def read_all(addr, topic, partition, deadline=60):
    """{offset: value} of every record from the earliest offset to the end."""
    c = Consumer({"bootstrap.servers": addr, "group.id": f"read-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    out = {}
    end = time.monotonic() + deadline
    try:
        while time.monotonic() < end:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(f"reading {topic}-{partition}: {m.error()}")
            out[m.offset()] = m.value()
        raise AssertionError(f"reading {topic}-{partition} did not reach its end in {deadline}s")
    finally:
        c.close()


def describe(addr):
    """`sluice cluster describe` output."""
    r = subprocess.run([SLUICE_BIN, "cluster", "describe", "--bootstrap-server", addr],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def check_acked(addr, topic, partition, acked):
    """Every acknowledged record is readable at its offset with its value."""
    stored = read_all(addr, topic, partition)
    for base, vals in acked:
        for i, v in enumerate(vals):
            assert stored.get(base + i) == v, f"{topic}-{partition}: acknowledged offset {base + i} lost"
    return stored


@pytest.mark.broker_log_errors(r"below its free-space minimum")
def test_full_disk_refuses_appends_keeps_serving_and_resumes_without_restart(small_fs, tmp_path, request):
    b = Broker(small_fs / "data").start()
    try:
        create_topic(b.addr, "fill")
        conn = kw.Conn(b.addr, timeout=30)
        acked, refused, other = [], 0, []
        # Fill with acks=all batches of 32 x 4 KiB until the broker refuses; then a few
        # more, each of which must be refused at once with KAFKA_STORAGE_ERROR.
        n = 0
        while refused < 20:
            vals = values(n, 32)
            err, base = produce(conn, "fill", 0, vals)
            if err == 0:
                assert refused == 0, "an append was acknowledged after the broker refused one"
                acked.append((base, vals))
                n += len(vals)
            elif err == KAFKA_STORAGE_ERROR:
                refused += 1
            else:
                other.append(err)
            assert not other, f"unexpected produce errors {other}"
            assert n < 200_000, "the 128 MiB disk never filled"
        assert n * RECORD > 64 << 20, f"refused after only {n} records"
        st = os.statvfs(small_fs)
        assert st.f_bavail * st.f_frsize > 0, "the broker kept no reserve"
        assert "APPENDS REFUSED (disk full)" in describe(b.addr)

        # Everything else keeps working: Metadata, Fetch of every acknowledged record,
        # topic creation (the metadata journal), a group's offset commit.
        assert "fill" in admin(b.addr).list_topics(timeout=10).topics
        check_acked(b.addr, "fill", 0, acked)
        create_topic(b.addr, "made-while-full")
        g = Consumer({"bootstrap.servers": b.addr, "group.id": "while-full",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        g.subscribe(["fill"])
        m = wait_until(lambda: (lambda m: m if m is not None and not m.error() else None)(g.poll(1.0)),
                       timeout=30, what="a group member's first record")
        g.commit(message=m, asynchronous=False)
        assert g.committed([TopicPartition("fill", 0)], timeout=10)[0].offset == m.offset() + 1
        g.close()

        # SIGKILL while full, restart: everything acknowledged is there, and appends
        # are still refused.
        conn.close()
        b.kill()
        b.start()
        check_acked(b.addr, "fill", 0, acked)
        conn = kw.Conn(b.addr, timeout=30)
        assert produce(conn, "fill", 0, values(0, 32))[0] == KAFKA_STORAGE_ERROR

        # Deleting the topic frees its space: appends resume with no restart, also for
        # a default librdkafka producer.
        a = admin(b.addr)
        a.delete_topics(["fill"], request_timeout=15)["fill"].result(timeout=30)
        wait_until(lambda: produce(conn, "made-while-full", 0, values(0, 1))[0] == 0,
                   timeout=30, what="appends accepted again after the topic was deleted")
        conn.close()
        p = Producer({"bootstrap.servers": b.addr})
        delivered = []
        for i in range(100):
            p.produce("made-while-full", value=b"after-%d" % i,
                      on_delivery=lambda err, msg: delivered.append(err))
        assert p.flush(30) == 0
        assert delivered == [None] * 100
        assert "appends resume" in b.read_log()
        assert "APPENDS REFUSED" not in describe(b.addr)
    finally:
        check_brokers([b], [r"below its free-space minimum"])


def write_rules(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@pytest.mark.parametrize("op", ["write", "sync"])
@pytest.mark.broker_log_errors(r"partition offline after an I/O error")
def test_io_error_takes_one_partition_offline_until_its_files_read_back(make_broker, tmp_path, op):
    rules = tmp_path / "faults"
    b = make_broker(extra=["--fault-rules", str(rules)])
    create_topic(b.addr, "io", partitions=2)
    conn = kw.Conn(b.addr, timeout=30)
    acked = {0: [], 1: []}
    for n in range(5):
        for p in (0, 1):
            err, base = produce(conn, "io", p, values(n * 4, 4))
            assert err == 0
            acked[p].append((base, values(n * 4, 4)))

    write_rules(rules, f"{op} eio io-0/\n")
    # The broker re-reads the rules file every 50 ms: appends succeed until it has.
    def refused():
        vals = values(100, 4)
        err, base = produce(conn, "io", 0, vals)
        assert err in (0, KAFKA_STORAGE_ERROR), err
        if err == 0:
            acked[0].append((base, vals))
        return err == KAFKA_STORAGE_ERROR
    wait_until(refused, timeout=10, what="the first refused append")
    codes = [produce(conn, "io", 0, values(100 + i, 4))[0] for i in range(10)]
    assert codes == [KAFKA_STORAGE_ERROR] * 10, f"produce to the failed partition answered {codes}"
    # The other partition keeps working, the failed one also refuses reads.
    err, base = produce(conn, "io", 1, values(200, 4))
    assert err == 0
    acked[1].append((base, values(200, 4)))
    conn.send(kw.fetch_v4("io", 0, 0, corr=777))
    [(_, _, err, _, _)] = kw.parse_fetch_v4(conn.recv()[1])
    assert err == KAFKA_STORAGE_ERROR
    wait_until(lambda: "partition offline after an I/O error" in b.read_log(), timeout=10,
               what="the offline partition logged")
    assert b.read_log().count("partition offline after an I/O error") == 1, "logged once"
    assert "io-0 on broker 1" in describe(b.addr)

    # The fault is gone: the partition reopens (recovery re-reads it) by itself and
    # holds everything acknowledged before.
    write_rules(rules, "")
    wait_until(lambda: produce(conn, "io", 0, values(300, 4))[0] == 0, timeout=60,
               what="the partition back online")
    conn.close()
    for p in (0, 1):
        check_acked(b.addr, "io", p, acked[p])
    assert "partition back online" in b.read_log()
    assert "Partitions offline after I/O errors (0;" in describe(b.addr)


def test_failed_metadata_journal_write_exits_with_a_clear_message(make_broker, tmp_path):
    rules = tmp_path / "faults"
    b = make_broker(extra=["--fault-rules", str(rules)])
    write_rules(rules, "write eio __cluster_metadata\nsync eio __cluster_metadata\n")
    wait_until(lambda: "storage fault rules armed" in b.read_log() and "__cluster_metadata" in b.read_log(),
               timeout=10, what="the fault rules armed")
    # Any metadata change writes the journal: a topic creation.
    a = admin(b.addr)
    fut = a.create_topics([NewTopic("never", 1, 1)], request_timeout=5)["never"]
    assert b.exited(timeout=30) == 74
    # Settle the request here: a future left pending completes on librdkafka's thread
    # later, and a client garbage-collected there aborts the whole test process.
    assert fut.exception(timeout=30) is not None, "the topic was created"
    del fut, a
    assert "writing the metadata journal failed" in b.read_log()
    b.expect_errors(r"persisting the metadata log failed", r"sluice: fatal")


def test_io_error_on_a_leader_moves_leadership_and_acks_all_goes_on(tmp_path):
    """3 brokers, RF=3, min.insync.replicas=2, a librdkafka acks=all stream: the
    leader's files of the partition start failing writes. The partition goes offline
    there, the controller moves leadership to an in-sync replica, the stream goes on
    with no acknowledged record lost; once the fault is gone the replica reopens,
    catches up and rejoins the ISR."""
    from cluster import Cluster
    from test_cluster import DURABLE, Acks, check_log, producer
    rules = tmp_path / "faults"
    c = Cluster(tmp_path / "cluster", n=3, extra=["--fault-rules", str(rules)]).start()
    try:
        topic = "moving"
        c.create_topic(topic, partitions=1, rf=3, configs=DURABLE)
        victim = c.leader_of(topic, 0)
        acks = Acks()
        p = producer(c.bootstrap)
        seq, armed_at, moved = 0, None, False
        end = time.monotonic() + 90
        while not (moved and acks.count() >= armed_at + 300):
            try:
                p.produce(topic, value=f"{seq:06d}".encode(), partition=0, on_delivery=acks)
                seq += 1
            except BufferError:
                pass
            p.poll(0.005)
            assert time.monotonic() < end, f"stream stuck: {acks.count()} acked, armed at {armed_at}"
            if armed_at is None and acks.count() >= 300:
                write_rules(rules, f"write eio node-{victim}/{topic}-0/\n")
                armed_at = acks.count()
            elif armed_at is not None and not moved and seq % 50 == 0:
                moved = c.leader_of(topic, 0) not in (-1, victim)
        assert p.flush(40) == 0
        assert not acks.failed, f"failed deliveries: {acks.failed[:3]}"
        assert victim not in c.isr_of(topic, 0)
        assert "partition offline after an I/O error" in c.log(victim)
        check_log(c, topic, [0], acks.acked)

        write_rules(rules, "")
        wait_until(lambda: c.isr_of(topic, 0) == [1, 2, 3], timeout=60,
                   what=f"broker {victim} back in the ISR")
    finally:
        c.stop([r"partition offline after an I/O error"])
