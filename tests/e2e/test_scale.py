"""Scale (issue 14): partitions beyond the process's open-file limit.

Every active segment holds 3 descriptors (.log, .index, .timeindex). The broker splits
its open-file limit between sockets and the shards' storage, and a shard keeps at most
its share of logs with open files, closing the least recently appended idle ones
(src/node.rs `storage_limits`, storage `StorageLimits::active_logs_max`). Here a
broker whose limit is 2,048 descriptors serves 2,000 partitions with a record each
(which would need 6,000 descriptors held open), through a restart."""
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition, OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import check_consumer_error, wait_until

PARTITIONS = 2000
NOFILE = 2048


def read_every_partition(addr, topic):
    c = Consumer({"bootstrap.servers": addr, "group.id": f"scale-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got = {}

        def all_read():
            for m in c.consume(500, timeout=1.0):
                if m.error():
                    check_consumer_error(m.error())
                    continue
                got[m.partition()] = m.value()
            return len(got) == PARTITIONS
        wait_until(all_read, timeout=120, what=f"a record from each of {PARTITIONS} partitions")
        return got
    finally:
        c.close()


def test_partitions_beyond_the_open_file_limit_through_a_restart(make_broker):
    b = make_broker(nofile=NOFILE)
    admin = AdminClient({"bootstrap.servers": b.addr})
    admin.create_topics([NewTopic("wide", PARTITIONS, 1)], request_timeout=60)["wide"].result(timeout=90)
    p = Producer({"bootstrap.servers": b.addr, "linger.ms": 20})  # defaults: acks=all, idempotent
    failed = []
    for i in range(PARTITIONS):
        p.produce("wide", value=f"r{i}".encode(), partition=i,
                  on_delivery=lambda err, m: err and failed.append((m.partition(), err)))
        p.poll(0)
    assert p.flush(120) == 0, "records without a delivery report"
    assert not failed, failed[:5]
    want = {i: f"r{i}".encode() for i in range(PARTITIONS)}
    assert read_every_partition(b.addr, "wide") == want
    b.stop()
    b.start()
    assert read_every_partition(b.addr, "wide") == want
    log = b.read_log()
    assert "Too many open files" not in log
    assert "descriptor budget" in log
