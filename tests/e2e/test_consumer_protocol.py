"""Tier: black-box consumer groups of the next protocol (KIP-848) with confluent-kafka
(librdkafka 2.16) at `group.protocol=consumer` against real `sluice serve` processes:
members join and leave one at a time while a checker over the assignment callbacks sees
every partition owned by at most one member at every moment; a SIGKILLed member is
fenced after its session and its partitions move; a static member comes back to its
partitions without moving anything; a regex subscription picks up a topic created
later; a coordinator SIGKILLed in a 3-broker cluster leaves the group, its epochs and
its members as they were. The broker's session timeout and heartbeat interval are
short (4 s, 250 ms); everything else is the client's default."""
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cluster import Cluster
from conftest import Lines, check_consumer_error, wait_until

SESSION_MS = 4000
FLAGS = ["--group-consumer-session-timeout-ms", str(SESSION_MS),
         "--group-consumer-heartbeat-interval-ms", "250"]
SLUICE_BIN = os.environ.get("SLUICE_BIN", "target/release/sluice")


def create_topic(addr, name, partitions, rf=1):
    admin = AdminClient({"bootstrap.servers": addr})
    admin.create_topics([NewTopic(name, num_partitions=partitions,
                                  replication_factor=rf)])[name].result(timeout=30)


def produce(addr, topic, n, start=0):
    p = Producer({"bootstrap.servers": addr})
    errors = []
    for i in range(start, start + n):
        p.produce(topic, value=f"v{i}".encode(),
                  on_delivery=lambda err, _m: err is not None and errors.append(err))
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors


class Owners:
    """Who owns each partition, from the members' assignment callbacks (all members
    are polled from the test's one thread, so callbacks are seen in the order they
    ran). A partition given to a member while another still owns it is a violation."""

    def __init__(self):
        self.owner = {}
        self.violations = []
        self.events = 0

    def assigned(self, name, parts):
        self.events += 1
        for p in parts:
            key = (p.topic, p.partition)
            if self.owner.get(key) not in (None, name):
                self.violations.append(f"{key} given to {name} while {self.owner[key]} owns it")
            self.owner[key] = name

    def revoked(self, name, parts):
        self.events += 1
        for p in parts:
            key = (p.topic, p.partition)
            if self.owner.get(key) == name:
                del self.owner[key]


class Member:
    """A KIP-848 consumer at the client's defaults, driven from the test thread. On
    revocation it commits what it consumed of the partitions it gives up (what careful
    applications do), so a record is consumed again only if it was not committed."""

    def __init__(self, addr, group, topics, owners, name, **conf):
        self.name, self.owners = name, owners
        cfg = {"bootstrap.servers": addr, "group.id": group, "group.protocol": "consumer",
               "auto.offset.reset": "earliest"}
        cfg.update(conf)
        self.c = Consumer(cfg)
        self.records = []
        self.revocations = 0
        self.positions = {}
        self.c.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                         on_lost=self._on_lost)

    def _on_assign(self, _c, parts):
        if self.owners:
            self.owners.assigned(self.name, parts)

    def _on_revoke(self, c, parts):
        self.revocations += 1
        done = [TopicPartition(p.topic, p.partition, self.positions[(p.topic, p.partition)])
                for p in parts if (p.topic, p.partition) in self.positions]
        if done:
            c.commit(offsets=done, asynchronous=False)
        if self.owners:
            self.owners.revoked(self.name, parts)

    def _on_lost(self, _c, parts):
        if self.owners:
            self.owners.revoked(self.name, parts)

    def poll(self, timeout=0.05):
        for m in self.c.consume(num_messages=500, timeout=timeout):
            if m.error():
                check_consumer_error(m.error())
                continue
            self.records.append((m.topic(), m.partition(), m.offset()))
            self.positions[(m.topic(), m.partition())] = m.offset() + 1

    def owned(self):
        return sorted((p.topic, p.partition) for p in self.c.assignment())

    def close(self):
        self.c.close()


def poll_until(members, pred, timeout=30, what="condition"):
    def step():
        for m in members:
            m.poll()
        return pred()
    return wait_until(step, timeout=timeout, interval=0, what=what)


