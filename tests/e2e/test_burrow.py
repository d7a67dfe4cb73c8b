"""Burrow (Debian's package, 1.2.1 with sarama inside) pointed at one Sluice broker
reads `__consumer_offsets` and the topics' offsets, lists a consumer group and reports
the same lag as `sluice group describe` (issues 12 and 13).

Burrow coordinates through ZooKeeper: the test starts Debian's zookeeper on a free
loopback port with a temporary data directory, and Burrow with a generated config
(cluster and consumer modules pointing at the broker, HTTP on a free port).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from conftest import SLUICE_BIN, free_port, wait_until

BURROW = shutil.which("Burrow") or shutil.which("burrow")
ZK_JAR = "/usr/share/java/zookeeper.jar"
JAVA = shutil.which("java")

needs_burrow = pytest.mark.skipif(
    not (BURROW and JAVA and os.path.exists(ZK_JAR)),
    reason="Burrow and ZooKeeper (Debian packages burrow, zookeeper) are not installed; "
           "scripts/install-test-deps.sh installs them")

TOPIC = "burrow-watched"
GROUP = "burrow-group"
PARTITIONS = 3
PER_PARTITION = 40
# What the group commits per partition: part of the topic, a different amount each.
COMMITTED = {0: 25, 1: 7, 2: 0}


def four_letter(port, cmd):
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(cmd)
        out = b""
        while chunk := s.recv(4096):
            out += chunk
        return out.decode(errors="replace")


@pytest.fixture
def zookeeper(tmp_path):
    port = free_port()
    data = tmp_path / "zk-data"
    data.mkdir()
    cfg = tmp_path / "zoo.cfg"
    cfg.write_text(
        "tickTime=2000\n"
        f"dataDir={data}\n"
        f"clientPort={port}\n"
        "clientPortAddress=127.0.0.1\n"
        "admin.enableServer=false\n"
        "4lw.commands.whitelist=srvr\n")
    log = open(tmp_path / "zookeeper.log", "wb")
    proc = subprocess.Popen(
        [JAVA, "-Xmx256m", "-cp", f"/etc/zookeeper/conf:{ZK_JAR}",
         "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        def up():
            if proc.poll() is not None:
                raise AssertionError(f"zookeeper exited with {proc.returncode}: "
                                     f"{(tmp_path / 'zookeeper.log').read_text()[-2000:]}")
            # `srvr` reports a mode only once the server takes sessions (`ruok` answers
            # earlier, while sessions are still refused).
            return "Mode: standalone" in four_letter(port, b"srvr")
        wait_until(up, 60, what="zookeeper serving", retry=(OSError,))
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class Burrow:
    def __init__(self, tmp_path, zk, broker_addr, kafka_version):
        self.port = free_port()
        self.dir = tmp_path / "burrow"
        self.dir.mkdir()
        (self.dir / "burrow.toml").write_text(f"""
[general]
pidfile="{self.dir}/burrow.pid"

[logging]
level="info"

[zookeeper]
servers=["{zk}"]
timeout=6
root-path="/burrow"

[client-profile.sluice]
client-id="burrow-test"
kafka-version="{kafka_version}"

[cluster.sluice]
class-name="kafka"
servers=["{broker_addr}"]
client-profile="sluice"
topic-refresh=2
offset-refresh=1

[consumer.sluice]
class-name="kafka"
cluster="sluice"
servers=["{broker_addr}"]
client-profile="sluice"
offsets-topic="__consumer_offsets"
start-latest=false

[httpserver.default]
address="127.0.0.1:{self.port}"

