"""Tier: a 3-broker cluster of real processes on loopback (issue 6, "Tests with real
processes"), driven with confluent-kafka. Harness: cluster.py.

Every wait is a bounded retry with a deadline. The brokers run with a 3 s session
timeout, 300 ms heartbeats and a 5 s replica lag limit (cluster.FAST_FLAGS), so fencing
takes a few seconds and the whole file a couple of minutes. They run with the broker's
default --cores (a shard per CPU), as in production: the three of them share this
machine's CPUs.
"""
import os
import re
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from cluster import Cluster, disk_batches, metadata_from, wait_until
from conftest import check_consumer_error, expected_log_errors, is_transient

DURABLE = {"min.insync.replicas": "2"}
# A commit may be refused while the group rebalances around a coordinator failover.
REJOIN = (KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
          KafkaError.UNKNOWN_MEMBER_ID)


def _dump_logs(c):
    for i in c.ids:
        try:
            tail = c.log(i)[-3000:]
        except OSError:
            continue
        print(f"--- broker {i} ({c.brokers[i].log_path}) ---\n{tail}")


def default_shards():
    """How many shards a broker runs without --cores: one per CPU it may run on (the
    online CPUs of its affinity mask, inherited from this process)."""
    return len(os.sched_getaffinity(0))


def shards_started(c, i):
    """The shard counts broker i's runs logged at start ("starting ... shards=N")."""
    return [int(n) for n in re.findall(r"starting\b.*\bshards=(\d+)", c.log(i))]


def _make_cluster(tmp_path, request, proxied):
    """A started 3-broker cluster. Its brokers run with the broker's default --cores
    (none passed: a shard per CPU, two on a 2-CPU machine), so partitions, replication,
    the group and transaction coordinators and the clients' connections spread over
    each broker's shards and cross its channel mesh, as they do in production. A test
    marked @pytest.mark.cores(n) runs them with --cores n instead: n > 1 also checks at
    teardown that some broker really opened logs on every shard; cores(1) needs a
    written reason. At teardown every broker must have started with the shards asked
    for, be alive (or ended by the test), stop cleanly and have logged no ERROR or
    panic beyond the test's @pytest.mark.broker_log_errors patterns."""
    m = request.node.get_closest_marker("cores")
    cores = m.args[0] if m else None
    shards = cores or default_shards()
    # The `opened log` debug lines, for the every-shard-used check of cores(n) tests.
    env = {"RUST_LOG": "info,sluice::partition::broker=debug"} if cores and cores > 1 else None
    c = Cluster(tmp_path / "cluster", n=3, proxied=proxied, cores=cores, env=env).start()
    yield c
    _dump_logs(c)  # shown only when the test failed
    try:
        started = {i: shards_started(c, i) for i in c.ids}
        assert all(runs and set(runs) == {shards} for runs in started.values()), \
            f"brokers started with shards {started}, wanted {shards}"
        if m and cores > 1:
            used = {s for i in c.ids for s in c.shards_of(i).values()}
            assert used == set(range(cores)), f"logs opened on shards {used} of {cores}"
    finally:
        c.stop(expected_log_errors(request))


@pytest.fixture
def cluster(tmp_path, request):
    yield from _make_cluster(tmp_path, request, proxied=False)


@pytest.fixture
def proxied_cluster(tmp_path, request):
    yield from _make_cluster(tmp_path, request, proxied=True)


class Acks:
    """Delivery reports: per partition the acknowledged values in ack order, and the
    failed ones with their error codes."""

    def __init__(self):
        self.acked = {}
        self.offsets = {}  # partition -> [offset] in ack order
        self.failed = []

    def __call__(self, err, msg):
        if err is None:
            self.acked.setdefault(msg.partition(), []).append(msg.value())
            self.offsets.setdefault(msg.partition(), []).append(msg.offset())
        else:
            self.failed.append((msg.partition(), msg.value(), err.code()))

    def count(self):
        return sum(len(v) for v in self.acked.values())


def leader_or_none(c, topic, partition):
    """The leader per the cluster's metadata, or None while nobody answers."""
    try:
        return c.leader_of(topic, partition)
    except Exception as e:  # noqa: BLE001 - only transient errors mean "nobody answers"
        if not is_transient(e):
            raise
        return None


def producer(bootstrap, **conf):
    # Without idempotence (librdkafka's default), one request in flight per
    # connection keeps retries from reordering a partition.
    base = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
            "max.in.flight.requests.per.connection": 1, "linger.ms": 5,
            "message.timeout.ms": 30000, "retry.backoff.ms": 100,
            "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000}
    base.update(conf)
    return Producer(base)


def produce_n(p, topic, partitions, n, acks, prefix, deadline=30):
    """Produces n records round-robin over `partitions` and waits (bounded) for every
    delivery report."""
    for i in range(n):
        part = partitions[i % len(partitions)]
        while True:
            try:
                p.produce(topic, value=f"{prefix}-{part}-{i}".encode(), partition=part,
                          on_delivery=acks)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(deadline)
    assert left == 0, f"{left} records without a delivery report after {deadline}s"


def check_log(c, topic, partitions, acked, absent=()):
    """Reads every partition from earliest: each acknowledged value is there, in ack
    order, and no value of `absent` is. A retry may write a value twice (a first
    attempt appended whose answer the client never got, then the retry after later
    records were acknowledged): the order holds if some occurrence of each value
    follows the one chosen for the value acknowledged before it."""
    absent = set(absent)
    logs = {}
    for p in partitions:
        values = [v for (_, _, v) in c.read_all(topic, p)]
        logs[p] = values
        at = {}
        for i, v in enumerate(values):
            at.setdefault(v, []).append(i)
        want = acked.get(p, [])
        missing = [v for v in want if v not in at]
        assert not missing, f"{topic}-{p}: {len(missing)} acknowledged records missing, e.g. {missing[:5]}"
        last = -1
        for v in want:
            later = [i for i in at[v] if i > last]
            assert later, f"{topic}-{p}: acknowledged records out of order at {v!r} (offsets {at[v]}, after {last})"
            last = later[0]
        leaked = absent.intersection(values)
        assert not leaked, f"{topic}-{p}: records that must not be there: {sorted(leaked)[:5]}"
    return logs


