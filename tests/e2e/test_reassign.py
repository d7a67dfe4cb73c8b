"""Tier: moving replicas between brokers (issue 41, "Reassignment"): Kafka's
AlterPartitionReassignments / ListPartitionReassignments through `sluice cluster
reassign`, `reassignments` and `decommission`, on real broker processes with an acks=all
producer at the client's defaults and a consumer group running throughout.

Every wait is a bounded retry with a deadline; nothing is timed.
"""
import json
import re
import signal
import subprocess
import threading
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic

from cluster import Cluster, disk_batches, metadata_from
from conftest import SLUICE_BIN, check_consumer_error
from test_cluster import Acks, check_log

DURABLE = {"min.insync.replicas": "2"}


def cli(c, *args, via=1, timeout=120):
    """`sluice cluster ARGS` against broker `via`; (exit code, stdout + stderr)."""
    r = subprocess.run([SLUICE_BIN, "cluster", *args, "--bootstrap-server", c.addr(via)],
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def create_placed(c, topic, assignment, configs=None):
    """Creates `topic` with the given replicas per partition and waits for full ISRs."""
    fut = c.admin().create_topics(
        [NewTopic(topic, len(assignment), replica_assignment=assignment, config=configs or {})],
        request_timeout=15)[topic]
    fut.result(timeout=20)
    c.wait_until(lambda: all(c.isr_of(topic, p) == sorted(r) for p, r in enumerate(assignment)),
                 30, f"{topic}: full ISRs")


def ongoing(c, via=1):
    """The reassignments in progress, as `sluice cluster reassignments` lists them."""
    code, out = cli(c, "reassignments", via=via)
    assert code == 0, out
    return [line.split(":")[0] for line in out.splitlines() if ": replicas " in line]


class Traffic:
    """An acks=all producer at the client's defaults writing round-robin over
    `partitions`, and a consumer group member reading the topic, both in threads."""

    def __init__(self, c, topic, partitions):
        self.acks = Acks()
        self.consumed = []
        self.done = threading.Event()
        self.p = Producer({"bootstrap.servers": c.bootstrap})
        self.cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                              "auto.offset.reset": "earliest"})
        self.cons.subscribe([topic])
        self.errors = []

        def produce():
            i = 0
            while not self.done.is_set():
                part = partitions[i % len(partitions)]
                try:
                    self.p.produce(topic, value=f"m-{part}-{i}".encode(), partition=part,
                                   on_delivery=self.acks)
                    i += 1
                except BufferError:
                    pass
                self.p.poll(0.002)

        def consume():
            while not self.done.is_set():
                m = self.cons.poll(0.2)
                if m is None:
                    continue
                if m.error() is not None:
                    try:
                        check_consumer_error(m.error())
                    except AssertionError as e:
                        self.errors.append(e)
                    continue
                self.consumed.append(m.value())
        self.threads = [threading.Thread(target=f, daemon=True) for f in (produce, consume)]
        for t in self.threads:
            t.start()

    def stop(self, c):
        """Stops producing, waits for every delivery report, then until the group has
        read every acknowledged record."""
        self.done.set()
        for t in self.threads:
            t.join(10)
        assert self.p.flush(60) == 0
        want = {v for vs in self.acks.acked.values() for v in vs}
        more = []

        def all_read():
            m = self.cons.poll(0.2)
            if m is not None and m.error() is None:
                more.append(m.value())
            return want <= set(self.consumed) | set(more)
        c.wait_until(all_read, 60, "the group read every acknowledged record", interval=0)
        self.cons.close()
        got = self.consumed + more
        assert not self.errors, self.errors
        return len(got) - len(set(got))


