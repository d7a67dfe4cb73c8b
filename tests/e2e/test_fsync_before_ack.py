"""Fsync before ack, observed at the broker (issue 38, item 3): when the sync that an
append waits for fails, the append is refused, never acknowledged, for acks=all and for
acks=1, whichever way the log makes its writes durable: the shard journal's
write-through writes (the default for batches up to 4 KiB; these probes are small), or
without it (`--journal-chunk-bytes 0`, and for larger batches) the partition's own
write-through O_DSYNC writes (a shard's first 32 logs) or write + fdatasync
(`--dsync-logs-max 0`).

The failure is a storage fault (`--fault-rules`, a test-only flag: `sync eio <path>`
fails every fdatasync of the matching files, and every write of a write-through file,
whose sync is part of the write): the shard journal's chunks (`wal@0/`), or the two
partitions' directories when the journal is off. The broker answers KAFKA_STORAGE_ERROR and
takes the partition offline; once the fault is gone it reopens the partition,
re-reading its files, and the test checks that what each client was told matches what
is stored: every acknowledged record is at its offset, and a refused record is at most
present at an offset no client was told about.

A broker that acknowledges without waiting for its sync fails every case here: built
with `PartitionLog::flush_for_ack` returning at once and no write-through logs, it
answered the probe with error 0 (acknowledged). test_power_loss.py shows what such an
acknowledgement costs after a power cut.
"""
import pytest
from confluent_kafka import KafkaError, Producer

import kafka_wire as kw
from conftest import wait_until
from test_disk import KAFKA_STORAGE_ERROR, create_topic, read_all, write_rules

TOPIC = "synced"


def value(tag, i):
    return f"{tag}-{i:04d}".encode().ljust(512, b".")


def produce_raw(conn, partition, vals, acks, corr=[1000]):
    """One Produce v3 request on a raw connection -> (error code, base offset)."""
    corr[0] += 1
    conn.send(kw.produce_v3(TOPIC, partition, kw.record_batch(vals), acks=acks, corr=corr[0]))
    c, body = conn.recv()
    assert c == corr[0]
    [(_, p, err, base)] = kw.parse_produce_v3(body)
    assert p == partition
    return err, base


class Probe:
    """A confluent-kafka producer with no retries and no lingering: each record goes in
    a request of its own (linger.ms=0), so its delivery report is the broker's answer
    to that one request. Idempotence stays off, librdkafka's default (it would turn
    retries back on)."""

    def __init__(self, addr, acks):
        self.p = Producer({"bootstrap.servers": addr, "acks": str(acks), "retries": 0,
                           "enable.idempotence": False, "linger.ms": 0,
                           "message.timeout.ms": 20000})

    def close(self):
        self.p.flush(10)
        self.p.close()

    def send(self, partition, val):
        """-> (KafkaError or None, offset)"""
        out = []
        self.p.produce(TOPIC, value=val, partition=partition,
                       on_delivery=lambda err, msg: out.append((err, msg.offset())))
        wait_until(lambda: self.p.poll(0.1) >= 0 and out, timeout=30, what="a delivery report")
        return out[0]


# How appends become durable: broker flags, and the fault rules that fail that sync.
PARTITIONS_FAIL = f"sync eio {TOPIC}-0/\nsync eio {TOPIC}-1/\n"
DURABILITY = {
    "journal": (["--journal-chunk-bytes", str(128 << 20)], "sync eio wal@0/\n"),
    "write-through": (["--journal-chunk-bytes", "0"], PARTITIONS_FAIL),
    "fdatasync": (["--journal-chunk-bytes", "0", "--dsync-logs-max", "0"], PARTITIONS_FAIL),
}


