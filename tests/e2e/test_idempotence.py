"""Tier: exactly-once, idempotent producers with real clients (issue 11).

librdkafka (confluent-kafka) with enable.idempotence=true, kcat with the same setting,
and kafka-python 3's default producer (test_kafka_python.py) ask for a producer id
(InitProducerId) and number their batches; the broker appends a retried batch once and
answers the retry with the first append's offsets."""
import collections

from confluent_kafka import Producer

from conftest import wait_until
from faultproxy import DroppingProxy
from kafka_wire import (Conn, batch_count, fetch_v4, init_producer_id, parse_fetch_v4,
                        parse_produce_v3, produce_v3, record_batch)
from test_confluent import create_topic
from test_durability import consume_to_end
from test_kcat import kcat

KEYS = 4


def produce_through(addr, topic, n, idempotent):
    """Produces n keyed records (value = sequence number); returns the values the
    client saw acknowledged."""
    p = Producer({"bootstrap.servers": addr, "acks": "all", "enable.idempotence": idempotent,
                  "linger.ms": 2, "batch.num.messages": 20, "message.timeout.ms": 120000,
                  "retry.backoff.ms": 20})
    acked, errors = [], []

    def cb(err, msg):
        if err is None:
            acked.append(int(msg.value()))
        else:
            errors.append(err)

    for i in range(n):
        p.produce(topic, key=b"k%d" % (i % KEYS), value=b"%d" % i, on_delivery=cb)
        p.poll(0)
    assert p.flush(120) == 0, "every record was delivered or failed"
    assert not errors, f"delivery errors: {errors[:3]}"
    return acked


def test_idempotent_producer_through_lost_answers_writes_each_record_once(make_broker):
    n = 3000
    broker = make_broker()
    proxy = DroppingProxy(broker.port)
    # Restart the broker advertising the proxy: clients reconnect through it.
    broker.stop()
    broker.extra = ["--advertised", proxy.addr]
    broker.start()
    try:
        create_topic(broker.addr, "idem-lost", 2)
        acked = produce_through(proxy.addr, "idem-lost", n, idempotent=True)
        assert proxy.dropped >= 5, f"the proxy dropped {proxy.dropped} answers: retries not exercised"
        got = consume_to_end(broker.addr, "idem-lost", 2)
        values = [int(v) for (_, v, _, _) in got]
        counts = collections.Counter(values)
        assert sorted(acked) == list(range(n)), "every record acknowledged"
        assert [v for v, c in counts.items() if c > 1] == [], "no record stored twice"
        assert set(counts) == set(acked)
        by_key = collections.defaultdict(list)
        for (k, v, p, off) in sorted(got, key=lambda r: (r[2], r[3])):
            by_key[k].append(int(v))
        for k, vs in by_key.items():
            assert vs == sorted(vs), f"order of key {k} kept"

        # The control run: the same faults without idempotence store duplicates, so
        # the run above really had its batches retried.
        create_topic(broker.addr, "plain-lost", 2)
        proxy.reset()
        acked = produce_through(proxy.addr, "plain-lost", n, idempotent=False)
        assert proxy.dropped >= 5
        got = consume_to_end(broker.addr, "plain-lost", 2)
        counts = collections.Counter(int(v) for (_, v, _, _) in got)
        assert set(counts) == set(range(n))
        assert any(c > 1 for c in counts.values()), "a lost answer made a plain producer write twice"
    finally:
        proxy.close()


def test_kcat_idempotent_produce_and_read_back(broker):
    lines = [f"idem-{i}" for i in range(300)]
    kcat("-b", broker.addr, "-P", "-t", "kc-idem", "-X", "enable.idempotence=true",
         input="\n".join(lines).encode() + b"\n")
    out = kcat("-b", broker.addr, "-C", "-t", "kc-idem", "-e", "-q")
    assert out.split() == lines


def test_producer_ids_are_unique_across_restarts(make_broker):
    """InitProducerId hands out ids from the quorum's blocks: a restarted broker never
    repeats an id it gave before."""
    broker = make_broker()
    first = [init_producer_id(broker.addr) for _ in range(3)]
    broker.stop()
    broker.start()
    wait_until(lambda: init_producer_id(broker.addr) is not None, what="InitProducerId after restart",
               retry=(ConnectionError,))
    second = [init_producer_id(broker.addr) for _ in range(3)]
    ids = [pid for (pid, _) in first + second]
    assert len(set(ids)) == len(ids), f"ids repeat: {ids}"
    assert all(epoch == 0 for (_, epoch) in first + second)


def test_sequence_rules_on_the_wire(broker):
    """Hand-made sequenced batches: a retry is answered with the first append's offset
    and not stored again; a gap gets OUT_OF_ORDER_SEQUENCE_NUMBER (45); an older epoch
    INVALID_PRODUCER_EPOCH (47); a new epoch starting at 0 is accepted."""
    create_topic(broker.addr, "seq", 1)
    pid, epoch = init_producer_id(broker.addr)
    conn = Conn(broker.addr)

    def send(values, seq, ep=epoch, timeout_ms=10000):
        conn.send(produce_v3("seq", 0, record_batch(values, producer_id=pid, producer_epoch=ep,
                                                    base_sequence=seq), timeout_ms=timeout_ms))
        _, body = conn.recv()
        [(_, _, err, base)] = parse_produce_v3(body)
        return err, base

    assert send([b"a", b"b"], 0) == (0, 0)
    assert send([b"c"], 2) == (0, 2)
    assert send([b"a", b"b"], 0) == (0, 0), "a retry answers with its first offset"
    assert send([b"c"], 2) == (0, 2)
    # A gap: the broker waits (bounded by the request's timeout) for the batches
    # before it, then refuses.
    assert send([b"x"], 9, timeout_ms=300)[0] == 45
    assert send([b"d"], 0, ep=epoch + 1) == (0, 3), "a new epoch starts at sequence 0"
    assert send([b"e"], 1, ep=epoch)[0] == 47, "the old epoch is fenced"
    conn.close()
    c = Conn(broker.addr)
    c.send(fetch_v4("seq", 0, 0))
    _, body = c.recv()
    [(_, _, err, hw, recs)] = parse_fetch_v4(body)
    c.close()
    assert (err, hw) == (0, 4), "a,b,c,d stored once each"
    assert batch_count(recs) == 3
