"""Tier: a cluster that grows, shrinks and replaces machines (issue 41, "Roles and
joining"): nodes started outside `--controller-quorum` join the metadata quorum as
learners (DescribeQuorum's observers) and serve as brokers; AddRaftVoter and
RemoveRaftVoter (`sluice cluster add-voter`, `remove-voter`) change the voters while the
cluster runs, without restarting anyone. Real broker processes, SIGKILL, and an acks=all
producer at the client's defaults.

Every wait is a bounded retry with a deadline; nothing is timed.
"""
import re

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import NewTopic

from cluster import Cluster, metadata_from
from test_cluster import Acks, check_log
from test_reassign import DURABLE, cli, create_placed


def quorum(c, via):
    """(leader, voters, observers) as `sluice cluster quorum` asked of node `via` shows
    them; None while it cannot answer (no leader)."""
    code, out = cli(c, "quorum", via=via, timeout=60)
    if code != 0:
        return None
    head = re.search(r"Metadata quorum: leader (\d+)", out)
    voters = {int(v) for v in re.findall(r"voter (\d+):", out)}
    observers = {int(v) for v in re.findall(r"observer (\d+):", out)}
    return int(head.group(1)), voters, observers


def wait_quorum(c, via, voters, observers=None, deadline=40):
    def match():
        q = quorum(c, via)
        if q and q[1] == set(voters) and (observers is None or q[2] == set(observers)):
            return q
        return None
    return c.wait_until(match, deadline, f"voters {sorted(voters)}, observers {observers}")


def produce(c, topic, n, tag):
    acks = Acks()
    p = Producer({"bootstrap.servers": c.bootstrap})
    for i in range(n):
        p.produce(topic, f"{tag}-{i}".encode(), partition=i % 2, on_delivery=acks)
    assert p.flush(60) == 0
    assert not acks.failed, acks.failed[:5]
    assert acks.count() == n
    return acks


def create_via(c, via, topic):
    """Creates `topic` (RF=2 over the live brokers) through broker `via`: only commits
    if the metadata quorum has a working majority. First waits until `via`'s metadata
    names a live controller: librdkafka's admin client sends CreateTopics to the
    controller its first metadata named and, that one dead, times out without asking
    again."""
    from confluent_kafka.admin import AdminClient
    def live_controller():
        ctl = metadata_from(c.addr(via), topics=[])["controller"]
        return ctl in c.brokers and c.alive(ctl)

    def created():
        c.wait_until(live_controller, 30, f"broker {via} naming a live controller")
        admin = AdminClient({"bootstrap.servers": c.addr(via)})
        try:
            admin.create_topics([NewTopic(topic, 1, replication_factor=2)],
                                request_timeout=20)[topic].result(timeout=30)
        except KafkaException as e:
            # Timed out at a controller that went away meanwhile (a fresh client asks
            # the metadata again); an earlier attempt may have created it after all.
            if e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return True
            if e.args[0].code() != KafkaError._TIMED_OUT:
                raise
            return False
        return True
    c.wait_until(created, 90, f"{topic} created through broker {via}")
    c.wait_until(lambda: topic in metadata_from(c.addr(via), topics=[topic])["topics"], 20,
                 f"{topic} in the metadata")


