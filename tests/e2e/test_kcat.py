"""Tier: black-box with Debian's kcat (librdkafka 2.0.2), the strictest old client:
it fails on ApiVersions v3 tagged fields it mis-skips."""
import subprocess


def kcat(*args, input=None, timeout=60):
    r = subprocess.run(["kcat", *args], input=input, capture_output=True, timeout=timeout)
    assert r.returncode == 0, f"kcat {args} failed: {r.stderr.decode(errors='replace')}"
    return r.stdout.decode()


def test_metadata_lists_the_broker(broker):
    out = kcat("-b", broker.addr, "-L")
    assert f"broker 1 at {broker.addr}" in out
    assert "(controller)" in out


def test_produce_then_consume(broker):
    lines = [f"line-{i}" for i in range(500)]
    kcat("-b", broker.addr, "-P", "-t", "kc", "-p", "0", input="\n".join(lines).encode() + b"\n")
    out = kcat("-b", broker.addr, "-C", "-t", "kc", "-o", "beginning", "-e", "-q")
    assert out.splitlines() == lines
    # Offsets are dense from 0.
    out = kcat("-b", broker.addr, "-C", "-t", "kc", "-o", "beginning", "-e", "-q", "-f", "%o\n")
    assert [int(x) for x in out.split()] == list(range(500))
    meta = kcat("-b", broker.addr, "-L", "-t", "kc")
    assert 'topic "kc" with 1 partitions' in meta


def test_keyed_produce_to_a_multi_partition_topic(make_broker):
    b = make_broker(extra=["--default-partitions", "4"])
    msgs = [f"k{i % 7}:v{i}" for i in range(200)]
    kcat("-b", b.addr, "-P", "-t", "multi", "-K", ":", input="\n".join(msgs).encode() + b"\n")
    out = kcat("-b", b.addr, "-C", "-t", "multi", "-o", "beginning", "-e", "-q", "-f", "%k:%s\n")
    got = out.splitlines()
    assert sorted(got) == sorted(msgs)
    for k in range(7):
        mine = [m for m in got if m.startswith(f"k{k}:")]
        assert mine == [m for m in msgs if m.startswith(f"k{k}:")], "per-key order"
