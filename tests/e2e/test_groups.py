"""Tier: black-box consumer groups with confluent-kafka (librdkafka 2.16) against a real
`sluice serve`: partition ownership, rebalances on close and on SIGKILL, committed
offsets across consumer and broker restarts, cooperative-sticky, several groups,
static membership. Every wait is bounded; session timeouts are small (6 s)."""
import os
import re
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cluster import port_free
from conftest import Lines, read_all, check_consumer_error, wait_until

SESSION_MS = 6000


def create_topic(addr, name, partitions, config=None):
    admin = AdminClient({"bootstrap.servers": addr})
    fs = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                       config=config or {})])
    fs[name].result(timeout=30)


def produce(addr, topic, n, start=0, keys=None):
    p = Producer({"bootstrap.servers": addr, "acks": "all", "linger.ms": 5})
    errors = []

    def cb(err, _msg):
        if err is not None:
            errors.append(err)

    for i in range(start, start + n):
        key = f"k{i % keys}" if keys else f"k{i}"
        p.produce(topic, key=key, value=f"v{i}", on_delivery=cb)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors


class Member:
    """A group consumer driven from the test thread (poll() serves its callbacks)."""

    def __init__(self, addr, group, topic, **conf):
        self.revoked, self.assigned_events = [], []
        cfg = {"bootstrap.servers": addr, "group.id": group, "enable.auto.commit": False,
               "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS,
               "heartbeat.interval.ms": 500, "enable.partition.eof": False}
        cfg.update(conf)
        self.c = Consumer(cfg)
        self.records = []
        self.c.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, _c, parts):
        self.assigned_events.append(sorted(p.partition for p in parts))

    def _on_revoke(self, _c, parts):
        self.revoked.append(sorted(p.partition for p in parts))

    def poll(self, timeout=0.1):
        for m in self.c.consume(num_messages=500, timeout=timeout):
            if m.error():
                check_consumer_error(m.error())  # end of partition or transient, else fails
                continue
            self.records.append((m.partition(), m.offset(), m.value().decode()))

    def assignment(self):
        return sorted(p.partition for p in self.c.assignment())

    def close(self):
        self.c.close()


def poll_until(members, pred, timeout=40, what="condition"):
    def step():
        for m in members:
            m.poll(0.05)
        return pred()
    return wait_until(step, timeout=timeout, interval=0, what=what)


def balanced(members, partitions):
    """Every partition owned by exactly one member, every member owning some."""
    owned = [p for m in members for p in m.assignment()]
    return sorted(owned) == list(range(partitions)) and all(m.assignment() for m in members)


@pytest.mark.parametrize("cores", [1, 2])
def test_three_members_share_partitions_then_close_moves_them(make_broker, cores):
    # With 2 cores, members' connections land on both shards while the group lives on
    # one: JoinGroup/SyncGroup wait across the mesh.
    broker = make_broker(cores=cores)
    topic, group = "g3", f"grp-{uuid.uuid4().hex[:6]}"
    create_topic(broker.addr, topic, 6)
    members = [Member(broker.addr, group, topic) for _ in range(3)]
    poll_until(members, lambda: balanced(members, 6), what="3 members own 6 partitions")
    assert [len(m.assignment()) for m in members] == [2, 2, 2]
    revoked_before = [len(m.revoked) for m in members]
    produce(broker.addr, topic, 600)
    poll_until(members, lambda: sum(len(m.records) for m in members) >= 600, what="600 records")
    got = [(p, o) for m in members for (p, o, _) in m.records]
    assert len(got) == len(set(got)) == 600, "no record twice while stable"
    for m in members:
        assert {p for (p, _, _) in m.records} <= set(m.assignment())
    assert [len(m.revoked) for m in members] == revoked_before, "membership stayed stable"
    # One member closes (LeaveGroup): its partitions move to the other two.
    members[2].close()
    rest = members[:2]
    poll_until(rest, lambda: balanced(rest, 6), timeout=SESSION_MS / 1000 + 20,
               what="partitions moved after close")
    for m in rest:
        m.close()


KILLED_MEMBER = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                  "session.timeout.ms": %d, "heartbeat.interval.ms": 500,
                  "auto.offset.reset": "earliest"})
    c.subscribe([sys.argv[3]])
    while True:
        c.poll(0.1)
        a = sorted(p.partition for p in c.assignment())
        print("ASSIGNED", ",".join(map(str, a)), flush=True)
