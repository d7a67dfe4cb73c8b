"""Tier: black-box with confluent-kafka (librdkafka 2.16)."""
import collections

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import check_consumer_error, wait_until


def create_topic(addr, name, partitions, config=None):
    admin = AdminClient({"bootstrap.servers": addr})
    fs = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})])
    fs[name].result(timeout=30)
    return admin


def produce_keyed(addr, topic, n, keys=50, acks="all", start=0):
    """Produces n keyed records; returns the delivery reports [(key, value, partition, offset)]."""
    p = Producer({"bootstrap.servers": addr, "acks": acks, "linger.ms": 5, "enable.idempotence": False})
    reports, errors = [], []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            reports.append((msg.key().decode(), msg.value().decode(), msg.partition(), msg.offset()))

    for i in range(start, start + n):
        p.produce(topic, key=f"key-{i % keys}", value=f"value-{i}", on_delivery=cb)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors
    return reports


def consume_assigned(addr, topic, partitions, expected, timeout=60):
    c = Consumer({"bootstrap.servers": addr, "group.id": "unused", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []

    def more():
        for m in c.consume(num_messages=1000, timeout=0.5):
            if m.error():
                check_consumer_error(m.error())  # end of partition or transient, else fails
                continue
            got.append((m.key().decode(), m.value().decode(), m.partition(), m.offset()))
        return len(got) >= expected

    wait_until(more, timeout=timeout, interval=0, what=f"{expected} records")
    # Nothing beyond what was produced.
    extra = c.consume(num_messages=1000, timeout=1.0)
    assert not [m for m in extra if not m.error()]
    c.close()
    return got


def check_round_trip(reports, got):
    assert len(got) == len(reports)
    assert sorted(got, key=lambda r: (r[2], r[3])) == sorted(reports, key=lambda r: (r[2], r[3])), \
        "every record at the partition and offset its delivery report gave"
    by_key = collections.defaultdict(list)
    for k, v, _, _ in sorted(got, key=lambda r: (r[2], r[3])):
        by_key[k].append(int(v.split("-")[1]))
    for k, vs in by_key.items():
        assert vs == sorted(vs), f"order of {k}"


def test_keyed_acks_all_round_trip_over_8_partitions(broker):
    create_topic(broker.addr, "orders", 8)
    reports = produce_keyed(broker.addr, "orders", 20000)
    assert {r[2] for r in reports} == set(range(8))
    got = consume_assigned(broker.addr, "orders", 8, len(reports))
    check_round_trip(reports, got)


def test_admin_configs_partitions_and_delete(broker):
    from confluent_kafka.admin import ConfigResource, ConfigEntry, AlterConfigOpType
    admin = create_topic(broker.addr, "adm", 2, {"retention.ms": "3600000"})
    res = ConfigResource(ConfigResource.Type.TOPIC, "adm")
    cfg = admin.describe_configs([res])[res].result(timeout=30)
    assert cfg["retention.ms"].value == "3600000"
    assert cfg["segment.bytes"].value == "1073741824"
    res2 = ConfigResource(ConfigResource.Type.TOPIC, "adm", incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res2])[res2].result(timeout=30)
    cfg = admin.describe_configs([res])[res].result(timeout=30)
    assert cfg["retention.ms"].value == "7200000"
    from confluent_kafka.admin import NewPartitions
    admin.create_partitions([NewPartitions("adm", 5)])["adm"].result(timeout=30)
    md = admin.list_topics(timeout=10)
    assert len(md.topics["adm"].partitions) == 5
    admin.delete_topics(["adm"])["adm"].result(timeout=30)
    assert "adm" not in admin.list_topics(timeout=10).topics


def test_delete_records_and_list_offsets(broker):
    create_topic(broker.addr, "dr", 1)
    produce_keyed(broker.addr, "dr", 100)
    admin = AdminClient({"bootstrap.servers": broker.addr})
    fut = admin.delete_records([TopicPartition("dr", 0, 40)])
    low = fut[TopicPartition("dr", 0, 40)].result(timeout=30) if isinstance(fut, dict) else fut
    c = Consumer({"bootstrap.servers": broker.addr, "group.id": "x"})
    lo, hi = c.get_watermark_offsets(TopicPartition("dr", 0), timeout=10)
    assert (lo, hi) == (40, 100), low
    c.close()


def test_offsets_for_times_and_describe_cluster(broker):
    create_topic(broker.addr, "times", 1)
    p = Producer({"bootstrap.servers": broker.addr, "acks": "all", "linger.ms": 0})
    base = 1_700_000_000_000
    for i in range(10):
        p.produce("times", value=b"v%d" % i, timestamp=base + i * 1000)
        p.flush(30)  # one batch per record, so every record has its own timestamp entry
    c = Consumer({"bootstrap.servers": broker.addr, "group.id": "t"})
    [r] = c.offsets_for_times([TopicPartition("times", 0, base + 4500)], timeout=10)
    assert r.offset == 5
    [r] = c.offsets_for_times([TopicPartition("times", 0, base + 99_000)], timeout=10)
    assert r.offset in (-1, 10), "past the newest record: none (the end)"
    [r] = c.offsets_for_times([TopicPartition("times", 0, 0)], timeout=10)
    assert r.offset == 0
    c.close()
    admin = AdminClient({"bootstrap.servers": broker.addr})
    desc = admin.describe_cluster().result(timeout=30)
    assert [n.id for n in desc.nodes] == [1] and desc.controller.id == 1
    assert desc.cluster_id and len(desc.cluster_id) == 22


def test_list_offsets_by_spec_with_the_admin_client(broker):
    """AdminClient.list_offsets: earliest, latest, max-timestamp (KIP-734: the first
    record with the largest timestamp, not the last record) and by timestamp."""
    from confluent_kafka.admin import OffsetSpec
    a = create_topic(broker.addr, "times", 1)
    p = Producer({"bootstrap.servers": broker.addr, "linger.ms": 0})
    stamps = [1_000, 5_000, 3_000, 5_000, 2_000]
    for i, ts in enumerate(stamps):
        p.produce("times", value=b"%d" % i, partition=0, timestamp=ts)
        p.flush(10)  # one batch per record: max-timestamp must look inside the log
    tp = TopicPartition("times", 0)

    def offset(spec):
        r = a.list_offsets({tp: spec}, request_timeout=10)[tp].result(timeout=15)
        return r.offset, r.timestamp

    assert offset(OffsetSpec.earliest())[0] == 0
    assert offset(OffsetSpec.latest())[0] == 5
    assert offset(OffsetSpec.max_timestamp()) == (1, 5_000)
    assert offset(OffsetSpec.for_timestamp(2_500)) == (1, 5_000)
    assert offset(OffsetSpec.for_timestamp(9_000))[0] == -1


def test_list_offsets_answers_the_leader_epoch_of_the_record_found(broker):
    """ListOffsets v4+ carries the epoch a record was written in (earliest, by
    timestamp) and the current one for latest, as Kafka: a consumer validating its
    position after a seek (KIP-320) asks the leader about that epoch. A restart of the
    one broker starts a new leader epoch."""
    from confluent_kafka.admin import OffsetSpec
    a = create_topic(broker.addr, "epochs", 1)
    tp = TopicPartition("epochs", 0)

    def produce(value, ts):
        p = Producer({"bootstrap.servers": broker.addr, "linger.ms": 0})
        p.produce("epochs", value=value, partition=0, timestamp=ts)
        assert p.flush(30) == 0

    def listed(spec):
        r = a.list_offsets({tp: spec}, request_timeout=10)[tp].result(timeout=15)
        return r.offset, r.leader_epoch

    produce(b"first", 1_000)
    first_epoch = listed(OffsetSpec.latest())[1]
    assert first_epoch >= 0
    broker.stop()
    broker.start()
    a = AdminClient({"bootstrap.servers": broker.addr})
    wait_until(lambda: listed(OffsetSpec.latest())[1] > first_epoch, 30, what="a new leader epoch")
    produce(b"second", 2_000)
    latest = listed(OffsetSpec.latest())
    assert latest[0] == 2 and latest[1] > first_epoch, latest
    assert listed(OffsetSpec.earliest()) == (0, first_epoch)
    assert listed(OffsetSpec.for_timestamp(500)) == (0, first_epoch)
    assert listed(OffsetSpec.for_timestamp(1_500)) == (1, latest[1])


def test_every_kafka_topic_config_is_accepted_and_described(broker):
    """Standard topic configs Kafka clients and tools set (they were refused as unknown
    names); DescribeConfigs lists every one; a value Sluice cannot honour is refused
    with INVALID_CONFIG, not accepted silently (compression.type is honoured:
    test_compression.py)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource
    configs = {"compression.type": "producer", "file.delete.delay.ms": "1000",
               "max.compaction.lag.ms": "60000", "min.cleanable.dirty.ratio": "0.1",
               "segment.jitter.ms": "10", "index.interval.bytes": "8192",
               "message.format.version": "3.0-IV1", "message.timestamp.before.max.ms": "3600000"}
    a = create_topic(broker.addr, "standard", 1, config=configs)
    res = ConfigResource(ConfigResource.Type.TOPIC, "standard")
    described = a.describe_configs([res])[res].result(timeout=15)
    for k, v in configs.items():
        assert described[k].value == v, k
    for k in ("segment.index.bytes", "preallocate", "message.downconversion.enable",
              "remote.storage.enable", "flush.messages"):
        assert k in described, k
    # Tiered storage is not built: asking for it is refused, not ignored.
    fs = a.create_topics([NewTopic("tiered", 1, 1, config={"remote.storage.enable": "true"})])
    with pytest.raises(KafkaException) as e:
        fs["tiered"].result(timeout=15)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_timestamps_outside_the_topic_bounds_are_refused(broker):
    """message.timestamp.before.max.ms (KIP-937): a record a day old on a topic that
    accepts an hour fails with INVALID_TIMESTAMP; a current one is delivered."""
    import time
    create_topic(broker.addr, "bounded", 1, config={"message.timestamp.before.max.ms": "3600000"})
    p = Producer({"bootstrap.servers": broker.addr})
    reports = {}
    now = int(time.time() * 1000)
    for name, ts in (("old", now - 86_400_000), ("now", now)):
        p.produce("bounded", value=name.encode(), timestamp=ts,
                  on_delivery=lambda err, msg, name=name: reports.__setitem__(name, err))
        p.flush(15)
    assert reports["now"] is None
    assert reports["old"] is not None and reports["old"].code() == KafkaError.INVALID_TIMESTAMP