def disk_end(c, i, topic, partition):
    """Log end offset of broker i's copy of topic-partition, from its segments on disk."""
    b = disk_batches(c.data_dir(i), topic, partition)
    return b[-1][1] + 1 if b else 0


def disk_end_reaches(c, i, topic, partition, end):
    """Waits until broker i's segment files of topic-partition reach offset `end` (the
    shard journal writes them behind the acknowledgement, within about a second of the
    partition's last append); returns the end on disk then."""
    return wait_until(lambda: (lambda e: e if e >= end else None)(disk_end(c, i, topic, partition)),
                      15, f"broker {i}'s {topic}-{partition} on disk up to {end}", retry=(OSError,))


def identical_on_disk(c, topic, partition, end, deadline=30):
    """Waits until every broker holds the same batches (offsets, epochs, CRCs) of
    topic-partition on disk, up to log end offset `end` (segment files are written
    behind the shard journal: without it, copies that all lack the same tail would
    pass); returns them."""
    def same():
        copies = {tuple(disk_batches(c.data_dir(i), topic, partition)) for i in c.ids}
        if len(copies) != 1:
            return None
        batches = list(copies.pop())
        return batches and batches[-1][1] + 1 == end and batches
    return wait_until(same, deadline, f"{topic}-{partition} identical on every broker",
                      retry=(OSError,))


def links_through_proxies(c, i):
    """The cut only bites if brokers really talk through the proxies (advertised and
    quorum addresses): waits until inter-broker connections of broker i are seen there."""
    wait_until(lambda: {(s, d) for (s, d) in c.faults.conns.values()
                        if "client" not in (s, d) and s != d and i in (s, d)},
               10, f"broker-to-broker connections of {i} through the proxies")


# Writes to a broker the test cut off: no retries, short timeouts, no metadata
# refresh that would send them elsewhere.
SOLO = {"retries": 0, "message.timeout.ms": 4000, "topic.metadata.refresh.interval.ms": 60000}


# (a) ---------------------------------------------------------------------------------

@pytest.mark.cores(2)
def test_acks_all_stream_survives_leader_sigkill(cluster):
    topic, parts = "durable", [0, 1]
    cluster.create_topic(topic, partitions=2, rf=3, configs=DURABLE)
    victim = cluster.leader_of(topic, 0)
    acks = Acks()
    p = producer(cluster.bootstrap)
    killed_at = None
    seq = 0
    next_check = 0.0
    end = time.monotonic() + 60
    while True:
        for part in parts:
            try:
                p.produce(topic, value=f"{part}:{seq:06d}".encode(), partition=part, on_delivery=acks)
            except BufferError:
                pass
        seq += 1
        p.poll(0.005)
        assert time.monotonic() < end, f"stream stuck: {acks.count()} acked, killed at {killed_at}"
        if killed_at is None and acks.count() >= 300:
            cluster.kill(victim)  # SIGKILL mid-stream
            killed_at = acks.count()
            continue
        if killed_at is not None and acks.count() >= killed_at + 300 and time.monotonic() >= next_check:
            next_check = time.monotonic() + 0.5
            if leader_or_none(cluster, topic, 0) not in (None, -1, victim):
                break
    assert p.flush(40) == 0
    assert acks.count() >= killed_at + 300
    assert cluster.leader_of(topic, 0) != victim
    check_log(cluster, topic, parts, acks.acked)


def test_idempotent_stream_is_exactly_once_across_leader_sigkill(cluster):
    """librdkafka's idempotent producer (5 requests in flight) through a leader
    SIGKILL: its in-flight batches are retried on the new leader, which knows their
    sequences from the replicated log, so every acknowledged record is stored exactly
    once, in order."""
    topic = "idem-failover"
    cluster.create_topic(topic, partitions=1, rf=3, configs=DURABLE)
    victim = cluster.leader_of(topic, 0)
    acks = Acks()
    p = producer(cluster.bootstrap, **{"enable.idempotence": True,
                                       "max.in.flight.requests.per.connection": 5,
                                       "linger.ms": 1})
    seq, killed_at = 0, None
    end = time.monotonic() + 60
    while True:
        try:
            p.produce(topic, value=f"{seq:06d}".encode(), partition=0, on_delivery=acks)
            seq += 1
        except BufferError:
            pass
        p.poll(0.001)
        assert time.monotonic() < end, f"stream stuck: {acks.count()} acked, killed at {killed_at}"
        if killed_at is None and acks.count() >= 500:
            cluster.kill(victim)
            killed_at = acks.count()
        elif killed_at is not None and acks.count() >= killed_at + 500:
            break
    assert p.flush(40) == 0
    assert not acks.failed, f"failed deliveries: {acks.failed[:3]}"
    values = [v for (_, _, v) in cluster.read_all(topic, 0)]
    dups = [v for v in set(values) if values.count(v) > 1]
    assert not dups, f"stored twice: {sorted(dups)[:5]}"
    assert values == [f"{i:06d}".encode() for i in range(seq)], "every record once, in order"


# (b) ---------------------------------------------------------------------------------

