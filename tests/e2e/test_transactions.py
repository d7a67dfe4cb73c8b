"""Tier: exactly-once transactions with confluent-kafka (librdkafka 2.16), issue 11.

A transactional producer's records become visible to read_committed consumers only
when its transaction commits; aborted ones never; the last stable offset holds
read_committed readers behind an open transaction; a new instance of a transactional
id fences the old one; consume-transform-produce commits its input offsets in the
transaction; a transaction whose producer died is aborted after its timeout."""
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from conftest import SLUICE_BIN, check_consumer_error, wait_until
from test_confluent import create_topic


def read(addr, topic, isolation, partitions=1, expect=None, timeout=30):
    """Every value of the topic visible at `isolation`, read to the end of each
    partition (its high watermark, or its last stable offset for read_committed)."""
    c = Consumer({"bootstrap.servers": addr, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation, "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, at_end = [], set()

    def done():
        for m in c.consume(num_messages=500, timeout=0.3):
            if m.error():
                if m.error().code() == -191:  # _PARTITION_EOF
                    at_end.add(m.partition())
                else:
                    check_consumer_error(m.error())
                continue
            at_end.discard(m.partition())
            out.append(m.value().decode())
        return len(at_end) == partitions and (expect is None or len(out) >= expect)

    try:
        wait_until(done, timeout=timeout, interval=0, what=f"end of {topic} ({isolation})")
    finally:
        c.close()
    return out


def txn_producer(addr, txn_id, **conf):
    p = Producer({"bootstrap.servers": addr, "transactional.id": txn_id, **conf})
    p.init_transactions(30)
    return p


def test_commit_visible_abort_invisible_and_lso_holds_readers(broker):
    create_topic(broker.addr, "tx", 1)
    p = txn_producer(broker.addr, "tx-1")
    p.begin_transaction()
    for i in range(5):
        p.produce("tx", value=f"c{i}")
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(5):
        p.produce("tx", value=f"a{i}")
    p.flush(10)  # sent and stored before the abort
    p.abort_transaction(30)
    committed = [f"c{i}" for i in range(5)]
    assert read(broker.addr, "tx", "read_committed") == committed
    assert read(broker.addr, "tx", "read_uncommitted") == committed + [f"a{i}" for i in range(5)]

    # An open transaction holds read_committed readers at its first offset, also
    # against a later plain record of another producer.
    p.begin_transaction()
    p.produce("tx", value="open")
    p.flush(10)
    plain = Producer({"bootstrap.servers": broker.addr})
    plain.produce("tx", value="plain")
    assert plain.flush(10) == 0
    assert read(broker.addr, "tx", "read_uncommitted")[-2:] == ["open", "plain"]
    assert read(broker.addr, "tx", "read_committed") == committed, "held at the open transaction"
    # The operator's view of the hanging transaction.
    out = subprocess.run([SLUICE_BIN, "txn", "list", "--bootstrap", broker.addr],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("tx-1 ")]
    assert line.split()[2] == "Ongoing" and line.split()[-1] == "tx-0", line
    p.commit_transaction(30)

    def state():
        out = subprocess.run([SLUICE_BIN, "txn", "describe", "tx-1", "--bootstrap", broker.addr],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return "CompleteCommit" in out.stdout  # the markers follow the commit's answer
    wait_until(state, what="tx-1 CompleteCommit")
    assert read(broker.addr, "tx", "read_committed", expect=7) == committed + ["open", "plain"]


def test_new_instance_fences_the_old_one(broker):
    create_topic(broker.addr, "fence", 1)
    old = txn_producer(broker.addr, "fenced-id")
    old.begin_transaction()
    old.produce("fence", value="zombie")
    old.flush(10)
    new = txn_producer(broker.addr, "fenced-id")  # aborts the old one's transaction
    new.begin_transaction()
    new.produce("fence", value="fresh")
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as e:
        old.produce("fence", value="late")
        old.commit_transaction(10)
    assert e.value.args[0].fatal() or "fenced" in str(e.value).lower(), str(e.value)
    assert read(broker.addr, "fence", "read_committed") == ["fresh"]


def test_consume_transform_produce_commits_offsets_in_the_transaction(broker):
    n = 200
    create_topic(broker.addr, "ctp-in", 1)
    create_topic(broker.addr, "ctp-out", 1)
    src = Producer({"bootstrap.servers": broker.addr})
    for i in range(n):
        src.produce("ctp-in", value=f"{i}")
    assert src.flush(10) == 0
    group = f"ctp-{uuid.uuid4().hex[:6]}"
    c = Consumer({"bootstrap.servers": broker.addr, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.subscribe(["ctp-in"])
    p = txn_producer(broker.addr, "ctp-1")
    done, deadline = 0, time.monotonic() + 60
    while done < n:
        assert time.monotonic() < deadline, f"processed {done} of {n}"
        msgs = [m for m in c.consume(num_messages=50, timeout=1) if not m.error()]
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce("ctp-out", value=f"out-{m.value().decode()}")
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        done += len(msgs)
    c.close()
    assert read(broker.addr, "ctp-out", "read_committed") == [f"out-{i}" for i in range(n)]
    check = Consumer({"bootstrap.servers": broker.addr, "group.id": group})
    [tp] = check.committed([TopicPartition("ctp-in", 0)], timeout=10)
    check.close()
    assert tp.offset == n, "the input offsets were committed with the transaction"


ABANDONED = textwrap.dedent("""
    import os, sys
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2],
                  "transaction.timeout.ms": 3000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(sys.argv[3], value=b"abandoned-%d" % i)
    p.flush(10)
    print("OPEN", flush=True)
    sys.stdin.read()  # until SIGKILLed
""")


def test_abandoned_transaction_is_aborted_after_its_timeout(broker):
    create_topic(broker.addr, "abandon", 1)
    proc = subprocess.Popen([sys.executable, "-c", ABANDONED, broker.addr, "abandon-id", "abandon"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"OPEN"
    finally:
        proc.kill()
        proc.wait()
    plain = Producer({"bootstrap.servers": broker.addr})
    plain.produce("abandon", value="after")
    assert plain.flush(10) == 0
    # The coordinator aborts the transaction after transaction.timeout.ms: then the
    # last stable offset passes it, and read_committed readers see the later record
    # and none of the abandoned ones.
    got = read(broker.addr, "abandon", "read_committed", expect=1, timeout=60)
    assert got == ["after"]