def test_partitions_move_off_a_broker_under_load_and_nothing_is_lost(tmp_path):
    """A kafka-reassign-partitions plan moves every partition of a topic off broker 1
    while an acks=all producer and a consumer group run: the new replicas catch up,
    join the ISR, leadership leaves broker 1, broker 1 deletes its copies, no delivery
    fails, every acknowledged record reads back and the group read them all
    (duplicates, which at-least-once allows, are counted)."""
    # No auto-creation: the clients' metadata refreshes would re-create the topic the
    # test deletes.
    c = Cluster(tmp_path / "c", n=3, cores=None, extra=["--auto-create-topics", "false"]).start()
    try:
        topic, parts = "moving", [0, 1, 2, 3]
        create_placed(c, topic, [[1, 2], [2, 1], [1, 3], [3, 1]], DURABLE)
        t = Traffic(c, topic, parts)
        c.wait_until(lambda: t.acks.count() > 200, 30, "deliveries before the move")
        targets = {0: [3, 2], 1: [2, 3], 2: [2, 3], 3: [3, 2]}
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": p, "replicas": r} for p, r in targets.items()]}))
        code, out = cli(c, "reassign", "--plan", str(plan), "--wait", "--timeout", "120")
        assert code == 0, out
        assert "all 4 moves completed" in out, out
        for p, r in targets.items():
            assert c.replicas_of(topic, p) == r
            c.wait_until(lambda: c.isr_of(topic, p) == sorted(r), 30, f"{topic}-{p} ISR {r}")
            assert c.leader_of(topic, p) in r
        assert ongoing(c) == []
        # Broker 1 no longer holds the topic: its directories go once it adopts the move.
        c.wait_until(lambda: not list((tmp_path / "c" / "node-1").glob(f"{topic}-*")), 30,
                     "broker 1's copies deleted")
        before = t.acks.count()
        c.wait_until(lambda: t.acks.count() > before + 200, 30, "deliveries after the move")
        dups = t.stop(c)
        assert not t.acks.failed, f"{len(t.acks.failed)} failed deliveries, e.g. {t.acks.failed[:3]}"
        print(f"moved under load: {t.acks.count()} acknowledged, the group read {dups} duplicates")
        check_log(c, topic, parts, t.acks.acked)

        # Broker 1 is down while a replica is moved off it and a topic it held is
        # deleted: when it comes back, the directories the metadata no longer gives it
        # go, and the ones it still holds stay.
        for name in ("strays", "gone", "kept"):
            create_placed(c, name, [[1, 2]])
        node1 = tmp_path / "c" / "node-1"
        c.wait_until(lambda: all((node1 / f"{n}-0").is_dir() for n in ("strays", "gone", "kept")),
                     30, "broker 1's new directories")
        c.kill(1)
        code, out = cli(c, "reassign", "--partition", "strays:0", "--replicas", "2,3", "--wait", via=2)
        assert code == 0, out
        c.admin().delete_topics(["gone"], request_timeout=15)["gone"].result(timeout=20)
        # Directories no metadata ever named (a partition beyond the topic's count, a
        # topic that never existed) are orphans too; others are not the broker's.
        import shutil
        for orphan in ("kept-7", "ghost-0"):
            shutil.copytree(node1 / "kept-0", node1 / orphan)
        (node1 / "notes").mkdir()
        c.restart(1)
        gone = ("strays-0", "gone-0", "kept-7", "ghost-0")
        c.wait_until(lambda: not any((node1 / g).exists() for g in gone), 30,
                     "broker 1's stray directories deleted")
        assert (node1 / "kept-0").is_dir() and (node1 / "notes").is_dir()
        assert re.search(r"deleted stray partition directories removed=2", c.log(1)), c.log(1)[-3000:]
        c.wait_until(lambda: c.isr_of("kept", 0) == [1, 2], 30, "kept-0 back in sync")
    finally:
        c.stop()


