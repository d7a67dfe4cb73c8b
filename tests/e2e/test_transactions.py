"""Tier: exactly-once transactions with confluent-kafka (librdkafka 2.16), issue 11.

A transactional producer's records become visible to read_committed consumers only
when its transaction commits; aborted ones never; the last stable offset holds
read_committed readers behind an open transaction; a new instance of a transactional
id fences the old one; consume-transform-produce commits its input offsets in the
transaction; a transaction whose producer died is aborted after its timeout."""
import re
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from conftest import SLUICE_BIN, Lines, check_consumer_error, wait_until
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


def test_abort_right_after_a_commit_without_flushing_is_not_fatal(broker):
    """librdkafka's everyday pattern: begin, produce, abort (unsent records purged)
    right after a commit. It sends EndTxn(abort) without waiting for its
    AddPartitionsToTxn, refused while the commit's markers are written; Kafka answers
    that abort INVALID_TXN_STATE, fatal to the producer (librdkafka issue 4849). It
    failed about one run in two here before; 60 transactions, every third aborted,
    must all end, and exactly the committed records be visible."""
    create_topic(broker.addr, "txa", 1)
    p = txn_producer(broker.addr, "txa-1")
    committed = []
    for t in range(60):
        p.begin_transaction()
        values = [f"{t}-{i}" for i in range(15)]
        for v in values:
            p.produce("txa", value=v, partition=0)
        if t % 3 == 2:
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
            committed += values
    assert read(broker.addr, "txa", "read_committed", expect=len(committed)) == committed


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
                  "transaction.timeout.ms": int(sys.argv[4]) if len(sys.argv) > 4 else 3000})
    p.init_transactions(30)
    p.begin_transaction()
    failed = []
    for i in range(10):
        p.produce(sys.argv[3], value=b"abandoned-%d" % i,
                  on_delivery=lambda err, m: err and failed.append(err))
    left = p.flush(30)
    print("OPEN" if left == 0 and not failed else "UNSENT %d %s" % (left, failed), flush=True)
    sys.stdin.read()  # until SIGKILLed