@pytest.mark.parametrize("how", list(DURABILITY))
@pytest.mark.parametrize("acks", [-1, 1])
@pytest.mark.broker_log_errors(r"partition offline after an I/O error")
def test_append_whose_sync_fails_is_refused_and_storage_matches_what_clients_were_told(
        make_broker, tmp_path, acks, how):
    rules = tmp_path / "faults"
    # One shard: the rules file watcher arms the rules on the shard that serves the
    # produce requests, right after logging it, with no await in between; so once the
    # line is in the log, the next request sees the rules armed.
    flags, fault = DURABILITY[how]
    b = make_broker(cores=1, extra=["--fault-rules", str(rules), *flags])
    create_topic(b.addr, TOPIC, partitions=2)
    conn = kw.Conn(b.addr, timeout=30)
    probe = Probe(b.addr, acks)
    told_ok = {0: {}, 1: {}}      # partition -> {offset: value} the client was told succeeded
    refused = {0: set(), 1: set()}

    # Partition 0 is driven with raw Produce requests, partition 1 by confluent-kafka.
    for i in range(5):
        err, base = produce_raw(conn, 0, [value("before", i)], acks)
        assert err == 0, f"append before the fault answered {err}"
        told_ok[0][base] = value("before", i)
        err, off = probe.send(1, value("before", i))
        assert err is None, f"append before the fault: {err}"
        told_ok[1][off] = value("before", i)

    write_rules(rules, fault)
    last_path = fault.split()[-1]
    wait_until(lambda: f'"{last_path}"' in last_armed(b), timeout=10, what="the sync fault armed")
    try:
        probe_and_recover(b, rules, conn, probe, acks, told_ok, refused)
    finally:
        # Also when the test failed: the broker's teardown (SIGTERM, which syncs and
        # closes every log) must not meet the fault.
        write_rules(rules, "")
        wait_until(lambda: last_armed(b).endswith("rules=[]"), timeout=10, what="the fault disarmed")
    conn.close()
    probe.close()

    for p in (0, 1):
        stored = read_all(b.addr, TOPIC, p)
        lost = {o: v[:12] for o, v in told_ok[p].items() if stored.get(o) != v}
        assert not lost, f"{TOPIC}-{p}: acknowledged records not stored at their offsets: {lost}"
        # Anything else stored is a record whose append was refused (a failed sync does
        # not undo the write it was for): never one the client was told about.
        extra = {o: v for o, v in stored.items() if o not in told_ok[p]}
        unknown = {o: v[:12] for o, v in extra.items() if v not in refused[p]}
        assert not unknown, f"{TOPIC}-{p}: stored records no client sent: {unknown}"
        dup = [v[:12] for v in extra.values() if v in told_ok[p].values()]
        assert not dup, f"{TOPIC}-{p}: acknowledged records stored twice: {dup}"
        print(f"{how} acks={acks} {TOPIC}-{p}: {len(told_ok[p])} acknowledged, all stored; "
              f"refused but stored: {sorted(v[:12].decode() for v in extra.values())}")


def last_armed(b):
    """The last "storage fault rules armed" log line of broker `b` ('' if none)."""
    lines = [ln for ln in b.read_log().splitlines() if "storage fault rules armed" in ln]
    return lines[-1].rstrip() if lines else ""


def probe_and_recover(b, rules, conn, probe, acks, told_ok, refused):
    """With the sync fault armed: the first append to each partition is refused, and so
    is every later one until the fault is gone; then each partition comes back and
    takes appends again. Fills `told_ok` and `refused` as the clients were told."""
    # The first append after arming: its sync fails, so it must be refused.
    probe_val = value("probe", 0)
    err, base = produce_raw(conn, 0, [probe_val], acks)
    assert err == KAFKA_STORAGE_ERROR, (
        f"acks={acks}: the append whose sync failed answered error {err} (base offset {base}); "
        f"want KAFKA_STORAGE_ERROR ({KAFKA_STORAGE_ERROR})")
    refused[0].add(probe_val)
    kerr, off = probe.send(1, probe_val)
    assert kerr is not None and kerr.code() == KafkaError.KAFKA_STORAGE_ERROR, (
        f"acks={acks}: confluent-kafka's append whose sync failed was answered {kerr} "
        f"(offset {off}); want KAFKA_STORAGE_ERROR")
    refused[1].add(probe_val)

    # Each partition stays refused while the fault lasts (it is offline now).
    for i in range(3):
        v = value("while", i)
        err, _ = produce_raw(conn, 0, [v], acks)
        assert err == KAFKA_STORAGE_ERROR, f"an append to the failed partition answered {err}"
        refused[0].add(v)
    wait_until(lambda: b.read_log().count("partition offline after an I/O error") >= 2,
               timeout=10, what="both partitions logged offline")

    # The fault is gone: the broker reopens the partitions (recovery re-reads them).
    write_rules(rules, "")
    wait_until(lambda: last_armed(b).endswith("rules=[]"), timeout=10, what="the fault disarmed")

    def back(partition, n=[0]):
        n[0] += 1
        v = value("after", n[0])
        err, base = produce_raw(conn, partition, [v], acks)
        assert err in (0, KAFKA_STORAGE_ERROR), f"append after the fault answered {err}"
        if err:
            refused[partition].add(v)
            return False
        told_ok[partition][base] = v
        return True
    for p in (0, 1):
        wait_until(lambda: back(p), timeout=60, what=f"{TOPIC}-{p} back online")
    for i in range(5):
        err, base = produce_raw(conn, 0, [value("later", i)], acks)
        assert err == 0
        told_ok[0][base] = value("later", i)
        err, off = probe.send(1, value("later", i))
        assert err is None, f"append after recovery: {err}"
        told_ok[1][off] = value("later", i)
