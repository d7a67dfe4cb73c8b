"""Tier: the CLI contract — config file and flags, port already taken, clean SIGTERM."""
import subprocess
import time

import pytest

from conftest import SLUICE_BIN, Broker, check_brokers
from kafka_wire import Conn, api_versions_v0


def test_refuses_a_port_that_is_taken(broker, tmp_path):
    r = subprocess.run([SLUICE_BIN, "serve", "--listen", broker.addr, "--data-dir", str(tmp_path / "other"),
                        "--cores", "1"], capture_output=True, timeout=30)
    assert r.returncode != 0
    assert b"cannot listen" in r.stderr
    c = Conn(broker.addr)
    assert api_versions_v0(c)[0] == 0


def test_config_file_with_flag_override(tmp_path):
    b = Broker(tmp_path / "d", cores=1)
    cfg = tmp_path / "sluice.toml"
    cfg.write_text(f'listen = "127.0.0.1:1"\nnode_id = 7\ndefault_partitions = 3\n'
                   f'data_dir = "{tmp_path / "ignored"}"\n')
    b.extra = ["--config", str(cfg)]  # --listen and --data-dir flags win over the file
    b.start()
    try:
        out = subprocess.run(["kcat", "-b", b.addr, "-L", "-t", "cfgtopic"], capture_output=True,
                             timeout=30).stdout.decode()
        assert f"broker 7 at {b.addr}" in out
        assert 'topic "cfgtopic" with 3 partitions' in out
        assert not (tmp_path / "ignored").exists()
    finally:
        check_brokers([b])  # still alive, stops with exit code 0, no ERROR in its log


def test_bad_config_is_refused(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("colour = 'blue'\n")
    r = subprocess.run([SLUICE_BIN, "serve", "--config", str(cfg)], capture_output=True, timeout=30)
    assert r.returncode != 0 and b"colour" in r.stderr


@pytest.mark.parametrize("flags,expect", [
    (["--controller-quorum", "1@127.0.0.1:1,1@127.0.0.1:2"], "listed twice"),
    (["--controller-quorum", "1@127.0.0.1:1", "--controller-listen", "127.0.0.1:1",
      "--process-roles", "broker"], "lists this node (1) as a voter"),
    (["--controller-quorum", "2@127.0.0.1:1,3@127.0.0.1:2"], "on a node that joins"),
    (["--controller-quorum", "1@127.0.0.1:1,2@127.0.0.1:2"], "--controller-listen is required"),
    (["--controller-quorum", "one@127.0.0.1:1"], "bad node id"),
    (["--broker-session-timeout-ms", "1000", "--broker-heartbeat-interval-ms", "800"],
     "at most half"),
    (["--node-id", "0"], "at least 1"),
])
def test_bad_cluster_flags_are_refused_clearly(tmp_path, flags, expect):
    r = subprocess.run([SLUICE_BIN, "serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0",
                        *flags], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, r.stdout
    assert expect in r.stderr, r.stderr
    # Nothing was created: a refused start touches no data.
    assert not (tmp_path / "__cluster_metadata").exists()


def sluice_cluster_describe(addr, *extra):
    return subprocess.run([SLUICE_BIN, "cluster", "describe", "--bootstrap-server", addr, *extra],
                          capture_output=True, text=True, timeout=60)


def test_cluster_describe_single_broker(broker):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.addr})
    admin.create_topics([NewTopic("described", 2, 1)])["described"].result(timeout=30)
    r = sluice_cluster_describe(broker.addr)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    controller = int(next(ln for ln in lines if ln.startswith("Controller: ")).split()[1])
    brokers = lines[lines.index("Brokers (1):") + 2].split()
    assert brokers[:3] == [str(controller), broker.addr, "-"] and "controller" in brokers[3], r.stdout
    rows = [ln.split() for ln in lines if ln.startswith("  described ")]
    # TOPIC PARTITION LEADER EPOCH REPLICAS ISR OFFLINE-REPLICAS ERROR, listed once.
    assert [(r_[1], r_[2], r_[4], r_[5], r_[6], r_[7]) for r_ in rows] == \
        [(str(p), str(controller), str(controller), str(controller), "-", "-") for p in (0, 1)], r.stdout
    assert all(int(r_[3]) >= 0 for r_ in rows)
    assert "Under-replicated partitions (0):\n  (none)" in r.stdout
    assert "Offline partitions (0):\n  (none)" in r.stdout
    # --exclude-internal leaves internal topics (__consumer_offsets, once it exists) out.
    assert "__consumer_offsets" not in sluice_cluster_describe(broker.addr, "--exclude-internal").stdout