""" % SESSION_MS)


def test_sigkilled_member_partitions_move_after_session_timeout(make_broker, tmp_path):
    broker = make_broker(env={"RUST_LOG": "info,sluice::coord::group=debug,sluice_coordinator=debug"})
    topic, group = "gk", f"grp-{uuid.uuid4().hex[:6]}"
    create_topic(broker.addr, topic, 6)
    script = tmp_path / "member.py"
    script.write_text(KILLED_MEMBER)
    proc = subprocess.Popen([sys.executable, str(script), broker.addr, group, topic],
                            stdout=subprocess.PIPE, text=True)
    lines = Lines(proc.stdout, "the member process")
    try:
        me = Member(broker.addr, group, topic)
        other = {"a": []}

        def both_own():
            for line in lines.ready():
                line = line.strip()
                if line.startswith("ASSIGNED"):
                    parts = line.split(" ", 1)[1] if " " in line else ""
                    other["a"] = [int(x) for x in parts.split(",") if x]
            assert not lines.closed, "the member process exited"
            return other["a"] and me.assignment() and \
                sorted(other["a"] + me.assignment()) == list(range(6))

        poll_until([me], both_own, what="two members own 6 partitions")
        state, ids = describe(broker.addr, group)
        assert state == "STABLE" and me.c.memberid() in ids and len(ids) == 2, (state, ids)
        [killed] = [i for i in ids if i != me.c.memberid()]
        proc.kill()
        proc.wait(timeout=10)
        poll_until([me], lambda: me.assignment() == list(range(6)),
                   timeout=SESSION_MS / 1000 + 30, what="partitions moved after SIGKILL")
        # They moved because the coordinator expired the dead member's session (not,
        # say, because its connection closed), and it expired nobody else.
        expired = re.findall(rf"session expired group={group} member=(\S+)", broker.read_log())
        assert expired == [killed], (expired, killed)
        me.close()
    finally:
        if proc.poll() is None:
            proc.kill()


def committed(addr, group, topic, partitions):
    c = Consumer({"bootstrap.servers": addr, "group.id": group})
    try:
        return {tp.partition: tp.offset for tp in
                c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)}
    finally:
        c.close()


def test_committed_offsets_survive_consumer_and_broker_restarts(make_broker, tmp_path):
    data = tmp_path / "data"
    b = make_broker(data_dir=data)
    topic, group = "gc", "grp-commit"
    create_topic(b.addr, topic, 2)
    produce(b.addr, topic, 100)
    m = Member(b.addr, group, topic)
    poll_until([m], lambda: len(m.records) >= 100, what="100 records")
    m.c.commit(asynchronous=False)
    ends = {}
    for (p, o, _) in m.records:
        ends[p] = max(ends.get(p, -1), o + 1)
    m.close()
    assert committed(b.addr, group, topic, 2) == ends
    # New consumers resume where the group committed.
    produce(b.addr, topic, 50, start=100)
    m = Member(b.addr, group, topic)
    poll_until([m], lambda: len(m.records) >= 50, what="50 new records")
    assert sorted(v for (_, _, v) in m.records) == sorted(f"v{i}" for i in range(100, 150))
    m.c.commit(asynchronous=False)
    m.close()
    ends2 = committed(b.addr, group, topic, 2)
    assert sum(ends2.values()) == 150
    # The broker restarts: the offsets come back from __consumer_offsets.
    port = b.port
    assert b.stop() == 0
    b = make_broker(data_dir=data, port=port)
    assert committed(b.addr, group, topic, 2) == ends2
    produce(b.addr, topic, 20, start=150)
    m = Member(b.addr, group, topic)
    poll_until([m], lambda: len(m.records) >= 20, what="20 records after restart")
    m.poll(1.0)
    assert sorted(v for (_, _, v) in m.records) == sorted(f"v{i}" for i in range(150, 170))
    m.close()


def generation_of(consumer):
    """The consumer's generation as librdkafka serialises its group metadata:
    b"CGMDv2:" then the generation id (int32, host order), then ids."""
    raw = consumer.consumer_group_metadata()
    assert raw[:7] == b"CGMDv2:", raw
    return struct.unpack("<i", raw[7:11])[0]


def describe(addr, group):
    """(state, [member ids]) from DescribeGroups."""
    admin = AdminClient({"bootstrap.servers": addr})
    d = admin.describe_consumer_groups([group])[group].result(timeout=20)
    return d.state.name, sorted(m.member_id for m in d.members)


def test_group_membership_survives_a_broker_restart(make_broker, tmp_path):
    """The coordinator rebuilds the group (members, generation, assignment) from its
    last GroupMetadata record: after a SIGTERM restart the consumer's heartbeats are
    accepted at its old generation, so it keeps consuming with no rejoin, and DescribeGroups
    shows the same member, Stable."""
    data = tmp_path / "data"
    extra = ["--group-initial-rebalance-delay-ms", "0"]
    b = make_broker(data_dir=data, extra=extra)
    topic, group = "grestart", f"grp-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 2)
    produce(b.addr, topic, 100)
    m = Member(b.addr, group, topic)
    poll_until([m], lambda: len(m.records) >= 100 and m.assignment() == [0, 1],
               what="100 records")
    gen = generation_of(m.c)
    assert 1 <= gen < 1000, gen
    state, ids = wait_until(lambda: describe(b.addr, group), what="describe before restart")
    assert state == "STABLE" and len(ids) == 1, (state, ids)
    events = (len(m.revoked), len(m.assigned_events))
    # A canary: a member of another group, with the same session timeout, that will
    # not heartbeat after the restart (its process is killed while the broker is down).
    canary_group = f"canary-{uuid.uuid4().hex[:6]}"
    script = tmp_path / "member.py"
    script.write_text(KILLED_MEMBER)
    canary = subprocess.Popen([sys.executable, str(script), b.addr, canary_group, topic],
                              stdout=subprocess.PIPE, text=True)
    try:
        Lines(canary.stdout, "the canary").until(lambda line: line.strip() == "ASSIGNED 0,1",
                                                 timeout=40, what="the canary to own both partitions")
        canary_state = wait_until(lambda: (lambda d: d[0] == "STABLE" and d)(describe(b.addr, canary_group)),
                                  what="canary group stable")
        port = b.port
        assert b.stop() == 0
    finally:
        canary.kill()
        canary.wait(timeout=10)
    b = make_broker(data_dir=data, port=port, extra=extra)
    # Loading __consumer_offsets brings both members back, with their generations.
    assert describe(b.addr, group) == ("STABLE", ids)
    assert describe(b.addr, canary_group) == canary_state, "the canary was restored too"
    produce(b.addr, topic, 50, start=100)
    poll_until([m], lambda: len(m.records) >= 150, what="records after the restart")
    # Both sessions started at load time. Once the silent canary has expired, a whole
    # session timeout has passed since then: the restored member is still there only
    # if its heartbeats (at generation `gen`) were accepted all along.
    poll_until([m], lambda: describe(b.addr, canary_group)[1] == [],
               timeout=SESSION_MS / 1000 + 30, what="the canary's session to expire")
    assert describe(b.addr, group) == ("STABLE", ids), "same member, no rebalance"
    assert generation_of(m.c) == gen, "generation unchanged"
    assert (len(m.revoked), len(m.assigned_events)) == events, "no rejoin"
    values = sorted(v for (_, _, v) in m.records)
    assert values == sorted(f"v{i}" for i in range(150)), "every record once"
    m.close()


def big_metadata_member(addr, group, topic, userdata, stop, events, assignment_userdata=0):
    """A kafka-python consumer in its own thread whose subscription carries `userdata`
    bytes of userdata (and, when it leads, whose assignment gives every member
    `assignment_userdata` bytes of it); it polls until `stop` is set, then closes.
    `events` collects ("assigned", member, partitions), ("records", member, n) and
    ("error", member, Kafka error code) for errors poll raises."""
    from kafka import KafkaConsumer, ConsumerRebalanceListener
    from kafka.errors import KafkaError
    from kafka.coordinator.assignors.abstract import (ConsumerProtocolAssignment,
                                                      ConsumerProtocolSubscription)
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    class BigRange(RangePartitionAssignor):
        @classmethod
        def metadata(cls, topics):
            return ConsumerProtocolSubscription(cls.version, list(topics), b"u" * userdata)

        @classmethod
        def assign(cls, cluster, members):
            given = super().assign(cluster, members)
            return {m: ConsumerProtocolAssignment(a.version, a.assignment, b"a" * assignment_userdata)
                    for m, a in given.items()}

    c = KafkaConsumer(bootstrap_servers=addr, group_id=group, auto_offset_reset="earliest",
                      enable_auto_commit=False, session_timeout_ms=SESSION_MS,
                      heartbeat_interval_ms=500, partition_assignment_strategy=[BigRange],
                      reconnect_backoff_max_ms=500)
    me = threading.current_thread().name

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            pass

        def on_partitions_assigned(self, assigned):
            events.append(("assigned", me, sorted(p.partition for p in assigned)))

    c.subscribe([topic], listener=Listener())
    try:
        while not stop.is_set():
            try:
                for recs in c.poll(timeout_ms=100).values():
                    events.append(("records", me, len(recs)))
            except KafkaError as e:
                events.append(("error", me, getattr(e, "errno", None)))
    finally:
        c.close()


def owners(events):
    """The last assignment each member reported in `events` (see start_members)."""
    last = {}
    for kind, who, parts in list(events):
        if kind == "assigned":
            last[who] = parts
    return last


def start_members(addr, group, topic, userdata, stop, events, n=4, assignment_userdata=0):
    """Starts `n` big_metadata_member threads named m0, m1, ...; returns them."""
    threads = []
    for i in range(n):
        t = threading.Thread(target=big_metadata_member, name=f"m{i}",
                             args=(addr, group, topic, userdata, stop, events, assignment_userdata),
                             daemon=True)
        t.start()
        threads.append(t)
    return threads


def test_group_metadata_over_1_mib_is_stored_and_survives_a_restart(make_broker, tmp_path):
    """A group whose GroupMetadata record is larger than max.message.bytes (1 MiB, as a
    10,000-member group's is; here 4 members with 320 KB of subscription userdata each)
    is stored anyway: after a SIGTERM restart the coordinator restores it, Stable with
    the same members, and they keep consuming with their assignments, no rejoin."""
    data = tmp_path / "data"
    extra = ["--group-initial-rebalance-delay-ms", "1000"]
    b = make_broker(data_dir=data, extra=extra)
    topic, group = "gbig", f"grp-big-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 4)
    stop, events = threading.Event(), []
    threads = start_members(b.addr, group, topic, 320_000, stop, events)
    try:
        def stable_with_all():
            d = describe(b.addr, group)
            ok = d[0] == "STABLE" and len(d[1]) == 4 and len(owners(events)) == 4
            return ok and sorted(p for ps in owners(events).values() for p in ps) == [0, 1, 2, 3] and d

        state, ids = wait_until(stable_with_all, timeout=60, what="4 members stable")
        assignments = owners(events)
        assigned_events = sum(1 for e in events if e[0] == "assigned")
        port = b.port
        assert b.stop() == 0
        b = make_broker(data_dir=data, port=port, extra=extra)
        # Loading __consumer_offsets brings the group back with its members.
        assert describe(b.addr, group) == ("STABLE", ids)
        produce(b.addr, topic, 40)
        wait_until(lambda: sum(n for kind, _, n in list(events) if kind == "records") >= 40,
                   timeout=40, what="40 records consumed after the restart")
        assert describe(b.addr, group) == ("STABLE", ids), "same members"
        assert owners(events) == assignments, "same assignments"
        assert sum(1 for e in events if e[0] == "assigned") == assigned_events, "no rejoin"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)


@pytest.mark.broker_log_errors(r"cannot store group metadata in __consumer_offsets")
def test_group_metadata_over_the_internal_limit_fails_syncs_and_stores_nothing(make_broker, tmp_path):
    """A GroupMetadata record over the broker's internal batch limit (32 MiB; here the
    leader gives each of 4 members 9 MB of assignment userdata, which no JoinGroup can
    foresee) cannot be stored: as Kafka, the members' SyncGroup answers
    UNKNOWN_SERVER_ERROR (-1) instead of an assignment, no member is told of a
    generation a restart would lose, and the offsets partition stays readable. (Members
    whose own subscriptions are that large are refused at JoinGroup instead: see
    test_members_whose_metadata_would_outgrow_the_record_are_refused_at_join.)"""
    data = tmp_path / "data"
    b = make_broker(data_dir=data, extra=["--group-initial-rebalance-delay-ms", "1000"])
    topic, group = "ghuge", f"grp-huge-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 4)
    stop, events = threading.Event(), []
    threads = start_members(b.addr, group, topic, 0, stop, events, assignment_userdata=9_000_000)
    try:
        wait_until(lambda: {who for kind, who, _ in list(events) if kind == "error"} ==
                   {"m0", "m1", "m2", "m3"}, timeout=60, what="every member told of the error")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    errors = {code for kind, _, code in events if kind == "error"}
    assert errors == {-1}, errors
    assert not [e for e in events if e[0] == "assigned" and e[2]], "no assignment handed out"
    port = b.port
    assert b.stop() == 0
    b = make_broker(data_dir=data, port=port)
    # No generation with members was stored (an Empty one is, once the members left).
    state, ids = describe(b.addr, group)
    assert state in ("DEAD", "EMPTY") and ids == [], (state, ids)
    # The partition still serves other groups.
    m = Member(b.addr, group, topic)
    produce(b.addr, topic, 20)
    poll_until([m], lambda: len(m.records) >= 20, what="a normal member of the same group")
    m.close()


def test_members_whose_metadata_would_outgrow_the_record_are_refused_at_join(make_broker):
    """The early refusal: 4 kafka-python members with 9 MB of subscription userdata each
    would make a GroupMetadata record over the 32 MiB batch limit. The coordinator
    estimates the record before admitting a member, so the member that would pass the
    limit gets GROUP_MAX_SIZE_REACHED (81) at JoinGroup, while the other three form a
    generation, are stored and own every partition (instead of the whole group failing
    at SyncGroup and rebalancing for ever)."""
    b = make_broker(extra=["--group-initial-rebalance-delay-ms", "1000"])
    topic, group = "gearly", f"grp-early-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 4)
    stop, events = threading.Event(), []
    threads = start_members(b.addr, group, topic, 9_000_000, stop, events)

    def settled():
        refused = {who for kind, who, _ in list(events) if kind == "error"}
        state, ids = describe(b.addr, group)
        own = {who: ps for who, ps in owners(events).items() if ps}
        ok = (len(refused) == 1 and state == "STABLE" and len(ids) == 3 and len(own) == 3
              and sorted(p for ps in own.values() for p in ps) == [0, 1, 2, 3])
        return ok and (refused, set(own))

    try:
        refused, owning = wait_until(settled, timeout=60,
                                     what="3 members own the partitions, 1 refused")
        assert not refused & owning, (refused, owning)
        produce(b.addr, topic, 40)
        wait_until(lambda: sum(n for kind, _, n in list(events) if kind == "records") >= 40,
                   timeout=40, what="40 records consumed by the three")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    errors = {code for kind, _, code in events if kind == "error"}
    assert errors == {81}, errors
    assert {who for kind, who, _ in events if kind == "error"} == refused


def test_group_max_size_refuses_the_third_consumer_and_keeps_the_first_two(make_broker):
    """group.max.size (--group-max-size 2, Kafka's semantics): a third confluent-kafka
    consumer of a full group gets GROUP_MAX_SIZE_REACHED from consume(), and the first
    two keep their partitions with no rebalance. DescribeConfigs shows the setting."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import ConfigResource
    b = make_broker(extra=["--group-max-size", "2", "--group-initial-rebalance-delay-ms", "0"])
    admin = AdminClient({"bootstrap.servers": b.addr})
    res = ConfigResource(ConfigResource.Type.BROKER, "1")
    conf = admin.describe_configs([res])[res].result(timeout=20)
    assert conf["group.max.size"].value == "2"
    topic, group = "gmax", f"grp-max-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 4)
    first = [Member(b.addr, group, topic) for _ in range(2)]
    poll_until(first, lambda: balanced(first, 4), what="2 members own 4 partitions")
    owned = [m.assignment() for m in first]
    events = [(len(m.revoked), len(m.assigned_events)) for m in first]
    third = Consumer({"bootstrap.servers": b.addr, "group.id": group,
                      "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500,
                      "auto.offset.reset": "earliest"})
    third.subscribe([topic])
    try:
        def refused():
            for m in first:
                m.poll(0.05)
            for msg in third.consume(num_messages=10, timeout=0.1):
                err = msg.error()
                if err is not None and err.code() == KafkaError.GROUP_MAX_SIZE_REACHED:
                    return (err,)
                if err is not None:
                    check_consumer_error(err)
            return None

        (err,) = poll_until([], refused, what="the third consumer told GROUP_MAX_SIZE_REACHED")
        assert err.code() == 81, err
        assert third.assignment() == []
        # The first two were not disturbed: same partitions, no rebalance, and they
        # still consume; the group has exactly them.
        produce(b.addr, topic, 100)
        poll_until(first, lambda: sum(len(m.records) for m in first) >= 100, what="100 records")
        assert [m.assignment() for m in first] == owned
        assert [(len(m.revoked), len(m.assigned_events)) for m in first] == events
        state, ids = describe(b.addr, group)
        assert state == "STABLE" and len(ids) == 2, (state, ids)
    finally:
        third.close()
        for m in first:
            m.close()


def test_cooperative_sticky_rebalances_incrementally(broker):
    topic, group = "gs", f"grp-{uuid.uuid4().hex[:6]}"
    create_topic(broker.addr, topic, 6)
    conf = {"partition.assignment.strategy": "cooperative-sticky"}
    a = Member(broker.addr, group, topic, **conf)
    poll_until([a], lambda: a.assignment() == list(range(6)), what="first member owns all")
    produce(broker.addr, topic, 300)
    poll_until([a], lambda: len(a.records) >= 300, what="first 300")
    b = Member(broker.addr, group, topic, **conf)
    poll_until([a, b], lambda: balanced([a, b], 6), what="incremental rebalance")
    # Incremental: the first member gave up only what moved, never everything.
    assert a.revoked and all(len(r) < 6 for r in a.revoked), a.revoked
    kept = set(a.assignment())
    assert kept and kept <= set(range(6))
    # The partitions that stayed keep being consumed by the same member.
    before = len(a.records)
    produce(broker.addr, topic, 300, start=300)
    poll_until([a, b], lambda: len(a.records) + len(b.records) >= 600, what="next 300")
    assert {p for (p, _, _) in a.records[before:]} <= kept
    a.close()
    b.close()


def test_partitions_added_to_a_live_topic_are_consumed_by_the_running_group(broker):
    """CreatePartitions on a topic a group consumes (issue 41): the members notice the
    new partition count (librdkafka's metadata refresh), rebalance onto the new
    partitions, and consume what is written there."""
    from confluent_kafka.admin import NewPartitions
    topic, group = "grows", f"grp-{uuid.uuid4().hex[:6]}"
    create_topic(broker.addr, topic, 2)
    conf = {"topic.metadata.refresh.interval.ms": 1000}
    a, b = Member(broker.addr, group, topic, **conf), Member(broker.addr, group, topic, **conf)
    poll_until([a, b], lambda: balanced([a, b], 2), what="two members on two partitions")
    admin = AdminClient({"bootstrap.servers": broker.addr})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=30)
    poll_until([a, b], lambda: balanced([a, b], 4), what="the group rebalanced onto 4 partitions")
    p = Producer({"bootstrap.servers": broker.addr})
    for part in range(4):
        for i in range(25):
            p.produce(topic, value=f"n{part}-{i}", partition=part)
    assert p.flush(30) == 0
    poll_until([a, b], lambda: len(a.records) + len(b.records) >= 100, what="100 records")
    got = sorted(v for m in (a, b) for (_, _, v) in m.records)
    assert got == sorted(f"n{part}-{i}" for part in range(4) for i in range(25))
    # Each new partition was read by the member that owns it.
    for m in (a, b):
        assert {q for (q, _, _) in m.records} <= set(m.assignment())
    a.close()
    b.close()


