"""Tier: black-box compatibility with Go clients as Debian packages them (issue 12):
a program built in GOPATH mode from Debian's sarama and kafka-go sources
(tests/e2e/go/clients.go) produces, consumes in a consumer group and commits against
one broker; the committed offsets are then read with confluent-kafka. Skipped where Go
or the packages are missing (scripts/install-test-deps.sh installs them)."""
import os
import shutil
import subprocess
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

HERE = os.path.dirname(os.path.abspath(__file__))
GOPATH = "/usr/share/gocode"
N = 20


@pytest.fixture(scope="module")
def clients_bin(tmp_path_factory):
    if shutil.which("go") is None or not os.path.isdir(os.path.join(GOPATH, "src/github.com/Shopify/sarama")):
        pytest.skip("go and Debian's sarama/kafka-go packages are not installed")
    work = tmp_path_factory.mktemp("go")
    src = work / "src" / "clients"
    src.mkdir(parents=True)
    shutil.copy(os.path.join(HERE, "go", "clients.go"), src / "clients.go")
    out = work / "clients"
    env = dict(os.environ, GO111MODULE="off", GOPATH=f"{work}:{GOPATH}", GOFLAGS="",
               GOCACHE=str(work / "cache"))
    r = subprocess.run(["go", "build", "-o", str(out), "clients"], cwd=src, env=env,
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return str(out)


def committed(addr, group, topic):
    c = Consumer({"bootstrap.servers": addr, "group.id": group, "enable.auto.commit": False})
    try:
        [tp] = c.committed([TopicPartition(topic, 0)], timeout=30)
        return tp.offset
    finally:
        c.close()


def test_sarama_and_kafka_go_produce_consume_in_a_group_and_commit(broker, clients_bin):
    tag = uuid.uuid4().hex[:8]
    st, sg, kt, kg = f"sarama-{tag}", f"sarama-g-{tag}", f"kgo-{tag}", f"kgo-g-{tag}"
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.addr})
    fs = admin.create_topics([NewTopic(t, 1, 1) for t in (st, kt)])
    for f in fs.values():
        f.result(timeout=30)
    r = subprocess.run([clients_bin, broker.addr, st, sg, kt, kg, str(N)], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout.decode().splitlines() == [f"sarama consumed={N}", f"kafka-go consumed={N}"]
    assert committed(broker.addr, sg, st) == N
    assert committed(broker.addr, kg, kt) == N