def test_a_broker_only_node_joins_takes_partitions_restarts_and_leaves(tmp_path):
    """Node 4, started with only the voters' addresses, joins as a learner and a
    broker; it cannot be made a voter (no controller role); partitions move onto it and
    it serves them across a SIGKILL; decommissioned, stopped and unregistered, it
    leaves the broker list, the quorum drops the silent learner, and the voters stop
    dialling it."""
    c = Cluster(tmp_path / "c", n=3, cores=1).start()
    try:
        topic = "grow"
        create_placed(c, topic, [[1, 2, 3], [2, 3, 1]], DURABLE)
        acks = produce(c, topic, 200, "before")
        c.add_node(4)
        wait_quorum(c, 1, {1, 2, 3}, {4})
        code, out = cli(c, "add-voter", "--node", "4", "--timeout", "5")
        assert code != 0 and "controller role" in out, out
        code, out = cli(c, "reassign", "--partition", f"{topic}:0", "--replicas", "4,2,3", "--wait",
                        timeout=180)
        assert code == 0, out
        c.wait_until(lambda: c.isr_of(topic, 0) == [2, 3, 4], 30, "node 4 in the ISR")
        c.kill(4)
        c.restart(4)
        c.wait_until(lambda: c.isr_of(topic, 0) == [2, 3, 4], 40, "node 4 back in the ISR")
        more = produce(c, topic, 200, "after")
        for p, vs in more.acked.items():
            acks.acked.setdefault(p, []).extend(vs)
        check_log(c, topic, [0, 1], acks.acked)
        code, out = cli(c, "decommission", "--broker", "4", "--timeout", "120", timeout=180)
        assert code == 0, out
        assert c.brokers[4].stop() == 0
        c.wait_until(lambda: (lambda r: r if "unregistered" in r[1] else None)(cli(c, "unregister", "--broker", "4")),
                     30, "node 4 unregistered once fenced")
        c.wait_until(lambda: 4 not in c.registered(), 20, "node 4 out of the broker list")
        # Three session timeouts (3 s each here) after its last word.
        wait_quorum(c, 1, {1, 2, 3}, set(), deadline=40)
        # ...and, three more later, nobody dials it any more.
        c.wait_until(lambda: all("forgot a node that left the metadata quorum node=4" in c.log(i)
                                 for i in (1, 2, 3)), 40, "node 4 forgotten")
        check_log(c, topic, [0, 1], acks.acked)
    finally:
        c.stop()


def test_three_voters_become_five_and_dead_voters_are_replaced_without_a_restart(tmp_path):
    """Nodes 4 and 5 join with the controller role and are made voters (3 -> 5);
    voters 1 and 2 are SIGKILLed and the five-voter quorum goes on with three; they are
    removed (their machines are gone), and with voter 3 killed too the quorum {3, 4, 5}
    still has its majority. Node 1, back with its old disk, finds itself out of the
    voters and carries on as a learner and a broker; a new node that names only the
    first voters joins through it while a later voter leads."""
    c = Cluster(tmp_path / "c", n=3, cores=1).start()
    try:
        c.add_node(4, roles="broker,controller")
        c.add_node(5, roles="broker,controller")
        wait_quorum(c, 1, {1, 2, 3}, {4, 5})
        code, out = cli(c, "add-voter", "--node", "1")
        assert code != 0 and "DuplicateVoter" in out, out
        for n in (4, 5):
            code, out = cli(c, "add-voter", "--node", str(n), timeout=90)
            assert code == 0, out
        wait_quorum(c, 4, {1, 2, 3, 4, 5}, set())
        create_placed(c, "five", [[3, 4], [4, 5]], {"min.insync.replicas": "1"})
        acks = produce(c, "five", 100, "five")
        c.kill(1)
        c.kill(2)
        create_via(c, 3, "after-two-died")
        for n in (1, 2):
            code, out = cli(c, "remove-voter", "--node", str(n), via=3, timeout=90)
            assert code == 0, out
        wait_quorum(c, 3, {3, 4, 5})
        code, out = cli(c, "remove-voter", "--node", "2", via=3)
        assert code != 0 and "VoterNotFound" in out, out
        c.kill(3)
        create_via(c, 4, "after-three-died")
        c.restart(1)
        leader, _, _ = wait_quorum(c, 4, {3, 4, 5}, {1})
        # A new node names only the first voters, of which 1 alone runs (an observer
        # now) and the leader is one that joined later: it is found through 1's relays.
        assert leader in (4, 5)
        c.add_node(6)
        wait_quorum(c, 4, {3, 4, 5}, {1, 6})
        c.restart(3)
        create_via(c, 1, "with-the-old-voter-back")
        check_log(c, "five", [0, 1], acks.acked)
    finally:
        c.stop()


