"""ElectLeaders (KIP-460) on a 3-broker cluster, driven by confluent-kafka's
AdminClient.elect_leaders: preferred elections on request (with the controller's own
preferred-leader balancing turned off, so only the request moves leadership) and an
unclean election that brings a partition whose only ISR member died back under a live
replica from outside the ISR. Per-partition answers are Kafka's: ELECTION_NOT_NEEDED,
PREFERRED_LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION, success."""
from confluent_kafka import ElectionType, KafkaError, Producer, TopicPartition

from cluster import Cluster


def elect(c, kind, partitions):
    """{(topic, partition): error code or None} of one ElectLeaders call. (No timeout
    arguments: confluent-kafka 2.16's elect_leaders fails on any keyword argument.)"""
    res = c.admin().elect_leaders(kind, partitions).result(timeout=70)
    def code(e):  # a KafkaError (or, per its docs, a KafkaException carrying one)
        return e.code() if isinstance(e, KafkaError) else e.args[0].code()
    return {(tp.topic, tp.partition): (None if e is None else code(e)) for tp, e in res.items()}


def produce(c, topic, values, acks="all"):
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": acks, "linger.ms": 0,
                  "message.timeout.ms": 30000, "topic.metadata.refresh.interval.ms": 1000})
    failed = []
    for v in values:
        p.produce(topic, value=v, partition=0,
                  on_delivery=lambda err, msg: err is not None and failed.append(err))
    assert p.flush(40) == 0, "records without a delivery report"
    assert not failed, failed[:3]


def test_preferred_election_on_request(tmp_path):
    c = Cluster(tmp_path / "cluster", n=3,
                extra=["--auto-leader-rebalance-enable", "false"]).start()
    try:
        topic = "pref"
        c.create_topic(topic, partitions=2, rf=3)
        tp = TopicPartition(topic, 0)
        preferred = c.replicas_of(topic, 0)[0]
        assert c.leader_of(topic, 0) == preferred
        assert elect(c, ElectionType.PREFERRED, [tp]) == {(topic, 0): KafkaError.ELECTION_NOT_NEEDED}
        assert elect(c, ElectionType.UNCLEAN, [tp]) == {(topic, 0): KafkaError.ELECTION_NOT_NEEDED}
        assert elect(c, ElectionType.PREFERRED, [TopicPartition("nope", 0)]) == {
            ("nope", 0): KafkaError.UNKNOWN_TOPIC_OR_PART}

        c.kill(preferred)
        c.wait_until(lambda: c.leader_of(topic, 0) not in (-1, preferred), 30,
                     "leadership moved off the killed preferred replica")
        assert elect(c, ElectionType.PREFERRED, [tp]) == {
            (topic, 0): KafkaError.PREFERRED_LEADER_NOT_AVAILABLE}

        c.restart(preferred)
        c.wait_until(lambda: c.isr_of(topic, 0) == [1, 2, 3], 40,
                     "the preferred replica back in the ISR")
        # Balancing is off: the preferred replica leads again only when asked.
        assert c.leader_of(topic, 0) != preferred
        assert elect(c, ElectionType.PREFERRED, [tp]) == {(topic, 0): None}
        c.wait_until(lambda: c.leader_of(topic, 0) == preferred, 20,
                     "the preferred replica leads after the election")
        # Every partition (no list): those that needed nothing are left out.
        every = elect(c, ElectionType.PREFERRED, None)
        assert (topic, 0) not in every and all(e is None for e in every.values()), every
        produce(c, topic, [b"after-election"])
    finally:
        c.stop()


def test_unclean_election_on_request_brings_back_a_partition_without_isr(tmp_path):
    c = Cluster(tmp_path / "cluster", n=3).start()
    try:
        topic = "unclean"
        c.create_topic(topic, partitions=1, rf=2)
        tp = TopicPartition(topic, 0)
        a, b = c.replicas_of(topic, 0)
        assert c.leader_of(topic, 0) == a
        both = [f"both-{i}".encode() for i in range(10)]
        produce(c, topic, both)

        # b dies and leaves the ISR; a alone takes more records (acks=1: one replica
        # is below min.insync.replicas).
        c.kill(b)
        c.wait_until(lambda: c.isr_of(topic, 0) == [a], 30, f"ISR without broker {b}")
        only_a = [f"only-a-{i}".encode() for i in range(10)]
        produce(c, topic, only_a, acks="1")
        # Then a dies too. b comes back (the metadata quorum with it) out of the ISR:
        # unclean election is off, so the partition stays leaderless.
        c.kill(a)
        c.restart(b)
        c.wait_until(lambda: c.leader_of(topic, 0) == -1, 30, "partition without leader")
        assert elect(c, ElectionType.PREFERRED, [tp]) == {
            (topic, 0): KafkaError.PREFERRED_LEADER_NOT_AVAILABLE}

        # Asked for, the unclean election makes b leader, losing what only a held.
        assert elect(c, ElectionType.UNCLEAN, [tp]) == {(topic, 0): None}
        c.wait_until(lambda: c.leader_of(topic, 0) == b and c.isr_of(topic, 0) == [b], 20,
                     f"broker {b} leads alone")
        assert elect(c, ElectionType.UNCLEAN, [tp]) == {(topic, 0): KafkaError.ELECTION_NOT_NEEDED}
        values = [v for (_, _, v) in c.read_all(topic, 0)]
        assert values == both, values
        produce(c, topic, [b"after"], acks="1")

        # a returns, drops the tail b never had, and follows b.
        c.restart(a)
        c.wait_until(lambda: c.isr_of(topic, 0) == sorted([a, b]), 40, "a back in the ISR")
        values = [v for (_, _, v) in c.read_all(topic, 0)]
        assert values == both + [b"after"], values
    finally:
        c.stop()