def test_isr_shrinks_not_enough_replicas_then_recovers(cluster):
    topic = "isr"
    cluster.create_topic(topic, partitions=1, rf=3, configs=DURABLE)
    leader = cluster.leader_of(topic, 0)
    f1, f2 = [i for i in cluster.replicas_of(topic, 0) if i != leader]
    acks = Acks()
    p = producer(cluster.bootstrap)

    cluster.kill(f1)
    cluster.wait_until(lambda: cluster.isr_of(topic, 0) == sorted([leader, f2]), 20,
                       f"ISR without broker {f1}")
    produce_n(p, topic, [0], 50, acks, "isr2")
    assert not acks.failed, acks.failed[:3]
    assert len(acks.acked[0]) == 50

    cluster.kill(f2)
    # Two of three voters are gone, so the controller quorum is too: the metadata (and
    # the ISR in it) is frozen, and it is the leader that must refuse acks=all. Probe
    # until it does. No retries: a delivery report carries the broker's own error.
    p1 = producer(cluster.bootstrap, retries=0, **{"message.timeout.ms": 3000})
    refused = Acks()

    def refuses():
        probe = Acks()
        produce_n(p1, topic, [0], 1, probe, f"probe{len(refused.failed)}", deadline=10)
        assert not probe.acked, f"acknowledged with one live replica: {probe.acked}"
        refused.failed.extend(probe.failed)
        return probe.failed[0][2] == KafkaError.NOT_ENOUGH_REPLICAS
    try:
        cluster.wait_until(refuses, 30, "acks=all refused with NOT_ENOUGH_REPLICAS")
    except AssertionError as e:
        seen = sorted({KafkaError(code).name() for (_, _, code) in refused.failed})
        raise AssertionError(f"{e}; probes failed with {seen} instead") from None
    assert cluster.leader_of(topic, 0) == leader
    refused = Acks()
    produce_n(p1, topic, [0], 20, refused, "isr1")
    assert not refused.acked, f"acknowledged with ISR 1 < min.insync.replicas 2: {refused.acked}"
    codes = {code for (_, _, code) in refused.failed}
    assert codes == {KafkaError.NOT_ENOUGH_REPLICAS}, codes

    cluster.restart(f1)
    cluster.restart(f2)
    cluster.wait_until(lambda: cluster.isr_of(topic, 0) == sorted([leader, f1, f2]), 40,
                       "ISR back to three")
    produce_n(p, topic, [0], 50, acks, "isr3")
    assert not acks.failed, acks.failed[:3]
    assert len(acks.acked[0]) == 100
    check_log(cluster, topic, [0], acks.acked, absent=[v for (_, v, _) in refused.failed])


def test_acks_all_below_min_insync_is_refused_while_the_controller_lives(cluster):
    """min.insync.replicas=3 on an RF=3 topic and one follower SIGKILLed, while the
    controller (the metadata quorum's raft leader) and the partition's leader live on:
    the controller drops the follower from the ISR, and the leader then refuses every
    acks=all write with NOT_ENOUGH_REPLICAS before appending it (as Kafka's
    Partition.appendRecordsToLeader does when the ISR is smaller than
    min.insync.replicas), acknowledging none; acks=1 writes are still taken. Restarted,
    the follower catches up and rejoins the ISR, and acks=all writes are acknowledged
    again. No refused record is in the log."""
    topic = "min-isr-3"
    cluster.create_topic(topic, partitions=1, rf=3, configs={"min.insync.replicas": "3"})
    controller = cluster.wait_until(lambda: (lambda cid: cid if cid >= 0 else None)(cluster.controller_id()),
                                    20, "a controller")
    leader = cluster.leader_of(topic, 0)
    # The follower to kill is neither the partition's leader nor the controller.
    victim = next(i for i in cluster.replicas_of(topic, 0) if i not in (leader, controller))
    acks = Acks()
    p = producer(cluster.bootstrap)
    produce_n(p, topic, [0], 30, acks, "full")
    assert not acks.failed and len(acks.acked[0]) == 30, acks.failed[:3]

    cluster.kill(victim)
    survivors = sorted(i for i in cluster.ids if i != victim)
    # The ISR shrinks in the cluster's metadata: a live controller committed it (the
    # quorum kept its majority; the controller elected at the start normally stays).
    cluster.wait_until(lambda: cluster.isr_of(topic, 0) == survivors, 20, f"ISR without broker {victim}")
    assert cluster.controller_id() in survivors, "a live controller"

    # The leader learns the shrunk ISR from the metadata: until then an acks=all write
    # may be appended and wait for the dead follower (failing after the append, or
    # timing out). None is ever acknowledged. No retries: a delivery report carries the
    # broker's own error.
    p1 = producer(cluster.bootstrap, retries=0, **{"message.timeout.ms": 3000})
    on_the_way = {KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, KafkaError.REQUEST_TIMED_OUT,
                  KafkaError._MSG_TIMED_OUT}
    probes = []

    def refuses():
        probe = Acks()
        produce_n(p1, topic, [0], 1, probe, f"probe{len(probes)}", deadline=10)
        assert not probe.acked, f"acks=all acknowledged with ISR {survivors} < 3: {probe.acked}"
        [(_, _, code)] = probe.failed
        probes.append(KafkaError(code).name())
        assert code == KafkaError.NOT_ENOUGH_REPLICAS or code in on_the_way, \
            f"probes failed with {probes}"
        return code == KafkaError.NOT_ENOUGH_REPLICAS
    cluster.wait_until(refuses, 30, "acks=all refused with NOT_ENOUGH_REPLICAS")
    refused = Acks()
    produce_n(p1, topic, [0], 20, refused, "below")
    assert not refused.acked, f"acknowledged with ISR {survivors} < min.insync.replicas 3: {refused.acked}"
    codes = {KafkaError(code).name() for (_, _, code) in refused.failed}
    assert codes == {"NOT_ENOUGH_REPLICAS"}, codes
    # acks=1 does not ask for min.insync.replicas.
    ones = Acks()
    produce_n(producer(cluster.bootstrap, acks="1"), topic, [0], 5, ones, "one")
    assert not ones.failed and len(ones.acked[0]) == 5, ones.failed[:3]
    assert cluster.leader_of(topic, 0) == leader
    assert cluster.controller_id() in survivors, "a live controller through the refusals"

    cluster.restart(victim)
    cluster.wait_until(lambda: cluster.isr_of(topic, 0) == sorted(cluster.ids), 40, "ISR back to three")
    produce_n(p, topic, [0], 30, acks, "again")
    assert not acks.failed and len(acks.acked[0]) == 60, acks.failed[:3]
    logs = check_log(cluster, topic, [0], acks.acked, absent=[v for (_, v, _) in refused.failed])
    assert set(ones.acked[0]) <= set(logs[0]), "acks=1 records kept"