def test_moves_are_cancelled_or_completed_across_a_controller_kill_and_a_broker_decommissions(tmp_path):
    """Five brokers. A move onto a stopped broker stays in progress (listed with what
    it adds and removes); cancelling one puts its original replicas back; the other
    completes after the controller leader is SIGKILLed and the broker resumes. Then
    `sluice cluster decommission` empties a broker of every replica (internal topics
    too), keeping each partition's replica count. Bad requests get Kafka's errors."""
    c = Cluster(tmp_path / "c", n=5, cores=1).start()
    paused = None
    try:
        topic = "held"
        create_placed(c, topic, [[1, 2], [2, 1]], DURABLE)
        acks = Acks()
        p = Producer({"bootstrap.servers": c.bootstrap})
        for i in range(200):
            p.produce(topic, value=f"h-{i}".encode(), partition=i % 2, on_delivery=acks)
        assert p.flush(30) == 0

        # Kafka's answers to bad moves.
        code, out = cli(c, "reassign", "--partition", f"{topic}:0", "--replicas", "2,2")
        assert code != 0 and "InvalidReplicaAssignment" in out, out
        code, out = cli(c, "reassign", "--partition", "nosuch:0", "--replicas", "1")
        assert code != 0 and "UnknownTopicOrPartition" in out, out
        assert ongoing(c) == []

        create_placed(c, "cancelled", [[1, 2]], DURABLE)
        c.brokers[5].proc.send_signal(signal.SIGSTOP)
        paused = 5
        for move in (f"{topic}:0", "cancelled:0"):
            code, out = cli(c, "reassign", "--partition", move, "--replicas", "2,5")
            assert code == 0, out
        code, out = cli(c, "reassignments")
        assert code == 0 and f"{topic}-0: replicas 2,5,1 adding 5 removing 1" in out, out
        assert "cancelled-0: replicas 2,5,1 adding 5 removing 1" in out, out

        # Cancelling one topic's moves puts its original replicas back. (While broker 5
        # is paused, metadata is asked of one live broker: a client that picks the
        # paused one waits for its timeouts.)
        code, out = cli(c, "reassignments", "--topic", "cancelled", "--cancel")
        assert code == 0 and "cancelled 1 reassignments" in out, out

        def part(name, via=1):
            return metadata_from(c.addr(via), [name])["topics"][name]["partitions"][0]
        # (In the order the move listed them, target first, as Kafka's revert does.)
        c.wait_until(lambda: part("cancelled")["replicas"] == [2, 1], 30, "cancelled-0 back on [2, 1]",
                     retry=(OSError,))
        assert sorted(part("cancelled")["isr"]) == [1, 2]
        assert ongoing(c) == [f"{topic}-0"]

        # The controller leader dies mid-move (never the paused broker: the others
        # elect among themselves once it stops answering).
        victim = c.wait_until(lambda: (lambda v: v if v not in (-1, 5) else None)(metadata_from(c.addr(1))["controller"]),
                              30, "a controller other than the paused broker", retry=(OSError,))
        c.kill(victim)
        via = 3 if victim != 3 else 4
        c.wait_until(lambda: metadata_from(c.addr(via))["controller"] not in (-1, victim), 30, "a new controller",
                     retry=(OSError,))
        assert ongoing(c, via=via) == [f"{topic}-0"], "the move survives the controller's death"
        c.restart(victim)
        c.brokers[5].proc.send_signal(signal.SIGCONT)
        paused = None
        c.wait_until(lambda: c.replicas_of(topic, 0) == [2, 5] and c.isr_of(topic, 0) == [2, 5],
                     60, "partition 0's move completed on [2, 5]")
        assert ongoing(c) == []
        code, out = cli(c, "reassignments", "--cancel")
        assert code == 0 and "no reassignments in progress" in out, out
        check_log(c, topic, [0, 1], acks.acked)

        # Decommission broker 4: every replica it holds (the internal topics' too)
        # moves to the others.
        code, out = cli(c, "decommission", "--broker", "4", "--timeout", "120", timeout=180)
        assert code == 0, out
        # The command saw the moves complete on the broker it asked; the one the admin
        # client asks may apply the last metadata change a moment later.

        def emptied():
            md = c.admin().list_topics(timeout=10)
            left = [f"{name}-{q.id}: {q.replicas}" for name, t in md.topics.items()
                    for q in t.partitions.values() if 4 in q.replicas]
            return md if not left else None
        md = c.wait_until(emptied, 30, "no replica left on broker 4")
        rf = {name: {len(q.replicas) for q in t.partitions.values()} for name, t in md.topics.items()}
        assert rf[topic] == {2} and rf.get("__consumer_offsets", {3}) == {3}, rf
        check_log(c, topic, [0, 1], acks.acked)
        # Then it leaves the cluster: refused while it runs, or for a broker that
        # still holds replicas; done once it is stopped.
        code, out = cli(c, "unregister", "--broker", "4")
        assert code != 0 and "is live: stop it" in out, out
        code, out = cli(c, "unregister", "--broker", "2")
        assert code != 0 and "InvalidRequest" in out, out
        assert c.brokers[4].stop() == 0
        c.wait_until(lambda: (lambda r: r if "unregistered" in r[1] else None)(cli(c, "unregister", "--broker", "4")),
                     30, "broker 4 unregistered once fenced")
        c.wait_until(lambda: c.registered() == {1, 2, 3, 5}, 30, "broker 4 gone from the metadata")
        code, out = cli(c, "unregister", "--broker", "4")
        assert code != 0 and "BrokerIdNotRegistered" in out, out
    finally:
        if paused is not None:
            c.brokers[paused].proc.send_signal(signal.SIGCONT)
        c.stop()


