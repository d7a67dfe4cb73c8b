"""A broker opens its Kafka port only once it can answer completely (issue 12, item 1):
registered and unfenced, a controller known. Before, the shards other than the first
answered Metadata from their first image (no brokers, controller -1) for a few hundred
milliseconds; librdkafka takes that for a partial answer and backs off for about 15 s,
so the first CreateTopics on a fresh cluster timed out.
"""
import time

from confluent_kafka.admin import AdminClient, NewTopic

from cluster import Cluster, metadata_from, wait_until

# Connections spread over a broker's shards (SO_REUSEPORT): ask often enough that
# every shard answers some of them.
ASKS_PER_BROKER = 24


def test_fresh_brokers_answer_completely_from_the_first_connection(tmp_path):
    c = Cluster(tmp_path / "cluster", n=3, cores=2)
    try:
        for i in c.ids:
            c._spawn(i)
        for i in c.ids:
            first = wait_until(lambda: metadata_from(c.addr(i), timeout=2), 60,
                               f"broker {i} answering", retry=(OSError, ConnectionError))
            answers = [first] + [metadata_from(c.addr(i), timeout=5) for _ in range(ASKS_PER_BROKER)]
            for m in answers:
                assert i in m["brokers"], f"broker {i} left itself out: {m}"
                assert m["controller"] in c.ids, f"broker {i} named no controller: {m}"
        # librdkafka's first admin request on the fresh cluster completes within its own
        # request timeout (it took ~60 s when the first answer was partial).
        a = AdminClient({"bootstrap.servers": c.bootstrap})
        start = time.monotonic()
        a.create_topics([NewTopic("first", 3, 3)], request_timeout=15)["first"].result(timeout=20)
        assert time.monotonic() - start < 20
    finally:
        c.stop()