# (c) ---------------------------------------------------------------------------------

def test_controller_failover_and_topic_creation(cluster):
    # Sluice's DescribeCluster names the raft leader of the metadata quorum (Apache
    # Kafka in KRaft mode names a random broker there instead).
    def controller_other_than(old):
        cid = cluster.controller_id()
        return cid if cid not in (-1, old) else None
    old = cluster.wait_until(lambda: controller_other_than(-1), 20, "a controller")
    cluster.kill(old)
    survivors = [i for i in cluster.ids if i != old]
    new = cluster.wait_until(lambda: controller_other_than(old), 20, "a new controller")
    assert new in survivors
    # Every surviving broker names the new controller.
    cluster.wait_until(lambda: all(metadata_from(cluster.addr(i), topics=[])["controller"] == new
                                   for i in survivors), 20, "survivors agree on the controller")
    # Topic creation goes through the new controller (RF 2: two brokers are left).
    cluster.create_topic("after-failover", partitions=2, rf=2, configs={"min.insync.replicas": "1"})
    acks = Acks()
    produce_n(producer(cluster.bootstrap), "after-failover", [0, 1], 20, acks, "cf")
    assert acks.count() == 20 and not acks.failed
    check_log(cluster, "after-failover", [0, 1], acks.acked)
    # The old controller comes back as a voter and a broker.
    cluster.restart(old)
    cluster.wait_until(lambda: cluster.registered() == set(cluster.ids), 30, "old controller rejoined")
    cluster.create_topic("after-rejoin", partitions=1, rf=3, configs=DURABLE)


# (d) ---------------------------------------------------------------------------------

def majority_meta(c, victim, topic):
    """The topic's partitions as a broker other than `victim` sees them."""
    for i in c.ids:
        if i != victim and c.alive(i):
            try:
                return metadata_from(c.addr(i), topics=[topic])["topics"][topic]["partitions"]
            except (OSError, KeyError):
                continue
    raise ConnectionError("no majority broker answers")  # transient: waits retry it


@pytest.mark.cores(2)
def test_isolated_broker_is_fenced_truncates_and_rejoins(proxied_cluster):
    c = proxied_cluster
    topic, parts = "iso", [0, 1]
    c.create_topic(topic, partitions=2, rf=3, configs=DURABLE)
    victim = c.leader_of(topic, 0)
    others = [i for i in c.ids if i != victim]
    acks = Acks()
    produce_n(producer(c.bootstrap), topic, parts, 200, acks, "pre")
    assert acks.count() == 200
    before = check_log(c, topic, parts, acks.acked)
    common = identical_on_disk(c, topic, 0, end=100)
    end_before = disk_end(c, victim, topic, 0)
    assert end_before == len(acks.acked[0]) == 100, (end_before, len(acks.acked[0]))

    links_through_proxies(c, victim)
    c.isolate(victim)  # cut from both other brokers; clients still reach it
    # Writes the isolated (still self-believed) leader takes alone: acks=1 is
    # acknowledged and must then be truncated away; acks=all must not be acknowledged
    # unless it truly reached every ISR member (checked at the end).
    diverged, stale_all = Acks(), Acks()
    produce_n(producer(c.addr(victim), acks="1", **SOLO), topic, [0], 20, diverged, "div", deadline=15)
    produce_n(producer(c.addr(victim), **SOLO), topic, [0], 5, stale_all, "stale", deadline=15)
    # The isolated leader really took the acks=1 writes, right after what all three
    # replicas shared, and holds them on disk: a tail that has to be truncated.
    assert diverged.offsets.get(0) == list(range(end_before, end_before + 20)), \
        (diverged.offsets, diverged.failed[:3])
    iso_end = disk_end_reaches(c, victim, topic, 0, end_before + 20)
    div_batches = [b for b in disk_batches(c.data_dir(victim), topic, 0) if b[0] >= end_before]
    assert disk_batches(c.data_dir(victim), topic, 0)[:len(common)] == common

    # Fenced: the majority moves leadership and drops the victim from every ISR.
    def moved():
        m = majority_meta(c, victim, topic)
        return all(m[p]["leader"] not in (-1, victim) and victim not in m[p]["isr"] for p in parts)
    wait_until(moved, 20, f"leadership off isolated broker {victim}")
    majority_boot = ",".join(c.addr(i) for i in others)
    produce_n(producer(majority_boot), topic, parts, 200, acks, "during")
    assert acks.count() == 400, acks.failed[:3]

    c.heal()
    wait_until(lambda: all(sorted(v["isr"]) == c.ids for v in majority_meta(c, victim, topic).values()),
               40, f"broker {victim} back in every ISR")
    produce_n(producer(c.bootstrap), topic, parts, 50, acks, "post")
    assert acks.count() == 450, acks.failed[:3]

    # Every acks=all acknowledgement survives; the isolated leader's acks=1 records
    # that never replicated are gone; the old log is a prefix of the new one.
    after = check_log(c, topic, parts, acks.acked,
                      absent=[v for vs in diverged.acked.values() for v in vs])
    for p in parts:
        assert after[p][:len(before[p])] == before[p], f"{topic}-{p}: history rewritten"
    lost = [v for v in stale_all.acked.get(0, []) if v not in after[0]]
    assert not lost, f"acks=all acknowledged by the isolated broker, then lost: {lost}"
    # All three replicas hold the same batches (same offsets, epochs, CRCs) on disk.
    final = {p: identical_on_disk(c, topic, p, end=len(after[p])) for p in parts}
    # The victim truncated its diverged tail: none of those batches is left, the
    # shared prefix is, and past it sit the new leader's batches (a newer epoch).
    assert final[0][:len(common)] == common
    assert not set(div_batches) & set(final[0]), "diverged batches kept"
    replaced = [b for b in final[0] if end_before <= b[0] < iso_end]
    assert replaced and all(b[2] > div_batches[0][2] for b in replaced), (div_batches[:2], replaced[:2])