def test_a_broker_back_on_a_wiped_directory_holds_nothing_until_it_has_fetched_it(tmp_path):
    """A lost disk is a new directory, never a trusted replica (KIP-858's directory
    ids): broker 3 is SIGKILLed under an acks=all stream, its data directory wiped and
    it is restarted with the same flags. It records its new directory before it
    registers, so it leaves every ISR at once: where it was the last in-sync replica
    the partition stays leaderless (never led by an empty log) until an unclean
    election is asked for; elsewhere it fetches everything, rejoins the ISR, and once
    leadership moves onto it every acknowledged record reads back."""
    import shutil
    from confluent_kafka import ElectionType, TopicPartition
    from test_elect_leaders import elect
    c = Cluster(tmp_path / "c", n=3, cores=1,
                extra=["--auto-leader-rebalance-enable", "false"]).start()
    try:
        topic, parts = "disk", [0, 1, 2]
        create_placed(c, topic, [[3, 1, 2], [1, 2, 3], [2, 3, 1]], DURABLE)
        # "last"-0 lives on broker 3 alone: its only in-sync copy goes with the disk.
        create_placed(c, "last", [[3]])
        acks = Acks()
        p = Producer({"bootstrap.servers": c.bootstrap})
        for i in range(300):
            p.produce(topic, value=f"d-{i}".encode(), partition=i % 3, on_delivery=acks)
        p.produce("last", value=b"only-on-3", partition=0)
        assert p.flush(30) == 0 and not acks.failed

        c.kill(3)
        shutil.rmtree(c.data_dir(3))
        c.restart(3)
        log3 = c.log(3)
        assert "formatted_now=true" in log3, log3[-2000:]
        c.wait_until(lambda: "runs on another data directory" in c.log(3), 30,
                     "broker 3 recorded its new directory")
        # Where it was the last in-sync replica, nobody leads: not an empty log.
        assert (c.leader_of("last", 0), c.isr_of("last", 0)) == (-1, [])
        # Elsewhere it fetches what the leaders have and rejoins the ISRs.
        for q in parts:
            c.wait_until(lambda: c.isr_of(topic, q) == [1, 2, 3], 60, f"{topic}-{q}: 3 back in the ISR")
        assert c.leader_of("last", 0) == -1
        # Only an unclean election, asked for, brings "last" back (empty).
        res = elect(c, ElectionType.UNCLEAN, [TopicPartition("last", 0)])
        assert res[("last", 0)] is None, res
        c.wait_until(lambda: c.leader_of("last", 0) == 3, 30, "last-0 led again after the unclean election")
        res = elect(c, ElectionType.PREFERRED, [TopicPartition(topic, 0)])
        assert res[(topic, 0)] in (None, 84), res  # 84: ELECTION_NOT_NEEDED
        c.wait_until(lambda: c.leader_of(topic, 0) == 3, 30, "broker 3 leads disk-0 again")
        check_log(c, topic, parts, {q: v for q, v in acks.acked.items()})
    finally:
        c.stop()


