"""Tier: black-box, a 3-broker cluster of real processes (cluster.py) (issue 14, hot
partitions spread).

Topics of sizes that are not multiples of the broker count, created one after another
(RF 1 and 3): placement counts the partitions already on each broker, so after every
topic the replicas and the preferred leaders (first replicas) per broker stay within one
of each other, as the Metadata shows, and `sluice cluster describe` prints the same
per-broker counts in its spread table.
"""
import subprocess
from collections import Counter

import pytest

from cluster import Cluster
from conftest import SLUICE_BIN, expected_log_errors

# (partitions, replication factor): sizes that do not divide by 3, so placing each
# topic from a fixed start (or a hashed one) would pile the remainders up. (With RF 1
# and 2 mixed, replicas and leaders cannot always both stay within one.)
TOPICS = [(1, 1), (2, 1), (4, 3), (5, 1), (1, 3), (7, 1), (2, 3), (4, 1), (1, 1), (8, 1)]


@pytest.fixture
def three(tmp_path, request):
    c = Cluster(tmp_path / "cluster", n=3)
    c.start()
    try:
        yield c
    finally:
        c.stop(expected_log_errors(request))


def _counts(c):
    """Per broker: (replicas, preferred leaders) over every partition in Metadata."""
    md = c.admin().list_topics(timeout=10)
    replicas, preferred = Counter(), Counter()
    for t in md.topics.values():
        for p in t.partitions.values():
            replicas.update(p.replicas)
            preferred[p.replicas[0]] += 1
    return ({i: replicas[i] for i in c.ids}, {i: preferred[i] for i in c.ids})


def _describe_spread(c):
    r = subprocess.run([SLUICE_BIN, "cluster", "describe", "--bootstrap-server", c.addr(c.ids[0])],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = lines.index("Spread (partitions per broker):")
    assert lines[start + 1].split() == ["BROKER", "REPLICAS", "LEADERS", "PREFERRED-LEADERS"], r.stdout
    rows = {}
    for ln in lines[start + 2:]:
        f = ln.split()
        if not f or not f[0].isdigit():
            break
        rows[int(f[0])] = tuple(int(x) for x in f[1:4])
    gaps = next(ln for ln in lines[start:] if ln.strip().startswith("max - min:"))
    return rows, gaps, r.stdout


def test_new_topics_spread_evenly_over_brokers_and_describe_shows_it(three):
    c = three
    for n, (partitions, rf) in enumerate(TOPICS):
        c.create_topic(f"spread-{n}", partitions=partitions, rf=rf)
        replicas, preferred = _counts(c)
        assert max(replicas.values()) - min(replicas.values()) <= 1, (n, replicas)
        assert max(preferred.values()) - min(preferred.values()) <= 1, (n, preferred)
    total = sum(p for p, _ in TOPICS)
    assert sum(preferred.values()) == total
    assert sum(replicas.values()) == sum(p * rf for p, rf in TOPICS)
    # The describe table: the same counts; leaders are the preferred ones while every
    # broker is up (each partition's first replica leads).
    def described():
        rows, gaps, out = _describe_spread(c)
        return rows == {i: (replicas[i], preferred[i], preferred[i]) for i in c.ids}
    c.wait_until(described, 30, "describe shows every partition led by its first replica")
    rows, gaps, out = _describe_spread(c)
    spread_r = max(replicas.values()) - min(replicas.values())
    spread_p = max(preferred.values()) - min(preferred.values())
    assert gaps.split() == ["max", "-", "min:", "replicas", f"{spread_r},", "leaders",
                            f"{spread_p},", "preferred", "leaders", str(spread_p)], out