def test_sigkilled_leader_with_unreplicated_tail_truncates_it_on_restart(proxied_cluster):
    """A leader takes acks=1 writes its followers never see (they are cut off), is
    SIGKILLed holding them on disk, a new leader takes other writes at those offsets;
    restarted, the old leader truncates its tail (its log end goes down) and ends up
    with exactly the batches the others hold."""
    c = proxied_cluster
    topic = "tail"
    c.create_topic(topic, partitions=1, rf=3, configs=DURABLE)
    old = c.leader_of(topic, 0)
    others = [i for i in c.ids if i != old]
    acks = Acks()
    produce_n(producer(c.bootstrap), topic, [0], 50, acks, "rep")
    assert acks.count() == 50 and not acks.failed
    common = identical_on_disk(c, topic, 0, end=50)
    assert disk_end(c, old, topic, 0) == 50

    links_through_proxies(c, old)
    c.isolate(old)  # its followers cannot fetch; clients still reach it
    tail = Acks()
    produce_n(producer(c.addr(old), acks="1", **SOLO), topic, [0], 30, tail, "tail", deadline=15)
    assert tail.offsets.get(0) == list(range(50, 80)), (tail.offsets, tail.failed[:3])
    end_before = disk_end_reaches(c, old, topic, 0, 80)
    tail_batches = [b for b in disk_batches(c.data_dir(old), topic, 0) if b[0] >= 50]
    assert end_before == 80 and tail_batches, (end_before, tail_batches)
    assert [disk_end(c, i, topic, 0) for i in others] == [50, 50], "followers got the tail"
    c.kill(old)  # SIGKILL with the unreplicated tail on disk
    assert disk_end(c, old, topic, 0) == end_before

    def new_leader():
        ldr = leader_or_none(c, topic, 0)
        return ldr if ldr not in (None, -1, old) else None
    wait_until(new_leader, 30, "a new leader")
    produce_n(producer(",".join(c.addr(i) for i in others)), topic, [0], 10, acks, "new")
    assert acks.count() == 60 and not acks.failed, acks.failed[:3]
    assert acks.offsets[0][-10:] == list(range(50, 60))
    # Healing only now: the proxy delivers the fetch responses it held back (the dead
    # leader's tail) to followers that have moved on to the new leader's epoch.
    c.heal()

    c.restart(old)
    wait_until(lambda: old in c.isr_of(topic, 0), 40, f"broker {old} back in the ISR")
    final = identical_on_disk(c, topic, 0, end=60)
    end_after = disk_end(c, old, topic, 0)
    assert end_after == 60 < end_before, (end_before, end_after)
    assert final[:len(common)] == common
    assert not set(tail_batches) & set(final), "the unreplicated tail survived the restart"
    check_log(c, topic, [0], acks.acked, absent=tail.acked[0])


# (e) ---------------------------------------------------------------------------------

