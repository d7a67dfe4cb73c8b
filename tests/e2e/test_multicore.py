"""Tier: multi-core. With --cores 2, partitions live on both shards and connections
land on either; produce/consume results are the same as on one core."""
import os
import re
import subprocess
import threading

import pytest

from confluent_kafka import Consumer, TopicPartition

from conftest import SLUICE_BIN, http_get, wait_until
from test_confluent import check_round_trip, consume_assigned, create_topic, produce_keyed
from kafka_wire import Conn, api_versions_v0


def test_two_shards_serve_like_one(make_broker):
    b = make_broker(cores=2, env={"RUST_LOG": "info,sluice::serve::server=debug,sluice::partition::broker=debug"})
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


def _shard_partitions(b):
    """{shard: partition replicas it owns} from the broker's metrics."""
    status, text = http_get(b.metrics_url + "/metrics")
    assert status == 200, text
    found = re.findall(r'^sluice_shard_partitions\{shard="(\d+)"\} (\S+)$', text, re.M)
    return {int(s): int(float(v)) for s, v in found}


def _settled_counts(b, total):
    """The per-shard counts once both shards' published snapshots hold `total` replicas
    (each shard publishes its own about twice a second)."""
    return wait_until(lambda: (c := _shard_partitions(b)) and sum(c.values()) == total and c,
                      what=f"{total} replicas in the shards' metrics")


def test_many_small_topics_are_dealt_evenly_over_the_shards(make_broker):
    # One-partition topics (issue 14): hashing each topic's id to a shard splits a pair
    # of them over both shards only half the time, so after 20 pairs the shards would
    # own equal numbers after every pair with a chance of 1 in 2^20. Replica slots deal
    # a broker's replicas round-robin over its shards: equal after every pair.
    b = make_broker(cores=2)
    for pair in range(20):
        for i in (0, 1):
            create_topic(b.addr, f"small-{pair}-{i}", 1)
        counts = _settled_counts(b, 2 * (pair + 1))
        assert counts == {0: pair + 1, 1: pair + 1}, (pair, counts)
    # A 3-partition topic goes on where the last one stopped: slots 40, 41, 42.
    create_topic(b.addr, "three", 3)
    assert _settled_counts(b, 43) == {0: 22, 1: 21}
    # `sluice cluster describe` shows the broker's shards (from the same metrics).
    r = subprocess.run([SLUICE_BIN, "cluster", "describe", "--bootstrap-server", b.addr,
                        "--metrics", f"127.0.0.1:{b.metrics_port}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = lines.index("Spread (partitions per broker):")
    assert lines[start + 1].split() == ["BROKER", "REPLICAS", "LEADERS", "PREFERRED-LEADERS",
                                        "SHARDS"], r.stdout
    assert lines[start + 2].split() == ["1", "43", "43", "43", "22,21"], r.stdout
    assert "  max - min between the shards of a broker: 1" in lines, r.stdout


def _cpu_list(text):
    """CPU ids of a list such as '0-3,6'."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _shard_cpus(pid):
    """{shard index: the CPUs each of its threads may run on} of a broker process."""
    shards = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            m = re.match(r"shard-(\d+)-", f.read().strip())
        if not m:
            continue
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", f.read()).group(1)
        shards.setdefault(int(m.group(1)), []).append(_cpu_list(allowed))
    return shards


def test_shards_are_pinned_only_when_they_take_every_cpu_they_may_use(make_broker):
    """A broker with fewer shards than CPUs shares the machine and leaves placement to
    the kernel: pinned, every such broker (three of a local cluster, each --cores 1)
    put its one shard on CPU 0 and left the other CPUs idle. Shards that take every
    allowed CPU are pinned one to each, also inside a CPU set the broker starts in."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("needs at least 2 CPUs")
    one = _shard_cpus(make_broker(cores=1).proc.pid)
    assert one and all(s == cpus for threads in one.values() for s in threads), (
        f"one shard of {len(cpus)} CPUs is not pinned: {one}")

    pinned = _shard_cpus(make_broker(cores=len(cpus)).proc.pid)
    assert sorted(pinned) == list(range(len(cpus))), pinned
    per_shard = []
    for _, threads in sorted(pinned.items()):
        assert len(threads[0]) == 1 and all(s == threads[0] for s in threads), (
            f"each shard's threads on one CPU: {pinned}")
        per_shard.append(threads[0])
    assert set().union(*per_shard) == cpus, f"one shard on each CPU: {pinned}"

    # Started in a one-CPU set (as `taskset -c` does): its one shard is pinned there.
    last = max(cpus)
    in_set = _shard_cpus(make_broker(cores=1, cpus={last}).proc.pid)
    assert in_set and all(s == {last} for threads in in_set.values() for s in threads), in_set