""")


def abandon(addr, txn_id, topic, timeout_ms=None):
    """Runs ABANDONED: returns the process once its 10 records are stored in an open
    transaction."""
    args = [sys.executable, "-c", ABANDONED, addr, txn_id, topic]
    if timeout_ms is not None:
        args.append(str(timeout_ms))
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = Lines(proc.stdout, "the abandoning producer").next(60, "OPEN")
        assert line.strip() == b"OPEN", line
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


# Long enough that the checks of the open transaction (a child Python process started,
# its 10 records stored, two consumers asked) end well inside it on a busy machine;
# the coordinator checks timeouts every 10 s, so the abort comes at its 20 s check.
ABANDON_TIMEOUT_MS = 15000


def test_abandoned_transaction_is_aborted_after_its_timeout(broker):
    """A producer writes 10 records in a transaction and is SIGKILLed without ending
    it. Until its transaction.timeout.ms has passed, the open transaction holds the
    last stable offset at its first record: read_committed readers see nothing, not
    even a later plain record. Then the coordinator's timer aborts it (never before the
    timeout; it bumps the producer's epoch, fencing the dead instance): read_committed
    readers see the later record and none of the abandoned ones, which stay stored."""
    create_topic(broker.addr, "abandon", 1)
    tp = TopicPartition("abandon", 0)
    spawned = time.monotonic()  # the transaction starts after this
    proc = abandon(broker.addr, "abandon-id", "abandon", ABANDON_TIMEOUT_MS)
    proc.kill()
    proc.wait()
    plain = Producer({"bootstrap.servers": broker.addr})
    plain.produce("abandon", value="after")
    assert plain.flush(10) == 0
    # librdkafka asks ListOffsets at the consumer's isolation level: read_committed
    # gets the last stable offset.
    committed = Consumer({"bootstrap.servers": broker.addr, "group.id": f"lso-{uuid.uuid4().hex[:6]}",
                          "isolation.level": "read_committed"})
    uncommitted = Consumer({"bootstrap.servers": broker.addr, "group.id": f"hw-{uuid.uuid4().hex[:6]}",
                            "isolation.level": "read_uncommitted"})
    try:
        lso = committed.get_watermark_offsets(tp, timeout=10)[1]
        hw = uncommitted.get_watermark_offsets(tp, timeout=10)[1]
        held = read(broker.addr, "abandon", "read_committed")
        looked = time.monotonic() - spawned
        assert looked < ABANDON_TIMEOUT_MS / 1000, \
            f"the checks ended {looked:.1f}s after the producer started: too late to see it open"
        assert (lso, hw) == (0, 11), \
            f"last stable offset {lso}, high watermark {hw}: wanted 0 (held) and 11 (10 abandoned + 1 plain)"
        assert held == [], "read_committed held at the open transaction"

        # The coordinator aborts it after transaction.timeout.ms (checked every 10 s).
        wait_until(lambda: committed.get_watermark_offsets(tp, timeout=10)[1] > 0, timeout=60,
                   what="the abandoned transaction to be aborted")
        aborted = time.monotonic() - spawned
        assert aborted >= ABANDON_TIMEOUT_MS / 1000, \
            f"aborted {aborted:.1f}s after the producer started, before its {ABANDON_TIMEOUT_MS} ms timeout"
    finally:
        committed.close()
        uncommitted.close()
    got = read(broker.addr, "abandon", "read_committed", expect=1, timeout=60)
    assert got == ["after"]
    assert read(broker.addr, "abandon", "read_uncommitted", expect=11) == \
        [f"abandoned-{i}" for i in range(10)] + ["after"], "the aborted records are stored, just not visible"
    # By the coordinator's timer, which fenced the dead instance (epoch 0 -> 1).
    assert re.search(r"transaction timed out; aborting.*transactional_id=abandon-id", broker.read_log())
    out = subprocess.run([SLUICE_BIN, "txn", "describe", "abandon-id", "--bootstrap", broker.addr],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert re.search(r"^state:\s+CompleteAbort$", out.stdout, re.M), out.stdout
    assert re.search(r"\(epoch 1\)", out.stdout), out.stdout


def test_open_transaction_survives_a_broker_sigkill_and_is_aborted(make_broker):
    """A transaction is open (records stored, no marker) when the broker is SIGKILLed.
    After the restart the coordinator reloads it from __transaction_state, the
    partition rebuilds its producer state (the open transaction holds the last stable
    offset), and the transaction is aborted after its timeout: read_committed readers
    then pass it and never see its records. A committed transaction before it stays."""
    broker = make_broker()
    create_topic(broker.addr, "crash-tx", 1)
    p = txn_producer(broker.addr, "crash-id", **{"transaction.timeout.ms": 3000,
                                                  "message.timeout.ms": 3000})
    p.begin_transaction()
    p.produce("crash-tx", value="kept")
    p.commit_transaction(30)
    proc = abandon(broker.addr, "crash-open", "crash-tx")
    try:
        broker.kill()
    finally:
        proc.kill()
        proc.wait()
    broker.start()
    plain = Producer({"bootstrap.servers": broker.addr})
    plain.produce("crash-tx", value="after")
    assert plain.flush(30) == 0
    assert read(broker.addr, "crash-tx", "read_committed", expect=2, timeout=60) == ["kept", "after"]
    assert read(broker.addr, "crash-tx", "read_uncommitted", expect=12)[1:11] == \
        [f"abandoned-{i}" for i in range(10)], "the aborted records are stored, just not visible"


PROCESSOR = textwrap.dedent("""
    import sys
    from confluent_kafka import Consumer, Producer
    addr, group, src, dst = sys.argv[1:5]
    c = Consumer({"bootstrap.servers": addr, "group.id": group, "group.instance.id": "proc-0",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", "session.timeout.ms": 6000})
    c.subscribe([src])
    p = Producer({"bootstrap.servers": addr, "transactional.id": "ctp-processor"})
    p.init_transactions(60)
    done = 0
    while True:
        msgs = [m for m in c.consume(num_messages=20, timeout=0.5) if not m.error()]
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, value=b"out-" + m.value())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 60)
        p.commit_transaction(60)
        done += len(msgs)
        print("DONE", done, flush=True)