@pytest.mark.cores(2)
def test_group_consumes_across_coordinator_failover(cluster):
    topic, group, parts = "gfo", f"gfo-{uuid.uuid4().hex[:6]}", [0, 1, 2]
    cluster.create_topic(topic, partitions=3, rf=3, configs=DURABLE)
    acks = Acks()
    p = producer(cluster.bootstrap)
    produce_n(p, topic, parts, 300, acks, "a")
    commits = {q: [] for q in parts}  # every committed offset, in commit order

    def consumer():
        cons = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                         "socket.connection.setup.timeout.ms": 3000,
                         "reconnect.backoff.max.ms": 500, "topic.metadata.refresh.interval.ms": 1000})
        cons.subscribe([topic])
        return cons

    seen = []  # (partition, offset, value)
    seen_at = set()

    def take(m):
        if m is None or (m.error() is not None and check_consumer_error(m.error())):
            return False
        q, off = m.partition(), m.offset()
        if (q, off) in seen_at:
            # At-least-once allows a redelivery only of what was not committed.
            assert not commits[q] or off >= commits[q][-1], \
                f"{q}@{off} consumed again though offset {commits[q][-1]} was committed"
        seen_at.add((q, off))
        seen.append((q, off, m.value()))
        return True

    def commit(cons, deadline=30):
        """Commits the consumed positions, retrying (and polling, so that a rebalance
        can complete) until the (possibly new) coordinator takes them."""
        end = time.monotonic() + deadline
        while True:
            try:
                res = cons.commit(asynchronous=False) or []
                errors = [tp.error for tp in res if tp.error is not None]
                if not errors:
                    break
                last_err = errors[0]
                assert all(is_transient(e, REJOIN) for e in errors), f"commit failed: {errors}"
            except KafkaException as e:
                if e.args[0].code() == KafkaError._NO_OFFSET:
                    return  # nothing consumed since the last commit
                if not is_transient(e, REJOIN):
                    raise
                last_err = e
            assert time.monotonic() < end, f"commit not accepted within {deadline}s: {last_err}"
            take(cons.poll(0.2))
        for tp in res:
            if tp.offset >= 0:
                commits[tp.partition].append(tp.offset)

    def consume_until(cons, pred, deadline, every=25):
        end = time.monotonic() + deadline
        since = 0
        while not pred():
            assert time.monotonic() < end, f"consumed {len(seen)} records, wanted more"
            if take(cons.poll(0.2)):
                since += 1
            if since >= every:
                commit(cons)
                since = 0
        commit(cons)

    a = consumer()
    consume_until(a, lambda: len(seen) >= 150, 40)
    def coordinator_of(group):
        d = cluster.admin().describe_consumer_groups([group], request_timeout=5)[group]
        return d.result(timeout=6).coordinator.id

    coordinator = cluster.wait_until(lambda: coordinator_of(group), 20, "the group's coordinator")
    cluster.kill(coordinator)
    produce_n(p, topic, parts, 150, acks, "b", deadline=40)
    assert acks.count() == 450, acks.failed[:3]
    # Same member keeps consuming (and committing) through the failover.
    consume_until(a, lambda: {v for (_, _, v) in seen} >= {v for vs in acks.acked.values() for v in vs}, 60)
    cluster.wait_until(lambda: coordinator_of(group) not in (coordinator, -1), 30, "a new coordinator")
    last = {q: commits[q][-1] for q in parts if commits[q]}
    a.close()

    # A new member resumes exactly from the committed offsets the new coordinator holds.
    produce_n(p, topic, parts, 60, acks, "c")
    b = consumer()
    got_b = []
    end = time.monotonic() + 40
    while len(got_b) < 60:
        assert time.monotonic() < end, f"second member got {len(got_b)} of 60"
        m = b.poll(0.2)
        if m is not None and m.error() is None:
            got_b.append((m.partition(), m.offset(), m.value()))
    firsts = {}
    for (q, off, _) in got_b:
        firsts.setdefault(q, off)
    assert firsts == {q: last.get(q, 0) for q in firsts}, (firsts, last)
    commit(b)
    b.close()

    for q in parts:
        assert commits[q] == sorted(commits[q]), f"partition {q}: commits went backwards {commits[q]}"
    everything = {v for vs in acks.acked.values() for v in vs}
    consumed = {v for (_, _, v) in seen} | {v for (_, _, v) in got_b}
    assert everything <= consumed, f"{len(everything - consumed)} records never consumed"
    # Nothing committed was consumed again by the second member.
    committed_values = {v for (q, off, v) in seen if off < last.get(q, 0)}
    assert not committed_values.intersection(v for (_, _, v) in got_b)


# Controlled shutdown and a rolling restart (issue 41) ---------------------------------

def test_sigterm_hands_leaderships_over_and_a_rolling_restart_loses_no_delivery(cluster):
    """SIGTERM makes a broker have the quorum move its leaderships to other in-sync
    replicas before it stops (Kafka's controlled shutdown): its own log says it led
    nothing once every shard adopted that, so clients never wait for the session
    timeout to find the new leaders. Restarting every broker in turn under an acks=all
    producer at the client's defaults fails no delivery, and every acknowledged record
    reads back. The longest delivery latency is reported, not asserted."""
    import threading
    topic = "rolling"
    parts = list(range(6))
    cluster.create_topic(topic, partitions=len(parts), rf=3, configs=DURABLE)
    acks = Acks()
    latencies = []

    def report(err, msg):
        acks(err, msg)
        if err is None:
            latencies.append(msg.latency())
    p = Producer({"bootstrap.servers": cluster.bootstrap})
    done = threading.Event()

    def run():
        i = 0
        while not done.is_set():
            part = parts[i % len(parts)]
            try:
                p.produce(topic, value=f"r-{part}-{i}".encode(), partition=part, on_delivery=report)
                i += 1
            except BufferError:
                pass
            p.poll(0.002)
    writer = threading.Thread(target=run, daemon=True)
    writer.start()
    try:
        for i in cluster.ids:
            before = acks.count()
            cluster.wait_until(lambda: acks.count() > before + 50, 30, "deliveries before the stop")
            assert cluster.brokers[i].stop() == 0, f"broker {i} did not stop cleanly"
            handed = re.findall(r"controlled shutdown: leaderships moved.*adopted=(\w+) led_here=(\d+)",
                                cluster.log(i))
            assert handed and handed[-1] == ("true", "0"), \
                f"broker {i} stopped without handing its leaderships over: {handed}"
            cluster.restart(i)
            cluster.wait_until(lambda: all(len(cluster.isr_of(topic, q)) == 3 for q in parts), 60,
                               f"full ISRs after broker {i} came back")
        before = acks.count()
        cluster.wait_until(lambda: acks.count() > before + 50, 30, "deliveries after the last restart")
    finally:
        done.set()
        writer.join(10)
    assert p.flush(60) == 0
    assert not acks.failed, f"{len(acks.failed)} failed deliveries, e.g. {acks.failed[:3]}"
    print(f"rolling restart: {acks.count()} records acknowledged, longest delivery "
          f"{max(latencies) * 1000:.0f} ms")
    check_log(cluster, topic, parts, acks.acked)


# DeleteRecords reaches the followers ------------------------------------------------