[storage.default]
class-name="inmemory"
workers=2
intervals=10
expire-group=604800
min-distance=1
""")
        self.log_path = self.dir / "burrow.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([BURROW, "-config-dir", str(self.dir)],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path):
        if self.proc.poll() is not None:
            raise AssertionError(f"Burrow exited with {self.proc.returncode}: {self.read_log()[-3000:]}")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return json.loads(r.read())

    def read_log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def sluice_lag(broker_addr, group):
    """Per partition lag from `sluice group describe` (the LAG column)."""
    out = subprocess.run([SLUICE_BIN, "group", "--bootstrap", broker_addr, "describe", group],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("GROUP"))
    cols = lines[header].split()
    lag = {}
    for ln in lines[header + 1:]:
        f = ln.split()
        if len(f) >= len(cols) - 3 and f[0] == group:
            row = dict(zip(cols, f))
            lag[(row["TOPIC"], int(row["PARTITION"]))] = int(row["LAG"])
    return lag, out


def test_metadata_for_consumer_offsets_before_any_group_creates_the_real_topic(broker):
    """What Burrow does at start on a fresh cluster: Metadata for `__consumer_offsets`
    (auto-creation allowed) before any group exists. The topic is created as the group
    coordinator creates it (50 compacted partitions), not as a one-partition user topic
    that leaves groups without a coordinator; then a group commits as usual."""
    a = AdminClient({"bootstrap.servers": broker.addr})
    c = Consumer({"bootstrap.servers": broker.addr, "group.id": "probe",
                  "allow.auto.create.topics": True})
    try:
        md = c.list_topics("__consumer_offsets", timeout=15)  # Metadata naming the topic
        wait_until(lambda: len(a.list_topics(timeout=10).topics["__consumer_offsets"].partitions) == 50,
                   30, what="__consumer_offsets with 50 partitions", retry=(KeyError,))
        cfg = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "__consumer_offsets")])
        (res, fut), = cfg.items()
        assert fut.result(timeout=15)["cleanup.policy"].value == "compact"
        assert md is not None
    finally:
        c.close()
    a.create_topics([NewTopic("after-probe", 1, 1)])["after-probe"].result(timeout=30)
    g = Consumer({"bootstrap.servers": broker.addr, "group.id": "after-probe-group",
                  "enable.auto.commit": False})
    try:
        g.commit(offsets=[TopicPartition("after-probe", 0, 0)], asynchronous=False)
        got = g.committed([TopicPartition("after-probe", 0)], timeout=15)
        assert got[0].offset == 0
    finally:
        g.close()


@needs_burrow
# sarama reads topic offsets with ListOffsets v0 (max_num_offsets 1) below 0.10.1, v1 from
# there.
@pytest.mark.parametrize("kafka_version", ["0.10.0", "0.10.2", "2.0.0"])
def test_burrow_lists_the_group_with_sluices_lag(broker, zookeeper, tmp_path, kafka_version):
    a = AdminClient({"bootstrap.servers": broker.addr})
    a.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=30)
    p = Producer({"bootstrap.servers": broker.addr, "acks": "all", "linger.ms": 5})
    for part in range(PARTITIONS):
        for i in range(PER_PARTITION):
            p.produce(TOPIC, f"{part}-{i}".encode(), partition=part)
    assert p.flush(30) == 0

    burrow = Burrow(tmp_path, zookeeper, broker.addr, kafka_version)
    try:
        # Burrow records a commit only for a partition whose broker offset it knows:
        # commit once it has read the topic's offsets.
        def knows_topic():
            t = burrow.get(f"/v3/kafka/sluice/topic/{TOPIC}")
            return not t["error"] and t.get("offsets") == [PER_PARTITION] * PARTITIONS and t
        wait_until(knows_topic, 60, what="Burrow reading the topic's offsets",
                   retry=(OSError, KeyError))

        # A real group consumes part of the topic and commits what it consumed.
        c = Consumer({"bootstrap.servers": broker.addr, "group.id": GROUP,
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        c.subscribe([TOPIC])
        consumed = {}
        want = {pt: n for pt, n in COMMITTED.items() if n}

        def consume():
            m = c.poll(0.5)
            if m is not None and not m.error():
                consumed.setdefault(m.partition(), []).append(m.offset())
            return all(len(consumed.get(pt, [])) >= n for pt, n in want.items())
        wait_until(consume, 60, what="the group consuming", interval=0)
        c.commit(offsets=[TopicPartition(TOPIC, pt, n) for pt, n in COMMITTED.items()],
                 asynchronous=False)
        c.close()

        expected = {(TOPIC, pt): PER_PARTITION - n for pt, n in COMMITTED.items()}
        ours, table = sluice_lag(broker.addr, GROUP)
        assert ours == expected, table

        # Burrow lists the group and, once it has read the commits, the same lag.
        wait_until(lambda: GROUP in burrow.get("/v3/kafka/sluice/consumer")["consumers"], 60,
                   what="Burrow listing the group", retry=(OSError,))

        def burrow_lag():
            st = burrow.get(f"/v3/kafka/sluice/consumer/{GROUP}/lag")["status"]
            parts = {(x["topic"], x["partition"]): x["current_lag"] for x in st["partitions"]}
            return (st["totallag"], parts) if parts == expected else None
        total, parts = wait_until(burrow_lag, 60, what="Burrow's lag matching sluice's",
                                  retry=(OSError, KeyError, TypeError))
        assert total == sum(ours.values()), (total, table)
        assert parts == ours
    finally:
        burrow.stop()
    # Burrow decoded every offset commit. Its 1.2.1 decoder knows group-metadata values
    # up to version 2; Kafka 2.3+ (and Sluice, serving Kafka 3.9's formats) writes
    # version 3 (KIP-345's group.instance.id), which Burrow skips with a warning: it
    # then shows no owner per partition, and the lag is unaffected. Any other decode
    # failure or error fails the test.
    logs = [json.loads(ln) for ln in burrow.read_log().splitlines() if ln.startswith("{")]
    bad = [r for r in logs
           if r["level"] == "error"
           or (r["msg"] == "failed to decode"
               and not (r.get("message_type") == "metadata" and r.get("reason") == "value version"
                        and r.get("version") == 3))]
    assert not bad, bad[:5]
