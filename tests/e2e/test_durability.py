"""Tier: crash. SIGKILL the broker mid-stream (a real process, no clean-up), restart it
on the same data directory, and read back everything that was acknowledged with
acks=all. Then the same through SIGTERM (clean shutdown)."""
import threading

import pytest

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from conftest import check_consumer_error, wait_until
from test_confluent import consume_assigned, create_topic  # noqa: F401


def consume_to_end(addr, topic, partitions, timeout=120):
    """Everything stored, read until every partition reports end-of-partition. Records
    written but not acknowledged before the kill may be there too; that is allowed."""
    c = Consumer({"bootstrap.servers": addr, "group.id": "unused", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, at_end = [], set()

    def done():
        for m in c.consume(num_messages=1000, timeout=0.5):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                else:
                    check_consumer_error(m.error())  # transient, else fails
                continue
            at_end.discard(m.partition())
            got.append((m.key().decode(), m.value().decode(), m.partition(), m.offset()))
        return len(at_end) == partitions

    wait_until(done, timeout=timeout, interval=0, what="end of every partition")
    c.close()
    return got


def assert_acknowledged_stored(addr, topic, partitions, acked):
    """Every acknowledged (partition, offset, value) is stored there; returns what is
    stored (consume_to_end)."""
    got = consume_to_end(addr, topic, partitions)
    stored = {(p, o): v for _, v, p, o in got}
    missing = [(p, o, v) for p, o, v in acked if stored.get((p, o)) != v]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged records lost, e.g. {missing[:5]}"
    return got


NO_RETRIES = {"acks": "all", "linger.ms": 2, "enable.idempotence": False, "message.timeout.ms": 5000,
              "retries": 0}


def produce_until_stopped(addr, topic, acked, stop, conf=NO_RETRIES, keys=13):
    """Produces `v<i>` under key `k<i % keys>` (every key distinct if `keys` is None)
    until `stop`, appending (partition, offset, value) of each acknowledged record."""
    p = Producer({"bootstrap.servers": addr, **conf})

    def cb(err, msg):
        if err is None:
            acked.append((msg.partition(), msg.offset(), msg.value().decode()))

    i = 0
    while not stop.is_set():
        try:
            p.produce(topic, key=f"k{i if keys is None else i % keys}", value=f"v{i}", on_delivery=cb)
            i += 1
        except BufferError:
            pass
        p.poll(0.001 if i % 100 == 0 else 0)
    p.flush(10)


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_stop_mid_stream_loses_nothing_acknowledged(make_broker, tmp_path, how):
    b = make_broker(data_dir=tmp_path / "d")
    create_topic(b.addr, "dur", 4)
    acked, stop = [], threading.Event()
    t = threading.Thread(target=produce_until_stopped, args=(b.addr, "dur", acked, stop))
    t.start()
    try:
        wait_until(lambda: len(acked) >= 5000, timeout=60, what="5000 acknowledged records")
        if how == "sigkill":
            b.kill()
        else:
            assert b.stop() == 0, "clean exit on SIGTERM with a producer connected"
        n_acked = len(acked)
    finally:
        stop.set()
        t.join(timeout=60)
    snapshot = acked[:n_acked]
    b2 = make_broker(data_dir=tmp_path / "d", port=b.port)
    got = assert_acknowledged_stored(b2.addr, "dur", 4, snapshot)
    assert len(got) >= n_acked


def test_sigterm_then_restart_keeps_topics_and_data(make_broker, tmp_path):
    b = make_broker(data_dir=tmp_path / "d")
    create_topic(b.addr, "clean", 2, {"retention.ms": "86400000"})
    from test_confluent import produce_keyed
    reports = produce_keyed(b.addr, "clean", 1000)
    assert b.stop() == 0, "clean exit on SIGTERM"
    b2 = make_broker(data_dir=tmp_path / "d", port=b.port)
    got = consume_assigned(b2.addr, "clean", 2, len(reports))
    assert sorted(got, key=lambda r: (r[2], r[3])) == sorted(reports, key=lambda r: (r[2], r[3]))
    from confluent_kafka.admin import AdminClient, ConfigResource
    admin = AdminClient({"bootstrap.servers": b2.addr})
    res = ConfigResource(ConfigResource.Type.TOPIC, "clean")
    assert admin.describe_configs([res])[res].result(timeout=30)["retention.ms"].value == "86400000"


def test_sigkill_under_load_over_1000_partitions_loses_nothing_acknowledged(make_broker, tmp_path):
    """Issue 40: acknowledged appends of many partitions are durable through the shard
    journal (one write per round for all of them), the segment files written behind
    it. SIGKILL the broker (2 shards) while a producer at librdkafka's defaults spreads
    acks=all records over 1,000 partitions; the restart replays the journal, and every
    acknowledged record is read back at its offset."""
    data = tmp_path / "d"
    journal = ["--journal-chunk-bytes", str(128 << 20)]  # the default, made explicit
    b = make_broker(data_dir=data, cores=2, extra=journal)
    create_topic(b.addr, "wide", 1000)
    acked, stop = [], threading.Event()
    # librdkafka's defaults (acks=all, idempotence as it ships), keys spread over every
    # partition.
    t = threading.Thread(target=produce_until_stopped,
                         args=(b.addr, "wide", acked, stop, {"linger.ms": 5}, None))
    t.start()
    try:
        wait_until(lambda: len({a[0] for a in acked}) >= 900 and len(acked) >= 20000, timeout=120,
                   what="20,000 acknowledged records over at least 900 partitions")
        b.kill()
        n_acked = len(acked)
    finally:
        stop.set()
        t.join(timeout=60)
    assert any((data / f"wal@{s}").is_dir() for s in (0, 1)), "the killed broker left no journal"
    snapshot = acked[:n_acked]
    b2 = make_broker(data_dir=data, port=b.port, cores=2, extra=journal)
    assert "replayed the previous run's journal" in b2.read_log()
    assert_acknowledged_stored(b2.addr, "wide", 1000, snapshot)