@pytest.mark.cores(2)
@pytest.mark.parametrize("partitions", [2, 120])
def test_deleted_records_stay_deleted_after_failover(cluster, partitions):
    from confluent_kafka import Consumer, TopicPartition
    topic = "trimmed"
    # At least two partitions (only 0 is used) so that, with --cores 2, each broker has
    # a log on each shard (a topic's partitions go round-robin over the shards). With
    # 120, each follower's session with each leader holds about 40 partitions, over
    # FEED_MIN_PARTS: its fetches read only what changed (src/partition/changes.rs),
    # and the log start must still reach it.
    cluster.create_topic(topic, partitions=partitions, rf=3, configs=DURABLE)
    acks = Acks()
    produce_n(producer(cluster.bootstrap), topic, [0], 40, acks, "t")
    assert acks.count() == 40 and not acks.failed
    futures = cluster.admin().delete_records([TopicPartition(topic, 0, 25)])
    for f in futures.values():
        assert f.result(30).low_watermark == 25
    # Followers learn the new log start from their next fetches; one more acknowledged
    # write (acks=all) proves both fetched after the deletion.
    produce_n(producer(cluster.bootstrap), topic, [0], 1, acks, "after")
    assert not acks.failed
    old = cluster.leader_of(topic, 0)
    cluster.kill(old)
    cluster.wait_until(lambda: leader_or_none(cluster, topic, 0) not in (None, -1, old), 30,
                       "a new leader")
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "wm"})
    seen = []

    def converged():
        # A new leader starts from the high watermark it knew as a follower and
        # advances it when the remaining follower fetches; the log start must be 25 in
        # every answer along the way.
        wm = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=2)
        if wm is None:
            return False
        seen.append(wm)
        assert wm[0] == 25, f"deleted records came back: watermarks {seen}"
        return wm[1] == 41
    try:
        cluster.wait_until(converged, 20, "watermarks (25, 41) from the new leader")
    finally:
        c.close()


def test_follower_behind_the_leaders_log_start_starts_over_there(cluster):
    from confluent_kafka import TopicPartition
    topic = "behind"
    cluster.create_topic(topic, partitions=1, rf=3, configs=DURABLE)
    leader = cluster.leader_of(topic, 0)
    lagger = next(i for i in cluster.replicas_of(topic, 0) if i != leader)
    acks = Acks()
    p = producer(cluster.bootstrap)
    produce_n(p, topic, [0], 10, acks, "early")
    cluster.kill(lagger)
    cluster.wait_until(lambda: lagger not in cluster.isr_of(topic, 0), 20, "ISR without the lagger")
    produce_n(p, topic, [0], 30, acks, "missed")
    assert acks.count() == 40 and not acks.failed
    # The leader deletes everything the lagger lacks (as retention would).
    for f in cluster.admin().delete_records([TopicPartition(topic, 0, 40)]).values():
        assert f.result(30).low_watermark == 40
    produce_n(p, topic, [0], 5, acks, "late")
    assert acks.count() == 45 and not acks.failed
    cluster.restart(lagger)
    cluster.wait_until(lambda: lagger in cluster.isr_of(topic, 0), 40,
                       "the lagger back in the ISR")

    def above_start(i):
        return [b for b in disk_batches(cluster.data_dir(i), topic, 0) if b[0] >= 40]
    # The lagger's log now holds exactly the leader's records from its log start on,
    # and nothing from before (its old records were dropped, not kept below a gap).
    wait_until(lambda: above_start(lagger) == above_start(leader) != [],
               20, "the lagger holds the leader's records from offset 40", retry=(OSError,))
    assert all(b[0] >= 40 for b in disk_batches(cluster.data_dir(lagger), topic, 0))


def _txn_state_partition(txn_id, partitions=50):
    h = 0
    for ch in txn_id.encode("utf-16-be").decode("utf-16-be"):
        h = (h * 31 + ord(ch)) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def _txn_stream_through_a_kill(cluster, topic, txn_id, victim_of):
    """A transactional producer commits 30 batches of 10 records to partition 0 of an
    RF=3 topic; after 10 batches the broker `victim_of(cluster)` names is SIGKILLed. A
    batch whose transaction fails is aborted and sent again. read_committed readers
    must see every batch exactly once, in order."""
    from confluent_kafka import KafkaException
    cluster.create_topic(topic, partitions=1, rf=3, configs=DURABLE)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id,
                  "transaction.timeout.ms": 10000, "socket.connection.setup.timeout.ms": 3000,
                  "reconnect.backoff.max.ms": 500, "message.timeout.ms": 10000})
    p.init_transactions(60)
    victim = victim_of(cluster)
    batches, killed, k = 30, False, 0
    end = time.monotonic() + 120
    while k < batches:
        assert time.monotonic() < end, f"stuck at batch {k}"
        if k == 10 and not killed:
            cluster.kill(victim)
            killed = True
        try:
            p.begin_transaction()
            for i in range(10):
                p.produce(topic, value=f"{k}-{i}".encode(), partition=0)
            p.commit_transaction(30)
            k += 1
        except KafkaException as e:
            err = e.args[0]
            assert err.txn_requires_abort() or err.retriable(), f"fatal: {err}"
            if err.txn_requires_abort():
                p.abort_transaction(30)
    values = [v.decode() for (_, _, v) in cluster.read_all(topic, 0, **{"isolation.level": "read_committed"})
              if v is not None]
    assert values == [f"{k}-{i}" for k in range(batches) for i in range(10)]


def test_transactions_survive_a_coordinator_sigkill(cluster):
    """The broker coordinating the transactional id dies: a replica of the id's
    __transaction_state partition takes over, reloads it and finishes what was
    prepared."""
    txn_id = "failover-txn"
    _txn_stream_through_a_kill(
        cluster, "txn-failover", txn_id,
        lambda c: c.leader_of("__transaction_state", _txn_state_partition(txn_id)))


def test_transactions_survive_a_partition_leader_sigkill(cluster):
    """The leader of the data partition dies mid-stream: the new leader knows the open
    transaction from the replicated log (producer state, last stable offset), and the
    markers go to it."""
    _txn_stream_through_a_kill(cluster, "txn-leader", "leader-txn",
                               lambda c: c.leader_of("txn-leader", 0))