""")


def test_consume_transform_produce_through_processor_sigkills_is_exactly_once(broker):
    """The processor (consumer group + transactional producer committing its input
    offsets in each transaction) is SIGKILLed three times mid-stream and restarted with
    the same transactional id and static member id: the read_committed output holds
    every input record exactly once, in order."""
    n = 1500
    create_topic(broker.addr, "ctpk-in", 1)
    create_topic(broker.addr, "ctpk-out", 1)
    src = Producer({"bootstrap.servers": broker.addr, "linger.ms": 5})
    for i in range(n):
        src.produce("ctpk-in", value=f"{i}")
    assert src.flush(30) == 0
    group = f"ctpk-{uuid.uuid4().hex[:6]}"
    args = [sys.executable, "-c", PROCESSOR, broker.addr, group, "ctpk-in", "ctpk-out"]
    for kill_after in (200, 300, 300, None):
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            if kill_after is None:
                read(broker.addr, "ctpk-out", "read_committed", expect=n, timeout=120)
                break
            # Let this run commit some transactions, then SIGKILL it mid-stream.
            Lines(proc.stdout, "the processor").until(
                lambda line: line.startswith(b"DONE") and int(line.split()[1]) >= kill_after,
                timeout=120, what=f"DONE {kill_after}")
        finally:
            proc.kill()
            proc.wait()
    out = read(broker.addr, "ctpk-out", "read_committed")
    assert out == [f"out-{i}" for i in range(n)], \
        f"{len(out)} records, {len(set(out))} distinct: every input exactly once, in order"


def test_init_producer_id_with_an_empty_transactional_id_is_invalid(broker):
    """Kafka answers INVALID_REQUEST (42) to an empty transactional id rather than
    treating it as an idempotent producer; null still is one."""
    from kafka_wire import init_producer_id
    pid, epoch = init_producer_id(broker.addr, transactional_id=None)
    assert pid >= 0 and epoch == 0
    with pytest.raises(RuntimeError, match="InitProducerId error 42"):
        init_producer_id(broker.addr, transactional_id="")


def test_transactional_produce_outside_its_transaction_is_refused(broker):
    """KIP-890 part 1: a transactional batch for a partition its producer never added
    to a transaction (a late retry, a zombie) is refused by the partition's leader
    after asking the coordinator, so it cannot open a transaction the coordinator does
    not know of and hold read_committed readers forever."""
    from kafka_wire import (Conn, fetch_v4, init_producer_id, parse_fetch_v4,
                            parse_produce_v3, produce_v3, record_batch)
    create_topic(broker.addr, "verify", 1)
    pid, epoch = init_producer_id(broker.addr, transactional_id="verify-id")
    conn = Conn(broker.addr)
    batch = record_batch([b"late"], producer_id=pid, producer_epoch=epoch, base_sequence=0,
                         transactional=True)
    conn.send(produce_v3("verify", 0, batch, transactional_id="verify-id"))
    _, body = conn.recv()
    [(_, _, err, _)] = parse_produce_v3(body)
    assert err == 48, f"INVALID_TXN_STATE (Produce v3 predates TRANSACTION_ABORTABLE), got {err}"
    conn.send(fetch_v4("verify", 0, 0))
    _, body = conn.recv()
    [(_, _, ferr, hw, recs)] = parse_fetch_v4(body)
    conn.close()
    assert (ferr, hw, recs) == (0, 0, b""), "nothing stored"
    # A real transactional producer on the same partition goes through verification.
    p = txn_producer(broker.addr, "verify-ok")
    p.begin_transaction()
    p.produce("verify", value="in-txn")
    p.commit_transaction(30)
    assert read(broker.addr, "verify", "read_committed") == ["in-txn"]
