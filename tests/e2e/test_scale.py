"""Scale (issue 14): partitions beyond the process's open-file limit.

Every active segment holds one descriptor, its .log (its .index and .timeindex are kept
in memory and written whole when the segment is sealed, not held open). The broker splits
its open-file limit between sockets and the shards' storage, and a shard keeps at most
its share of logs with open files, closing the least recently appended idle ones
(src/node.rs, storage `StorageLimits::active_logs_max`); a log's files open only with
its first append, so a restart opens none. Preallocation ahead of writes is capped per
shard (`StorageLimits::preallocated_bytes_max`). Here a broker whose limit is 2,048
descriptors serves 2,000 partitions over 20 topics with a record each (which would
need 2,000 descriptors held open beside the reserve and the sockets), through a
SIGKILL and a clean restart, and its descriptors, memory and allocated disk stay
within per-partition budgets (docs/architecture.md, "Descriptor budget")."""
import os
import re
import subprocess

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import http_get, read_back, wait_until

TOPICS = 20
PER_TOPIC = 100
PARTITIONS = TOPICS * PER_TOPIC
NOFILE = 2048
# Budgets (docs/architecture.md, "Memory and disk per partition"): a fixed base plus
# a per-partition share.
RSS_BASE = 160 << 20
RSS_PER_PARTITION = 32 << 10
PREALLOCATED_MAX = 512 << 20  # per shard (StorageLimits::preallocated_bytes_max)
DISK_PER_PARTITION = 64 << 10


def topics():
    return [f"wide{t}" for t in range(TOPICS)]


def produce_each(addr, tag, want, names=None, per_topic=PER_TOPIC):
    """One record to every partition of `names` (default: this file's topics), each
    added to `want`; asserts every one acknowledged."""
    p = Producer({"bootstrap.servers": addr, "linger.ms": 20})  # defaults: acks=all, idempotent
    failed = []
    for t in names or topics():
        for i in range(per_topic):
            v = f"{tag}-{t}-{i}".encode()
            p.produce(t, value=v, partition=i,
                      on_delivery=lambda err, m: err and failed.append((m.topic(), m.partition(), err)))
            want.setdefault((t, i), []).append(v)
            p.poll(0)
    assert p.flush(120) == 0, "records without a delivery report"
    assert not failed, failed[:5]