def test_a_lone_voter_that_lost_its_disk_never_elects_itself_beside_the_cluster_it_grew(tmp_path):
    """A cluster born with one voter grows to three (nodes 2 and 3 join and are made
    voters). Node 1's disk is wiped: restarted with the same flags, its own view is
    still a quorum of one with an empty log, which must not elect itself (a second,
    empty cluster): it hears the nodes that hold the log, waits, and rejoins the real
    quorum; every topic is still there."""
    import shutil
    c = Cluster(tmp_path / "c", n=1, cores=1).start()
    try:
        c.add_node(2, roles="broker,controller")
        c.add_node(3, roles="broker,controller")
        for n in (2, 3):
            code, out = cli(c, "add-voter", "--node", str(n), timeout=90)
            assert code == 0, out
        wait_quorum(c, 2, {1, 2, 3}, set())
        create_placed(c, "kept", [[2, 3]], {"min.insync.replicas": "1"})
        c.kill(1)
        shutil.rmtree(c.data_dir(1))
        c.brokers[1].spawn()
        c.wait_until(lambda: "It will not elect itself" in c.log(1), 30,
                     "node 1 refusing to elect itself alone")
        # The real quorum {1, 2, 3} still leads and commits without it...
        create_via(c, 2, "while-one-was-wiped")
        # ...and node 1, sent the log by its leader, is a voter of it again.
        c.wait_until(lambda: "takes part in elections again" in c.log(1), 30, "node 1 rejoined")
        c.wait_until(lambda: 1 in c.registered(), 30, "node 1 registered again")
        wait_quorum(c, 2, {1, 2, 3}, set())
        # It never led alone: between its restart and its rejoining, no leadership of
        # its own.
        second = c.log(1).split("starting node=1")[-1]
        before_rejoin = second.split("takes part in elections again")[0]
        assert "leader changed node=1 leader=1" not in before_rejoin, before_rejoin[-3000:]
        m = metadata_from(c.addr(1), topics=["kept", "while-one-was-wiped"])
        assert set(m["topics"]) >= {"kept", "while-one-was-wiped"}, m
    finally:
        c.stop()


def test_two_broker_only_nodes_join_under_load_and_take_their_share(tmp_path):
    """Issue 41's growth test: 3 brokers, RF=3, 12 partitions, an acks=all producer at
    the client's defaults and a consumer group running throughout; nodes 4 and 5 start
    knowing only the voters, `sluice cluster add-broker` spreads replicas and preferred
    leaders onto them: each of the five ends with 7 or 8 of the 36 replicas and 2 or 3
    preferred leaders, every ISR full, every acknowledged record read by the group
    (duplicates, which at-least-once allows, counted)."""
    from test_reassign import Traffic, ongoing
    c = Cluster(tmp_path / "c", n=3, cores=1).start()
    t = None
    try:
        topic = "grow"
        create_placed(c, topic, [[1 + (p + k) % 3 for k in range(3)] for p in range(12)], DURABLE)
        t = Traffic(c, topic, list(range(12)))
        c.wait_until(lambda: t.acks.count() > 500, 60, "records acknowledged before the growth")
        c.add_node(4)
        c.add_node(5)
        code, out = cli(c, "add-broker", "--broker", "5", "--dry-run")
        assert code == 0 and "partitions to change" in out and "rebalanced" not in out, out
        code, out = cli(c, "add-broker", "--broker", "5", "--throttle", "200000000",
                        "--timeout", "240", timeout=300)
        assert code == 0 and "rebalanced" in out, out
        assert ongoing(c) == []
        md = c.admin().list_topics(topic=topic, timeout=10).topics[topic]
        replicas = {b: 0 for b in range(1, 6)}
        leaders = {b: 0 for b in range(1, 6)}
        for q in md.partitions.values():
            for r in q.replicas:
                replicas[r] += 1
            leaders[q.replicas[0]] += 1
        print(f"replicas per broker {replicas}, preferred leaders {leaders}")
        assert all(v in (7, 8) for v in replicas.values()), replicas
        assert all(v in (2, 3) for v in leaders.values()), leaders
        for q in range(12):
            c.wait_until(lambda: len(c.isr_of(topic, q)) == 3, 60, f"{topic}-{q} in sync")
        c.wait_until(lambda: t.acks.count() > 1000, 60, "records acknowledged after the growth")
        acked = t.acks
        dups = t.stop(c)
        t = None
        assert not acked.failed, acked.failed[:5]
        # Every acknowledged record is in the log. (Not their order: without
        # idempotence, librdkafka's default, a batch retried after a leadership move may
        # land after one acknowledged later, which Kafka allows.)
        for q in range(12):
            stored = {v for (_, _, v) in c.read_all(topic, q)}
            missing = [v for v in acked.acked.get(q, []) if v not in stored]
            assert not missing, f"{topic}-{q}: {len(missing)} acknowledged records missing, e.g. {missing[:5]}"
        print(f"the acknowledged records per partition: {[len(acked.acked.get(q, [])) for q in range(12)]}")
        print(f"grown under load: {acked.count()} records acknowledged, {dups} duplicates read by the group")
    finally:
        if t is not None:
            t.done.set()
        c.stop()


