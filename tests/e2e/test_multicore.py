"""Tier: multi-core. With --cores 2, partitions live on both shards and connections
land on either; produce/consume results are the same as on one core."""
import re
import threading

from confluent_kafka import Consumer, TopicPartition

from conftest import wait_until
from test_confluent import check_round_trip, consume_assigned, create_topic, produce_keyed
from kafka_wire import Conn, api_versions_v0


def test_two_shards_serve_like_one(make_broker):
    b = make_broker(cores=2, env={"RUST_LOG": "info,sluice::server=debug,sluice::broker=debug"})
    create_topic(b.addr, "mc", 8)
    # Several producers at once: their connections spread over both shards.
    results = [None] * 4
    def run(i):
        results[i] = produce_keyed(b.addr, "mc", 3000, keys=20 + i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reports = [r for rs in results for r in rs]
    assert {r[2] for r in reports} == set(range(8))
    # Many short connections, so both shards surely accept some (SO_REUSEPORT hashes).
    for _ in range(24):
        c = Conn(b.addr)
        assert api_versions_v0(c)[0] == 0
        c.close()
    shards = wait_until(lambda: len(set(re.findall(r"connection accepted shard=(\d)", b.read_log()))) == 2,
                        what="connections on both shards")
    assert shards
    got = consume_assigned(b.addr, "mc", 8, len(reports))
    assert len(got) == len(reports)
    assert sorted((p, o) for _, _, p, o in got) == sorted((p, o) for _, _, p, o in reports)
    # Offsets dense per partition (each partition written by exactly one shard).
    for p in range(8):
        offs = sorted(o for _, _, pp, o in got if pp == p)
        assert offs == list(range(len(offs)))
    # Partitions sit on both shards (the shard table spreads a topic round-robin).
    owners = set(re.findall(r"opened log shard=(\d) topic=mc partition=", b.read_log()))
    assert owners == {"0", "1"}


def test_results_identical_on_one_and_two_cores(make_broker, tmp_path):
    # Same data dir restarted with a different shard count: partitions move between
    # shards, and every record is still served from where it was written.
    b1 = make_broker(cores=1, data_dir=tmp_path / "same")
    create_topic(b1.addr, "same", 6)
    reports = produce_keyed(b1.addr, "same", 3000)
    got1 = consume_assigned(b1.addr, "same", 6, len(reports))
    assert b1.stop() == 0
    b2 = make_broker(cores=2, data_dir=tmp_path / "same", port=b1.port)
    got2 = consume_assigned(b2.addr, "same", 6, len(reports))
    check_round_trip(reports, got2)
    assert sorted(got1, key=lambda r: (r[2], r[3])) == sorted(got2, key=lambda r: (r[2], r[3]))
    more = produce_keyed(b2.addr, "same", 1000, start=3000)
    got3 = consume_assigned(b2.addr, "same", 6, len(reports) + len(more))
    check_round_trip(reports + more, got3)