def usage(b):
    """(RSS, allocated bytes of the data directory) of the broker."""
    with open(f"/proc/{b.proc.pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    disk = int(subprocess.check_output(["du", "-sB1", str(b.data_dir)]).split()[0])
    return rss, disk


def segment_files(b):
    """{path: writable} of the partitions' segment files the broker holds open
    (<data dir>/<topic>-<partition>/<20-digit base offset>.<ext>): writable for an
    active log's file, opened read-write; read-only for a read handle."""
    pid = b.proc.pid
    data = os.path.realpath(b.data_dir) + os.sep
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            path = os.readlink(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                flags = next(int(ln.split()[1], 8) for ln in f if ln.startswith("flags:"))
        except (FileNotFoundError, ProcessLookupError):
            continue  # closed meanwhile
        # Partition directories only: the shard journal's chunks (wal@<shard>/) are not
        # segment files.
        if path.startswith(data) and re.search(r"/[^/@]+/\d{20}\.[a-z]+$", path):
            out[path] = flags & os.O_ACCMODE != os.O_RDONLY
    return out


def descriptor_budget(b):
    """The broker's split of its open-file limit, from its last "descriptor budget"
    log line: {"open_files_limit": n, "per_shard_active_logs": n, ...}."""
    [*_, line] = [ln for ln in b.read_log().splitlines() if "descriptor budget" in ln]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def assert_budgets(b, when, active_logs_max):
    """`active_logs_max`: the shards' caps on logs with an open active segment, summed
    (sluice_storage_active_logs_max: each shard's own share plus the shared pool)."""
    rss, disk = usage(b)
    # The kernel keeps the process under NOFILE descriptors whatever the broker does;
    # the budget decides how many of them the logs take. An active log holds its
    # active segment's .log, read-write, nothing else (index files are written whole
    # when a segment is sealed, never held open); reads of other segments go through
    # a bounded set of read-only handles.
    budget = descriptor_budget(b)
    assert budget["open_files_limit"] == NOFILE, budget
    files = segment_files(b)
    held = [f for f in files if not f.endswith(".log")]
    assert not held, f"{when}: index files held open: {held[:5]}"
    active = [f for f, writable in files.items() if writable]
    reading = [f for f, writable in files.items() if not writable]
    # Every partition has been appended to, so without the budget's closing of idle
    # logs all PARTITIONS .log files would be open for writing.
    reserve = max(NOFILE // 20, 1024)  # a twentieth of the limit, at least 1,024
    assert len(files) <= NOFILE - reserve < PARTITIONS, \
        f"{when}: {len(files)} segment files open ({len(active)} for writing) for {PARTITIONS} " \
        f"partitions, more than the open-file limit {NOFILE} less its reserve {reserve}"
    assert len(active) <= active_logs_max < PARTITIONS, \
        f"{when}: {len(active)} active segment files open for {PARTITIONS} partitions, cap {active_logs_max}"
    assert len(reading) <= b.cores * budget["per_shard_read_handles"], \
        f"{when}: {len(reading)} read handles, cap {b.cores} x {budget['per_shard_read_handles']}"
    assert rss <= RSS_BASE + PARTITIONS * RSS_PER_PARTITION, \
        f"{when}: RSS {rss >> 20} MiB for {PARTITIONS} partitions"
    assert disk <= PREALLOCATED_MAX * b.cores + PARTITIONS * DISK_PER_PARTITION, \
        f"{when}: {disk >> 20} MiB allocated for {PARTITIONS} partitions of a few records"


def storage_metrics(b):
    status, body = http_get(b.metrics_url + "/metrics")
    assert status == 200
    out = {}
    for name in ["sluice_storage_active_logs", "sluice_storage_active_logs_max",
                 "sluice_storage_log_reactivations_total",
                 "sluice_storage_preallocated_unwritten_bytes",
                 "sluice_storage_preallocated_bytes_max",
                 "sluice_storage_index_memory_bytes", "sluice_storage_index_memory_max"]:
        vals = [float(v) for v in re.findall(rf'^{name}{{shard="\d+"}} (\S+)$', body, re.M)]
        assert len(vals) == b.cores, f"{name} per shard: {vals}"
        out[name] = vals
    return out


def test_partitions_beyond_the_open_file_limit_through_a_kill_and_a_restart(make_broker):
    b = make_broker(nofile=NOFILE)
    admin = AdminClient({"bootstrap.servers": b.addr})
    fs = admin.create_topics([NewTopic(t, PER_TOPIC, 1) for t in topics()], request_timeout=60)
    for f in fs.values():
        f.result(timeout=90)
    want = {}
    produce_each(b.addr, "a", want)
    assert read_back(b.addr, want) == want
    m = storage_metrics(b)
    logs_cap = sum(m["sluice_storage_active_logs_max"])
    assert_budgets(b, "after a record on each partition", logs_cap)
    for used, cap in zip(m["sluice_storage_active_logs"], m["sluice_storage_active_logs_max"]):
        assert 0 < used <= cap
    for used, cap in zip(m["sluice_storage_preallocated_unwritten_bytes"],
                         m["sluice_storage_preallocated_bytes_max"]):
        assert used <= cap
    for used, cap in zip(m["sluice_storage_index_memory_bytes"], m["sluice_storage_index_memory_max"]):
        assert used <= cap
    assert sum(m["sluice_storage_log_reactivations_total"]) >= PARTITIONS

    b.kill()
    b.start()
    assert read_back(b.addr, want) == want
    assert_budgets(b, "after SIGKILL and restart", logs_cap)
    # The restart opened no log's files; appends open them on demand.
    assert sum(storage_metrics(b)["sluice_storage_active_logs"]) == 0
    produce_each(b.addr, "b", want)
    assert read_back(b.addr, want) == want
    assert_budgets(b, "after a record on each partition again", logs_cap)
    assert sum(storage_metrics(b)["sluice_storage_log_reactivations_total"]) >= PARTITIONS

    b.stop()
    b.start()
    assert read_back(b.addr, want) == want
    assert_budgets(b, "after a clean restart", logs_cap)
    log = b.read_log()
    assert "Too many open files" not in log
    assert "descriptor budget" in log


RF3_TOPICS = [f"wide-rf3-{t}" for t in range(10)]
RF3_PER_TOPIC = 100


def test_thousand_partitions_rf3_in_sync_then_a_sigkilled_brokers_leaderships_move(tmp_path):
    """Issue 14's cluster-sized check: three brokers, 1,000 partitions RF=3 (3,000
    replicas). Every partition reaches a full ISR; after a SIGKILL of the broker leading
    the most partitions, every partition it led has a leader among the survivors, and
    acks=all produce (the producer's defaults: idempotent, acks=all; the topics'
    min.insync.replicas=2) reaches every partition and reads back."""
    from cluster import Cluster, metadata_from, wait_until as cluster_wait

    c = Cluster(tmp_path / "cluster", n=3).start()
    try:
        futs = c.admin().create_topics(
            [NewTopic(t, RF3_PER_TOPIC, 3, config={"min.insync.replicas": "2"}) for t in RF3_TOPICS],
            request_timeout=60)
        for f in futs.values():
            f.result(timeout=90)

        def partitions(addr):
            md = metadata_from(addr, RF3_TOPICS, timeout=15)
            return {(t, p): m for t in RF3_TOPICS
                    for p, m in md["topics"].get(t, {"partitions": {}})["partitions"].items()}

        def in_sync():
            parts = partitions(c.addr(1))
            full = [m for m in parts.values() if m["leader"] >= 0 and len(m["isr"]) == 3]
            return len(full) == len(RF3_TOPICS) * RF3_PER_TOPIC and parts
        parts = cluster_wait(in_sync, 120, "1,000 partitions led, each with 3 in-sync replicas")
        led = {i: [k for k, m in parts.items() if m["leader"] == i] for i in c.ids}
        # Leaders spread by count over the brokers (CreateTopics places them round-robin).
        assert all(len(v) >= 250 for v in led.values()), {i: len(v) for i, v in led.items()}
        victim = max(c.ids, key=lambda i: len(led[i]))
        survivors = [i for i in c.ids if i != victim]
        c.kill(victim)

        def moved():
            now = partitions(c.addr(survivors[0]))
            return len(now) == len(parts) and all(
                now[k]["leader"] in survivors for k in led[victim]) and now
        now = cluster_wait(moved, 60, f"the {len(led[victim])} partitions broker {victim} led led elsewhere")
        assert all(m["leader"] in survivors for m in now.values())

        want = {}
        produce_each(",".join(c.addr(i) for i in survivors), "after", want, RF3_TOPICS, RF3_PER_TOPIC)
        assert read_back(c.addr(survivors[0]), want) == want
    finally:
        c.stop()