def test_cluster_describe_unreachable_broker_fails_clearly():
    from conftest import free_port
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    r = sluice_cluster_describe(addr)
    assert r.returncode != 0
    assert r.stdout == ""
    assert f"sluice cluster: cannot reach broker at {addr}" in r.stderr, r.stderr


def sluice(*args, input=None, check=True):
    r = subprocess.run([SLUICE_BIN, *args], input=input, capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, (args, r.stderr)
    return r


def test_topic_config_produce_and_consume_commands(broker):
    """Issue 43 item 6: the topic CLI a Kafka user reaches for first, against a real
    broker and checked against what a real client (confluent-kafka, kcat) sees: topics
    created (with configs and a replica assignment), listed, described, altered, grown
    and deleted; broker and topic configs described and altered; records produced with
    keys and headers and consumed from the beginning, an offset, a time, and a group's
    committed offsets; bad input refused with a clear message."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource
    bs = ["--bootstrap-server", broker.addr]
    sluice("topic", "create", "orders", "--partitions", "3", "--config", "retention.ms=3600000", *bs)
    sluice("topic", "create", "pinned", "--replica-assignment", "1,1", *bs)
    again = sluice("topic", "create", "orders", *bs, check=False)
    assert again.returncode == 1 and "TopicAlreadyExists" in again.stderr
    listed = sluice("topic", "list", "--exclude-internal", *bs).stdout.split("\n")
    assert [ln.split() for ln in listed[1:] if ln] == [["orders", "3", "1"], ["pinned", "2", "1"]]
    admin = AdminClient({"bootstrap.servers": broker.addr})
    md = admin.list_topics(timeout=10).topics
    assert len(md["orders"].partitions) == 3 and len(md["pinned"].partitions) == 2

    described = sluice("topic", "describe", "orders", *bs).stdout
    assert "Topic: orders  PartitionCount: 3  ReplicationFactor: 1" in described
    assert "  Partition: 2  Leader: 1  Replicas: 1  Isr: 1" in described
    assert "retention.ms=3600000  (DYNAMIC_TOPIC_CONFIG)" in described
    sluice("topic", "alter-config", "orders", "--set", "cleanup.policy=compact,delete", "--delete", "retention.ms", *bs)
    res = ConfigResource("topic", "orders")
    cfg = admin.describe_configs([res])[res].result(timeout=30)
    assert cfg["cleanup.policy"].value == "compact,delete" and cfg["retention.ms"].value == "604800000"
    sluice("config", "alter", "--entity-type", "brokers", "--entity-name", "1",
           "--add-config", "log.retention.ms=7200000", *bs)
    brokers = sluice("config", "describe", "--entity-type", "brokers", "--entity-name", "1", *bs).stdout
    assert "log.retention.ms=7200000  (DYNAMIC_BROKER_CONFIG)" in brokers
    # A group's configs (Kafka 3.8+'s GROUP resource), kept through the quorum.
    sluice("config", "alter", "--entity-type", "groups", "--entity-name", "g1",
           "--add-config", "consumer.session.timeout.ms=50000", *bs)
    groups = sluice("config", "describe", "--entity-type", "groups", "--entity-name", "g1", *bs).stdout
    assert "consumer.session.timeout.ms=50000  (GROUP_CONFIG)" in groups
    assert "consumer.heartbeat.interval.ms=5000  (DEFAULT_CONFIG)" in groups
    bad = sluice("config", "alter", "--entity-type", "groups", "--entity-name", "g1",
                 "--add-config", "consumer.session.timeout.ms=5", *bs, check=False)
    assert bad.returncode == 1 and "InvalidConfig" in bad.stderr and "between 45000 and 60000" in bad.stderr
    sluice("topic", "add-partitions", "orders", "--partitions", "4", *bs)
    assert len(admin.list_topics(timeout=10).topics["orders"].partitions) == 4

    # Produce: keys and headers; keyed records go where Kafka's partitioner puts them.
    # Four runs: each partition holds several batches (what --count must stop inside).
    for run in range(4):
        lines = "".join(f"k{i % 5}|v{i}\n" for i in range(run * 10, run * 10 + 10))
        out = sluice("produce", "orders", "--key-separator", "|", "--header", "origin=cli", *bs, input=lines)
        assert "10 records acknowledged" in out.stderr
    import re
    sizes = [int(x) for x in re.findall(r"Size: (\d+)", sluice("topic", "describe", "orders", *bs).stdout)]
    assert len(sizes) == 4 and sum(sizes) > 40 * 4, sizes
    c = Consumer({"bootstrap.servers": broker.addr, "group.id": "check", "enable.auto.commit": False})
    ends = [c.get_watermark_offsets(TopicPartition("orders", p), timeout=10)[1] for p in range(4)]
    c.close()
    assert sum(ends) == 40
    kcat = subprocess.run(["kcat", "-b", broker.addr, "-C", "-t", "orders", "-e", "-q", "-f", "%p %k %s %h\n"],
                          capture_output=True, text=True, timeout=30).stdout.split("\n")
    by_key = {}
    for ln in filter(None, kcat):
        p, k, v, h = ln.split()
        assert h == "origin=cli"
        by_key.setdefault(k, set()).add(p)
    assert len(by_key) == 5 and all(len(ps) == 1 for ps in by_key.values()), by_key

    # Consume: everything, one partition from an offset, by time, with a group.
    got = sluice("consume", "orders", "-e", "-f", "%k=%s [%h]\\n", *bs).stdout.split("\n")
    assert sorted(filter(None, got)) == sorted(f"k{i % 5}=v{i} [origin=cli]" for i in range(40))
    part = int(next(iter(by_key["k0"])))
    tail = sluice("consume", "orders", "--partition", str(part), "--offset", "2", "-e", "-f", "%o\\n", *bs).stdout
    assert tail.split() == [str(o) for o in range(2, ends[part])]
    later = sluice("consume", "orders", "--from-timestamp", str(int(time.time() * 1000) + 60_000), "-e", *bs)
    assert later.stdout == ""
    from confluent_kafka import ConsumerGroupTopicPartitions

    def committed():
        got = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("cli-group")])["cli-group"].result(timeout=30)
        return sum(max(tp.offset, 0) for tp in got.topic_partitions)
    first = sluice("consume", "orders", "--group", "cli-group", "--count", "15", "-e", *bs).stdout.split()
    assert len(first) == 15 and committed() == 15, "exactly what was printed is committed"
    rest = sluice("consume", "orders", "--group", "cli-group", "-e", *bs).stdout.split()
    assert sorted(first + rest) == sorted(f"v{i}" for i in range(40))
    assert committed() == 40

    # Bad input: named, nothing changed.
    for args, want in ((["topic", "create", "x", "--config", "retention.ms"], "expected key=value"),
                       (["consume", "orders", "--offset", "soon"], "--offset soon"),
                       (["config", "describe", "--entity-type", "widgets", "--entity-name", "u"], "--entity-type widgets"),
                       (["produce", "nosuch", "--partition", "9"], "no partition 9")):
        r = sluice(*args, *bs, check=False, input="x\n")
        assert r.returncode != 0 and want in r.stderr, (args, r.stderr)
    sluice("topic", "delete", "orders", "pinned", *bs)
    gone = sluice("topic", "describe", "orders", *bs, check=False)
    assert gone.returncode == 1 and "UnknownTopicOrPartition" in gone.stdout + gone.stderr