def test_controllers_without_the_broker_role_run_the_quorum_for_broker_only_nodes(tmp_path):
    """KRaft's split roles: three controller-only voters (no Kafka listener, no
    partitions) and two broker-only nodes that join. Clients see only the brokers, and
    a broker as the controller (it proposes their admin requests); DescribeQuorum,
    AddRaftVoter and RemoveRaftVoter asked of a broker are forwarded to the leader. The
    controller leader is SIGKILLed: another leads, topics are still created; a fourth
    controller replaces it as a voter."""
    from confluent_kafka import Consumer
    c = Cluster(tmp_path / "c", n=3, cores=1, roles="controller")
    try:
        for i in c.ids:
            c._spawn(i)
        for i in list(c.ids):
            c.wait_until(lambda: "a controller only" in c.log(i), 30, f"controller {i} running")
        c.add_node(4)
        c.add_node(5)
        bootstrap = f"{c.addr(4)},{c.addr(5)}"
        m = metadata_from(c.addr(4), topics=[])
        assert set(m["brokers"]) == {4, 5} and m["controller"] in (4, 5), m
        leader, voters, observers = wait_quorum(c, 4, {1, 2, 3}, {4, 5})
        assert leader in (1, 2, 3)
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("split", 2, replication_factor=2)],
                            request_timeout=20)["split"].result(timeout=30)
        acks = Acks()
        p = Producer({"bootstrap.servers": bootstrap})
        for i in range(200):
            p.produce("split", f"v-{i}".encode(), partition=i % 2, on_delivery=acks)
        assert p.flush(60) == 0 and not acks.failed and acks.count() == 200
        cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "split-g",
                         "auto.offset.reset": "earliest"})
        cons.subscribe(["split"])
        got = set()
        c.wait_until(lambda: (lambda m: got.add(m.value()) if m is not None and m.error() is None else None)(cons.poll(0.5)) or len(got) == 200,
                     60, "the group read every record")
        cons.close()
        # The controller leader dies: another controller leads; brokers go on.
        c.kill(leader)
        new, _, _ = wait_quorum(c, 5, {1, 2, 3}, {4, 5})
        assert new != leader
        admin.create_topics([NewTopic("after", 1, replication_factor=2)],
                            request_timeout=20)["after"].result(timeout=30)
        # A fourth controller takes the dead one's place, through a broker.
        c.add_node(6, roles="controller")
        wait_quorum(c, 4, {1, 2, 3}, {4, 5, 6})
        code, out = cli(c, "add-voter", "--node", "6", via=4, timeout=90)
        assert code == 0, out
        code, out = cli(c, "remove-voter", "--node", str(leader), via=5, timeout=90)
        assert code == 0, out
        wait_quorum(c, 4, {1, 2, 3, 6} - {leader}, {4, 5})
        check_log(c, "split", [0, 1], acks.acked)
    finally:
        c.stop()