def test_list_offsets_on_a_broker_without_the_partition_says_not_leader(cluster):
    """A broker that holds no replica of a partition answers NOT_LEADER_OR_FOLLOWER
    (the client then asks the leader), not a storage error."""
    import kafka_wire as kw
    topic = "spread"
    cluster.create_topic(topic, partitions=3, rf=1)
    leaders = {p: cluster.leader_of(topic, p) for p in range(3)}
    # Each broker's own metadata knows the topic: one without its image yet answers
    # UNKNOWN_TOPIC_OR_PARTITION, which is not what this test is about.
    for i in cluster.ids:
        wait_until(lambda: {q: v.get("leader") for q, v in metadata_from(cluster.addr(i), [topic])
                            ["topics"][topic]["partitions"].items()} == leaders,
                   20, f"broker {i} knowing {topic}", retry=(KeyError, OSError))
    for i in cluster.ids:
        conn = kw.Conn(cluster.addr(i))
        conn.send(kw.list_offsets_v1(topic, [0, 1, 2]))
        answers = kw.parse_list_offsets_v1(conn.recv()[1])
        conn.close()
        for p, (err, offset) in answers.items():
            if leaders[p] == i:
                assert (err, offset) == (0, 0), f"broker {i}, {topic}-{p}: {err}"
            else:
                assert err == 6, f"broker {i} holds no {topic}-{p} but answered {err}"


def test_list_offsets_v0_from_the_leader_or_for_debugging_any_replica(cluster):
    """ListOffsets v0 as Kafka answers it in a cluster: a consumer (replica id -1) gets
    offsets from the leader only, NOT_LEADER_OR_FOLLOWER elsewhere; Kafka's debugging
    replica id -2 is answered by any broker holding a replica, from its own log."""
    import struct
    import kafka_wire as kw
    topic = "v0-rf2"
    cluster.create_topic(topic, partitions=1, rf=2)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(5):
        p.produce(topic, f"v{i}".encode(), partition=0)
    assert p.flush(30) == 0
    leader, replicas = cluster.leader_of(topic, 0), cluster.replicas_of(topic, 0)
    # Each broker's own metadata knows the partition (else it would not know the topic).
    for i in cluster.ids:
        wait_until(lambda: metadata_from(cluster.addr(i), [topic])["topics"][topic]["partitions"]
                   .get(0, {}).get("leader") == leader, 20, f"broker {i} knowing {topic}",
                   retry=(KeyError, OSError))

    def ask(i, replica_id):
        body = kw.header(2, 0, 5) + struct.pack(">ii", replica_id, 1) + kw.string(topic)
        body += struct.pack(">iiqi", 1, 0, -1, 10)
        conn = kw.Conn(cluster.addr(i))
        conn.send(kw.frame(body))
        b = conn.recv()[1]
        conn.close()
        pos = 4 + 2 + len(topic) + 4
        part, err, n = struct.unpack_from(">ihi", b, pos)
        assert part == 0 and len(b) == pos + 10 + 8 * n
        return err, list(struct.unpack_from(f">{n}q", b, pos + 10))

    for i in cluster.ids:
        if i == leader:
            assert ask(i, -1) == (0, [5, 0]), f"leader {i}"
            assert ask(i, -2) == (0, [5, 0]), f"leader {i}"
        elif i in replicas:
            assert ask(i, -1) == (6, []), f"follower {i} answers consumers NOT_LEADER_OR_FOLLOWER"
            # The follower's own log end: all 5 once it has fetched them (acks=all: it has).
            assert ask(i, -2) == (0, [5, 0]), f"follower {i}, debugging replica id"
        else:
            assert ask(i, -1) == (6, []) and ask(i, -2) == (6, []), f"broker {i} holds no replica"


# (issue 17) ---------------------------------------------------------------------------

def test_new_partitions_and_new_leaders_do_not_wait_for_the_followers_poll(tmp_path):
    """A follower's fetcher long-polls its leader for the partitions it already has. A
    partition that starts following that leader meanwhile (a new topic, or a new leader
    after a failover) must be fetched at once, not after the poll ends, or every acks=all
    write to it waits for the poll. With --replica-fetch-wait-max-ms 30000 the polls
    outlast the producer's 15 s message timeout, so each write below is acknowledged only
    if the new partition's first fetch came before the running poll ended (the order of
    events, whatever the machine's speed)."""
    # cores=None: the broker's default --cores, as the cluster fixture's tests run.
    c = Cluster(tmp_path / "cluster", n=3, cores=None,
                extra=["--replica-fetch-wait-max-ms", "30000"]).start()
    try:
        # Every broker leads one partition of "idle" and follows the others: each has a
        # fetcher to each leader, parked in a 30 s poll once these writes are replicated.
        c.create_topic("idle", partitions=3, rf=3, configs=DURABLE)
        acks = Acks()
        p = producer(c.bootstrap, **{"message.timeout.ms": 15000, "request.timeout.ms": 15000})
        produce_n(p, "idle", [0, 1, 2], 3, acks, "idle", deadline=20)
        assert not acks.failed and acks.count() == 3, acks.failed

        # A new topic: its partitions join the parked fetchers.
        c.create_topic("fresh", partitions=3, rf=3, configs=DURABLE)
        acks = Acks()
        produce_n(p, "fresh", [0, 1, 2], 30, acks, "fresh", deadline=20)
        assert not acks.failed and acks.count() == 30, \
            f"acks=all on a new topic waited for the followers' running poll: {acks.failed[:3]}"

        # A new leader: the surviving follower of fresh-0 moves to the new leader's
        # fetcher, which is parked in a poll for the partitions it already had.
        old = c.leader_of("fresh", 0)
        c.kill(old)
        c.wait_until(lambda: leader_or_none(c, "fresh", 0) not in (None, -1, old), 30,
                     "a new leader for fresh-0")
        acks = Acks()
        produce_n(p, "fresh", [0], 10, acks, "failover", deadline=20)
        assert not acks.failed and acks.count() == 10, \
            f"acks=all after a leader change waited for the follower's running poll: {acks.failed[:3]}"
        p.flush(5)
    finally:
        c.stop()