def test_two_groups_each_see_all_data(broker):
    topic = "g2"
    create_topic(broker.addr, topic, 4)
    produce(broker.addr, topic, 400)
    x = Member(broker.addr, "grp-x", topic)
    y = Member(broker.addr, "grp-y", topic)
    poll_until([x, y], lambda: len(x.records) >= 400 and len(y.records) >= 400, what="both groups")
    for m in (x, y):
        assert sorted(v for (_, _, v) in m.records) == sorted(f"v{i}" for i in range(400))
        m.close()


def test_static_member_restart_keeps_its_partitions_without_rebalance(broker):
    topic, group = "gst", f"grp-{uuid.uuid4().hex[:6]}"
    create_topic(broker.addr, topic, 4)

    def static(i):
        return Member(broker.addr, group, topic, **{"group.instance.id": f"inst-{i}",
                                                    "session.timeout.ms": 10000})
    a, b = static(1), static(2)
    poll_until([a, b], lambda: balanced([a, b], 4), what="two static members")
    b_parts, a_parts = b.assignment(), a.assignment()
    a_events = (len(a.revoked), len(a.assigned_events))
    gen = generation_of(a.c)
    assert generation_of(b.c) == gen
    # Static members do not leave on close; the restart comes back within the session.
    b.close()
    b2 = static(2)
    poll_until([a, b2], lambda: b2.assignment() == b_parts, timeout=20, what="static rejoin")
    # No rebalance: the restarted member joined the current generation (a rebalance
    # would have completed a new one before it got its partitions back), and the
    # other member never gave anything up.
    assert generation_of(b2.c) == gen, "the rejoin started a new generation"
    assert generation_of(a.c) == gen
    assert a.assignment() == a_parts
    assert (len(a.revoked), len(a.assigned_events)) == a_events, "no rebalance"
    a.close()
    b2.close()