def test_a_throttled_move_copies_within_the_rate_and_finishes_once_it_is_lifted(tmp_path):
    """Kafka's replication throttles: with `follower.replication.throttled.rate` set on
    the broker a move adds a replica to, and the topic listing that replica in
    `follower.replication.throttled.replicas`, the new replica copies the partition
    within the rate (the move of 8 MB at 200 kB/s cannot be done within seconds, while
    unthrottled it takes well under one), and completes once the throttle is lifted.
    The broker config is described as a dynamic one, and a negative rate is refused."""
    import time
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    c = Cluster(tmp_path / "c", n=3, cores=1).start()
    try:
        create_placed(c, "slow", [[1]])
        p = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 20})
        for i in range(8000):
            while True:
                try:
                    p.produce("slow", value=b"%06d" % i + b"x" * 1018, partition=0)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(60) == 0
        admin = c.admin()
        rate = "follower.replication.throttled.rate"

        def alter(resource, name, key, op, value=None):
            r = ConfigResource(resource, name, incremental_configs=[
                ConfigEntry(key, value, incremental_operation=op)])
            admin.incremental_alter_configs([r])[r].result(timeout=30)
        with pytest.raises(KafkaException) as e:
            alter(ResourceType.BROKER, "2", rate, AlterConfigOpType.SET, "-5")
        assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
        alter(ResourceType.BROKER, "2", rate, AlterConfigOpType.SET, "200000")
        alter(ResourceType.TOPIC, "slow", "follower.replication.throttled.replicas", AlterConfigOpType.SET, "0:2")
        described = admin.describe_configs([ConfigResource(ResourceType.BROKER, "2")])
        cfg = list(described.values())[0].result(timeout=30)
        assert cfg[rate].value == "200000" and not cfg[rate].is_read_only

        started = time.monotonic()
        code, out = cli(c, "reassign", "--partition", "slow:0", "--replicas", "1,2")
        assert code == 0, out
        def copied():
            # Records broker 2's new replica holds on disk.
            b = disk_batches(c.data_dir(2), "slow", 0)
            return b[-1][1] + 1 if b else 0
        c.wait_until(lambda: copied() > 0, 30, "the new replica copying", retry=(OSError,))
        # Throttled: 8,000 records of 1 kB at 200 kB/s take ~40 s. Two seconds in, it
        # is still moving, with at most a few seconds' worth copied.
        c.wait_until(lambda: time.monotonic() - started >= 2, 10, "two seconds")
        assert ongoing(c) == ["slow-0"], "the throttled move finished too soon"
        assert copied() < 4000, copied()
        # Lifted: it finishes.
        alter(ResourceType.BROKER, "2", rate, AlterConfigOpType.DELETE)
        c.wait_until(lambda: ongoing(c) == [] and c.isr_of("slow", 0) == [1, 2], 60,
                     "the move completed once the throttle was lifted")
    finally:
        c.stop()