def split(members, n):
    """Every one of n partitions owned by exactly one member, evenly (counts at most one
    apart: the uniform assignor's end state), every member owning some."""
    owned = [tp for m in members for tp in m.owned()]
    counts = [len(m.owned()) for m in members]
    return len(owned) == n == len(set(owned)) and min(counts) > 0 and \
        max(counts) - min(counts) <= 1


def describe(addr, group):
    """The group as `sluice group describe` shows it: (header line, member rows)."""
    out = subprocess.run([SLUICE_BIN, "group", "--bootstrap", addr, "describe", group],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = lines.index(next(ln for ln in lines if ln.startswith("MEMBER-ID")))
    rows = {}
    for ln in lines[start + 1:]:
        if ln.startswith("Group "):
            break
        f = ln.split()
        rows[f[0]] = {"epoch": int(f[1]), "instance": f[2]}
    return lines[0], rows


def group_epoch(header):
    return int(re.search(r"group epoch (\d+)", header).group(1))


def test_members_join_and_leave_one_at_a_time_and_no_partition_has_two_owners(make_broker):
    b = make_broker(cores=2, extra=FLAGS)
    topic, group = f"kip848-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 12)
    produce(b.addr, topic, 2400)
    owners = Owners()
    members = []
    for i in range(4):
        members.append(Member(b.addr, group, [topic], owners, f"m{i}"))
        poll_until(members, lambda: split(members, 12), what=f"{len(members)} members split 12")
    assert sorted(len(m.owned()) for m in members) == [3, 3, 3, 3]
    header, rows = describe(b.addr, group)
    assert "consumer protocol (KIP-848), state Stable" in header, header
    assert {r["epoch"] for r in rows.values()} == {group_epoch(header)}, (header, rows)
    assert sorted(rows) == sorted(m.c.memberid() for m in members)
    listed = subprocess.run([SLUICE_BIN, "group", "--bootstrap", b.addr, "list"],
                            capture_output=True, text=True, timeout=30).stdout
    assert re.search(rf"^{group}\s+Stable\s+consumer\s+consumer$", listed, re.M), listed
    everyone = list(members)
    # Leave one at a time: the others take the partitions over.
    while len(members) > 1:
        members.pop().close()
        poll_until(members, lambda: split(members, 12), what=f"{len(members)} members split 12")
    produce(b.addr, topic, 2400, start=2400)
    poll_until(members, lambda: len({r for m in everyone for r in m.records}) >= 4800,
               what="every record")
    members[0].close()
    assert not owners.violations, owners.violations[:5]
    assert owners.events >= 10, owners.events
    # Each member committed what it consumed of what it gave up: nothing twice.
    got = [r for m in everyone for r in m.records]
    assert len(got) == len(set(got)) == 4800, (len(got), len(set(got)))


def test_a_sigkilled_member_is_fenced_after_its_session_and_its_partitions_move(make_broker,
                                                                              tmp_path):
    b = make_broker(extra=FLAGS)
    topic, group = f"kill-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 6)
    script = tmp_path / "member.py"
    script.write_text(textwrap.dedent("""
        import sys
        from confluent_kafka import Consumer
        c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                      "group.protocol": "consumer"})
        c.subscribe([sys.argv[3]])
        while True:
            c.poll(0.1)
            print("OWNS", c.memberid(), len(c.assignment()), flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script), b.addr, group, topic],
                            stdout=subprocess.PIPE, text=True)
    lines = Lines(proc.stdout, "the member process")
    try:
        owners = Owners()
        me = Member(b.addr, group, [topic], owners, "me")
        other = {}

        def both_own():
            for line in lines.ready():
                f = line.split()
                if f and f[0] == "OWNS":
                    other["id"], other["n"] = f[1], int(f[2])
            n = other.get("n", 0)
            return n and me.owned() and n + len(me.owned()) == 6

        poll_until([me], both_own, what="two members own 6 partitions")
        proc.kill()
        proc.wait(timeout=10)
        killed_at = time.monotonic()
        poll_until([me], lambda: len(me.owned()) == 6, timeout=SESSION_MS / 1000 + 20,
                   what="partitions moved after SIGKILL")
        # Not before its session ended (the connection closing does not end it).
        assert time.monotonic() - killed_at >= SESSION_MS / 1000 * 0.9
        fenced = re.findall(r"consumer group member fenced.*group=(\S+) member=(\S+)",
                            b.read_log())
        assert fenced == [(group, other["id"])], fenced
        assert not owners.violations
        me.close()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_static_member_comes_back_to_its_partitions_and_nothing_moves(make_broker):
    b = make_broker(extra=FLAGS)
    topic, group = f"static-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 6)
    a = Member(b.addr, group, [topic], None, "a", **{"group.instance.id": "i-a"})
    s = Member(b.addr, group, [topic], None, "s", **{"group.instance.id": "i-s"})
    poll_until([a, s], lambda: split([a, s], 6), what="two static members split 6")
    mine, theirs = s.owned(), a.owned()
    epoch_before = group_epoch(describe(b.addr, group)[0])
    revocations = a.revocations
    s.close()  # a static member leaves with epoch -2: its partitions wait for it
    header, rows = describe(b.addr, group)
    assert [r["epoch"] for r in rows.values() if r["instance"] == "i-s"] == [-2], rows
    back = Member(b.addr, group, [topic], None, "s2", **{"group.instance.id": "i-s"})
    poll_until([a, back], lambda: back.owned() == mine, what="the static member's partitions back")
    # Hold a few heartbeats: nothing moved, no new group epoch.
    end = time.monotonic() + 1.5
    poll_until([a, back], lambda: time.monotonic() > end, what="a quiet second")
    assert a.owned() == theirs and back.owned() == mine
    assert a.revocations == revocations, "the other member gave nothing up"
    assert group_epoch(describe(b.addr, group)[0]) == epoch_before
    a.close()
    back.close()


def test_a_regex_subscription_picks_up_a_topic_created_later(make_broker):
    b = make_broker(extra=FLAGS)
    prefix = f"rx{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, f"{prefix}-a", 2)
    create_topic(b.addr, f"other-{prefix}", 2)
    m = Member(b.addr, group, [f"^{prefix}-.*"], None, "m")
    poll_until([m], lambda: len(m.owned()) == 2, what="the matching topic's 2 partitions")
    create_topic(b.addr, f"{prefix}-b", 3)
    produce(b.addr, f"{prefix}-b", 30)
    poll_until([m], lambda: len(m.owned()) == 5 and len(m.records) >= 30,
               what="the new topic assigned and consumed")
    assert all(t.startswith(f"{prefix}-") for (t, _) in m.owned())
    m.close()


def test_coordinator_sigkill_keeps_the_group_its_epochs_and_its_members(tmp_path):
    c = Cluster(tmp_path / "cluster", n=3, extra=FLAGS).start()
    try:
        topic, group = f"fo-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
        create_topic(c.bootstrap, topic, 6, rf=3)
        produce(c.bootstrap, topic, 600)
        owners = Owners()
        conf = {"reconnect.backoff.max.ms": 500, "socket.connection.setup.timeout.ms": 3000}
        members = [Member(c.bootstrap, group, [topic], owners, f"m{i}", **conf) for i in range(2)]
        poll_until(members, lambda: split(members, 6), timeout=60, what="two members split 6")
        admin = AdminClient({"bootstrap.servers": c.bootstrap})

        def coordinator():
            d = admin.describe_consumer_groups([group], request_timeout=5)[group]
            return d.result(timeout=6).coordinator.id

        coord = wait_until(coordinator, timeout=30, what="the group's coordinator")
        others = [i for i in c.ids if i != coord]
        header, rows = describe(c.addr(others[0]), group)
        c.kill(coord)
        # The members keep their partitions and go on consuming through the failover.
        produce(",".join(c.addr(i) for i in others), topic, 600, start=600)
        poll_until(members, lambda: len({r for m in members for r in m.records}) >= 1200,
                   timeout=90, what="every record through the failover")
        new = wait_until(lambda: coordinator() not in (coord, -1) and coordinator(), timeout=60,
                         what="a new coordinator")
        header2, rows2 = describe(c.addr(new), group)
        assert group_epoch(header2) == group_epoch(header), (header, header2)
        assert {k: v["epoch"] for k, v in rows2.items()} == \
            {k: v["epoch"] for k, v in rows.items()}, (rows, rows2)
        assert split(members, 6)
        assert not owners.violations, owners.violations[:5]
        for m in members:
            m.close()
    finally:
        c.stop()