def test_static_members_expire_at_their_session_timeout(make_broker):
    """Issue 43 item 4 (librdkafka's 0081): three static members (group.instance.id,
    session.timeout.ms=6000, the broker's minimum) close, which for a static member
    sends no LeaveGroup. A DeleteGroups sent once their session timeout has passed
    finds the group empty: each expired at its session timeout (checked as an ordering,
    not a timed assert: the request goes after the timeout, the answer must not be
    NON_EMPTY_GROUP)."""
    b = make_broker(cores=2)
    topic, group = "gexp", f"grp-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 3)
    members = [Member(b.addr, group, topic, **{"group.instance.id": f"exp-{i}",
                                               "session.timeout.ms": 6000})
               for i in range(3)]
    poll_until(members, lambda: balanced(members, 3), what="three static members")
    for m in members:
        m.close()
    closed = time.monotonic()
    # The precondition is time itself: the session timeout (6 s) has passed, plus the
    # coordinator's 100 ms expiry tick and a slow machine's late heartbeat.
    time.sleep(max(0.0, closed + 6.0 + 1.5 - time.monotonic()))
    admin = AdminClient({"bootstrap.servers": b.addr})
    admin.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=30)


def sluice_group(addr, *args):
    out = subprocess.run([os.environ.get("SLUICE_BIN", "target/release/sluice"), "group",
                          "--bootstrap", addr, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def lag_rows(text):
    """(topic, partition) -> (current, end, lag, member, host) from `sluice group describe`."""
    rows = {}
    for line in text.splitlines()[2:]:
        f = line.split()
        rows[(f[1], int(f[2]))] = (f[3], f[4], f[5], f[6], f[7])
    return rows


def test_cli_shows_lag_on_two_cores_and_resets_and_deletes(make_broker):
    # Two shards: group state lives on the shard owning the group's __consumer_offsets
    # partition; requests arriving on the other shard cross the mesh.
    b = make_broker(cores=2)
    topic = "glag"
    create_topic(b.addr, topic, 4)
    produce(b.addr, topic, 400)
    groups = [f"lag-{i}" for i in range(4)]
    for g in groups:
        m = Member(b.addr, g, topic)
        poll_until([m], lambda: len(m.records) >= 100, what="100 records")
        m.c.commit(asynchronous=False)
        consumed = {}
        for (p, o, _) in m.records:
            consumed[p] = max(consumed.get(p, -1), o + 1)
        rows = lag_rows(sluice_group(b.addr, "describe", g))
        assert len(rows) == 4
        total_lag = sum(int(r[2]) for r in rows.values() if r[2] != "-")
        uncommitted = sum(int(r[1]) for r in rows.values() if r[0] == "-")
        assert total_lag + uncommitted == 400 - sum(consumed.values())
        assert all(r[3].startswith("rdkafka") and r[4] == "/127.0.0.1" for r in rows.values()), rows
        m.close()
    listed = sluice_group(b.addr, "list")
    for g in groups:
        assert g in listed
    sluice_group(b.addr, "reset-offsets", "--group", groups[0], "--topic", topic, "--to-earliest")
    rows = lag_rows(sluice_group(b.addr, "describe", groups[0]))
    assert sum(int(r[2]) for r in rows.values()) == 400
    sluice_group(b.addr, "reset-offsets", "--group", groups[0], "--topic", topic, "--to-latest")
    rows = lag_rows(sluice_group(b.addr, "describe", groups[0]))
    assert all(r[2] == "0" for r in rows.values())
    assert committed(b.addr, groups[0], topic, 4) == {p: int(rows[(topic, p)][1]) for p in range(4)}
    sluice_group(b.addr, "delete", groups[0])
    assert groups[0] not in sluice_group(b.addr, "list")
    assert all(v < 0 for v in committed(b.addr, groups[0], topic, 4).values())


def test_kafka_python_group_consumer_commits_and_resumes(broker):
    from kafka import KafkaConsumer
    topic = "gkp"
    create_topic(broker.addr, topic, 3)
    produce(broker.addr, topic, 90)

    def consume(expected):
        c = KafkaConsumer(topic, bootstrap_servers=broker.addr, group_id="grp-kp",
                          auto_offset_reset="earliest", enable_auto_commit=False,
                          session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
        got = []

        def more():
            for recs in c.poll(timeout_ms=200).values():
                got.extend(r.value.decode() for r in recs)
            return len(got) >= expected
        wait_until(more, timeout=40, interval=0, what=f"{expected} records via kafka-python")
        c.commit()
        c.close()
        return got

    assert sorted(consume(90)) == sorted(f"v{i}" for i in range(90))
    produce(broker.addr, topic, 30, start=90)
    assert sorted(consume(30)) == sorted(f"v{i}" for i in range(90, 120))


def test_kcat_balanced_consumer_librdkafka_2_0_2(broker):
    topic = "gkc"
    create_topic(broker.addr, topic, 2)
    produce(broker.addr, topic, 40)
    r = subprocess.run(["kcat", "-b", broker.addr, "-G", "grp-kcat", "-c", "40", "-q",
                        "-X", "auto.offset.reset=earliest", "-f", "%s\n", topic],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert sorted(r.stdout.decode().split()) == sorted(f"v{i}" for i in range(40))
    # kcat commits on close: the group's offsets cover everything.
    assert sum(committed(broker.addr, "grp-kcat", topic, 2).values()) == 40


def key_counts(recs):
    counts = {}
    for _, k, _ in recs:
        if k != "filler":
            counts[k] = counts.get(k, 0) + 1
    return counts


def cleaned_files(part_dir):
    return [f for f in os.listdir(part_dir) if f.endswith(".cleaned")]


def test_compaction_cleans_every_closed_segment_soon_after_a_roll(make_broker):
    """Issue 43 item 2, as librdkafka's test 0077 does it: 4 keys x 250 records into a
    compacted topic whose segments roll by time (segment.ms=500, dirty ratio 0.01), then
    one more record after the last segment aged, which rolls it. With retention checked
    only every ten minutes and the cleaner's backoff at 1 s, the cleaner compacts every
    closed segment on its own schedule, in one go: reading from the beginning soon gives
    the latest record of each key and the new record, nothing else."""
    b = make_broker(extra=["--log-cleaner-backoff-ms", "1000",
                           "--log-retention-check-interval-ms", "600000"])
    topic = "rolled-compact"
    create_topic(b.addr, topic, 1, config={
        "cleanup.policy": "compact", "segment.ms": "500", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0"})
    p = Producer({"bootstrap.servers": b.addr, "linger.ms": 5})
    for i in range(1000):
        p.produce(topic, key=f"k{i % 4}", value=f"v{i}".encode(), partition=0)
    assert p.flush(30) == 0
    # The active segment must be older than segment.ms for the next append to roll it.
    time.sleep(0.6)
    p.produce(topic, key="end", value=b"last", partition=0)
    assert p.flush(30) == 0

    def compacted():
        recs = read_all(b.addr, topic)
        return len(recs) == 5 and recs
    recs = wait_until(compacted, timeout=30, interval=0.2, what="every closed segment compacted")
    assert [(k, v) for (_, k, v) in recs] == [("k0", "v996"), ("k1", "v997"), ("k2", "v998"),
                                             ("k3", "v999"), ("end", "last")]


def test_compaction_keeps_latest_value_per_key_with_offsets(make_broker, tmp_path):
    """cleanup.policy=compact with small segments and a 500 ms cleaner backoff:
    (1) after cleaning each key keeps only its latest value at its original offset and
    tombstones are still there (delete.retention.ms is a day); (2) with delete.retention.ms
    altered to 0, the next cleaning drops the tombstones and no surviving record moves; (3) a broker SIGKILLed
    while the cleaner is rewriting a segment restarts with a readable log holding the
    latest value of every key, and cleaning then completes."""
    data = tmp_path / "data"
    extra = ["--log-cleaner-backoff-ms", "500"]
    b = make_broker(data_dir=data, extra=extra)
    topic = "gcompact"
    part_dir = os.path.join(str(data), f"{topic}-0")
    create_topic(b.addr, topic, 1, config={
        "cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "86400000"})
    p = Producer({"bootstrap.servers": b.addr, "acks": "all", "linger.ms": 0})
    latest, produced = {}, {}

    def send(key, value):
        def cb(err, msg):
            assert err is None, err
            v = value.decode() if value is not None else None
            latest[key] = (msg.offset(), v)
            produced[msg.offset()] = (key, v)
        p.produce(topic, key=key, value=value, partition=0, on_delivery=cb)
        p.flush(10)

    def fill(n, tag):  # rolls past the segment holding the updates: it becomes cleanable
        for i in range(n):
            send("filler", f"{tag}{i}".encode())

    for round_ in range(15):
        for k in range(20):
            send(f"k{k}", f"value-{k}-{round_}".encode())
    for k in range(5):
        send(f"k{k}", None)
    fill(60, "f")
    total = len(produced)

    def compacted():
        recs = read_all(b.addr, topic)
        counts = key_counts(recs)
        return len(recs) < total and len(counts) == 20 and set(counts.values()) == {1} and recs

    recs = wait_until(compacted, timeout=60, interval=0.2, what="the cleaner to compact the log")
    by_key = {k: (o, v) for (o, k, v) in recs if k != "filler"}
    for k in range(20):
        assert by_key[f"k{k}"] == latest[f"k{k}"], "latest value at its original offset"
    # Tombstones younger than delete.retention.ms are kept by cleaning.
    assert all(by_key[f"k{k}"][1] is None for k in range(5))
    assert all(produced[o] == (k, v) for (o, k, v) in recs), "records are what was written there"
    offsets = [o for (o, _, _) in recs]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    # (2) Tombstones go once delete.retention.ms has passed: make it 0. A cleaning pass
    # runs when new dirty data has rolled into a closed segment, so keep writing
    # fillers until a pass has dropped them (bounded).
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("delete.retention.ms", "0", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": b.addr})
    admin.incremental_alter_configs([res])[res].result(timeout=30)
    def tombstones_gone():
        fill(20, "g")
        now = read_all(b.addr, topic)
        keys = key_counts(now)
        return all(f"k{k}" not in keys for k in range(5)) and now
    after = wait_until(tombstones_gone, timeout=60, interval=0.5, what="tombstones to be dropped")
    survivors = [(o, k, v) for (o, k, v) in recs if k != "filler" and v is not None]
    assert [(o, k, v) for (o, k, v) in after if k != "filler"] == survivors, \
        "surviving records keep their offsets"
    assert all(produced[o] == (k, v) for (o, k, v) in after)

    # (3) SIGKILL while the cleaner is rewriting a segment (a `.cleaned` file exists).
    caught = False
    for round_ in range(15, 40):
        for k in range(5, 20):
            send(f"k{k}", f"value-{k}-{round_}".encode())
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline and not caught:
            caught = bool(cleaned_files(part_dir))
        if caught:
            break
    del p  # its reconnect attempts must not race the restart for the port
    b.kill()
    # The kernel tears a killed process's io_uring down asynchronously (in-flight
    # cleaner writes finish first), and the listening socket goes with it.
    wait_until(lambda: port_free(b.port), timeout=30, what="the killed broker's port to free")
    b = make_broker(data_dir=data, port=b.port, extra=extra)
    assert not cleaned_files(part_dir), "recovery removes half-written cleaned segments"
    recs = read_all(b.addr, topic)
    offsets = [o for (o, _, _) in recs]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert all(produced[o] == (k, v) for (o, k, v) in recs), "records are what was written there"
    last = {k: (o, v) for (o, k, v) in recs}
    for k in range(5, 20):
        assert last[f"k{k}"] == latest[f"k{k}"], "latest value per key after the crash"
    assert all(f"k{k}" not in last for k in range(5)), "dropped tombstones stay dropped"
    # Cleaning resumes and completes after the restart (fillers roll the last updates
    # out of the active segment, which is never cleaned).
    p = Producer({"bootstrap.servers": b.addr, "acks": "all", "linger.ms": 0})

    def clean_again():
        fill(20, "h")
        return set(key_counts(read_all(b.addr, topic)).values()) == {1}
    wait_until(clean_again, timeout=60, interval=0.5, what="cleaning to complete after the crash")
    final = {k: (o, v) for (o, k, v) in read_all(b.addr, topic)}
    assert all(final[f"k{k}"] == latest[f"k{k}"] for k in range(5, 20))
    print(f"killed mid-clean: {caught}")
    assert caught, "the broker was killed while a segment was being cleaned"
    assert b.stop() == 0