def test_rebalance_spreads_replicas_and_leaders_over_every_broker_throttled(tmp_path):
    """`sluice cluster rebalance` prints a plan evening replicas and preferred leaders
    over the brokers (with the bytes it copies) and changes nothing; with --execute
    and --throttle it sets the reassignment throttle, moves, waits, and removes the
    throttle: a topic placed on brokers 1 and 2 only ends with a third of its replicas
    and preferred leaders on each broker, every acknowledged record still there."""
    from confluent_kafka.admin import ConfigResource, ResourceType
    c = Cluster(tmp_path / "c", n=3, cores=1).start()
    try:
        topic = "skewed"
        create_placed(c, topic, [[1, 2] if p % 2 == 0 else [2, 1] for p in range(6)], DURABLE)
        acks = Acks()
        p = Producer({"bootstrap.servers": c.bootstrap})
        for i in range(600):
            p.produce(topic, value=f"s-{i}".encode(), partition=i % 6, on_delivery=acks)
        assert p.flush(30) == 0 and not acks.failed

        def spread():
            md = c.admin().list_topics(topic=topic, timeout=10).topics[topic]
            replicas, leaders = {1: 0, 2: 0, 3: 0}, {1: 0, 2: 0, 3: 0}
            for q in md.partitions.values():
                for r in q.replicas:
                    replicas[r] += 1
                leaders[q.replicas[0]] += 1
            return replicas, leaders
        code, out = cli(c, "rebalance")
        assert code == 0 and "bytes to copy" in out and "--execute applies it" in out, out
        assert spread()[0] == {1: 6, 2: 6, 3: 0}, "a plan alone changes nothing"
        code, out = cli(c, "rebalance", "--execute", "--throttle", "100000000", "--timeout", "120")
        assert code == 0 and "rebalanced" in out, out
        assert spread() == ({1: 4, 2: 4, 3: 4}, {1: 2, 2: 2, 3: 2}), spread()
        assert ongoing(c) == []
        # The throttle is gone again.
        res = ConfigResource(ResourceType.BROKER, "3")
        cfg = list(c.admin().describe_configs([res]).values())[0].result(timeout=30)
        assert cfg["follower.replication.throttled.rate"].value == "9223372036854775807"
        res = ConfigResource(ResourceType.TOPIC, topic)
        cfg = list(c.admin().describe_configs([res]).values())[0].result(timeout=30)
        assert cfg["follower.replication.throttled.replicas"].value in ("", None)
        for q in range(6):
            c.wait_until(lambda: len(c.isr_of(topic, q)) == 2, 30, f"{topic}-{q} in sync")
        check_log(c, topic, list(range(6)), acks.acked)
        code, out = cli(c, "rebalance")
        assert code == 0 and "0 partitions to change" in out, out
    finally:
        c.stop()


def test_describe_quorum_shows_each_voters_lag_from_any_broker(tmp_path):
    """DescribeQuorum (`sluice cluster quorum`): asked of any broker (one whose voter
    does not lead points to the leader), it shows the leader, epoch, high watermark and
    every voter's log end and lag; a killed voter falls behind while metadata changes,
    and is back at lag 0 once restarted."""
    import re as _re
    c = Cluster(tmp_path / "c", n=3, cores=1).start()
    try:
        def quorum(via):
            code, out = cli(c, "quorum", via=via)
            assert code == 0, out
            head = _re.search(r"Metadata quorum: leader (\d+), epoch (\d+), high watermark (\d+)", out)
            assert head, out
            lags = {int(v): int(l) for v, l in _re.findall(r"voter (\d+): log end \d+ \(lag (\d+)\)", out)}
            return int(head.group(1)), int(head.group(3)), lags
        leader = c.wait_until(lambda: (lambda q: q[0] if set(q[2]) == {1, 2, 3} and not any(q[2].values()) else None)(quorum(1)),
                              30, "every voter at lag 0")
        other = next(i for i in (1, 2, 3) if i != leader)
        assert quorum(other)[0] == leader, "a non-leader's broker points to the leader"
        victim = next(i for i in (1, 2, 3) if i not in (leader, other))
        c.kill(victim)
        for n in range(3):
            create_placed(c, f"q{n}", [[leader, other]])
        _, hw, lags = quorum(other)
        assert lags[victim] > 0 and lags[leader] == 0, lags
        c.restart(victim)
        c.wait_until(lambda: quorum(other)[2][victim] == 0, 30, "the restarted voter caught up")
    finally:
        c.stop()
