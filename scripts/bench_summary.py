"""Builds the `make bench` summary table from the reports in a results directory:
every result beside its ceiling from the same run, as a ratio."""
import json
import os
import subprocess
import sys
import time

out = sys.argv[1]
cores = sys.argv[2] if len(sys.argv) > 2 else "?"


def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None


ceil = load("ceiling-report.json") or {}
disk = ceil.get("odirect_write_mb_per_sec", 0) or 0
net = ceil.get("loopback_tcp_mb_per_sec", 0) or 0
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
rows = []


def ms(r, k):
    lat = r.get("latency_ms") or {}
    v = lat.get(k)
    return f"{v:.2f}" if isinstance(v, (int, float)) else "–"


def add(label, r, ceiling_name, ceiling):
    if not r:
        return
    ratio = f"{r['mb_per_sec'] / ceiling * 100:.0f}% of {ceiling_name}" if ceiling else "–"
    rows.append(f"| {label} | {r['records_per_sec']:,.0f} | {r['mb_per_sec']:.1f} | {ms(r, 'p50')} | {ms(r, 'p99')} | {ms(r, 'p999')} | {ms(r, 'max')} | {ratio} |")


add("(a) produce 100 B, acks=1, 8 partitions, max throughput", load("a-max-throughput-report.json"), "disk write", disk)
add("(b) produce 100 B, acks=1, fixed rate (open loop)", load("b-fixed-rate-report.json"), "disk write", disk)
add("(b-tls) (b) over TLS", load("b-tls-fixed-rate-report.json"), "disk write", disk)
add("(b-sasl) (b) over SASL_SSL", load("b-sasl-fixed-rate-report.json"), "disk write", disk)
add("(b-low) produce 100 B, acks=all, linger 0, low fixed rate", load("b-low-acks-all-report.json"), "disk write", disk)
add("(c) produce 1 KiB, acks=all", load("c-1k-acks-all-report.json"), "disk write", disk)
c_1m = load("c-1k-acks-all-1m-batches-report.json")
add("(c-1m) produce 1 KiB, acks=all, 1 MiB batches", c_1m, "disk write", disk)
add("(c-idem) produce 1 KiB, acks=all, idempotent", load("c-1k-acks-all-idempotent-report.json"), "disk write", disk)
c_txn = load("c-1k-acks-all-txn-report.json")
add("(c-txn) produce 1 KiB, acks=all, transactional, commit every 100 ms", c_txn, "disk write", disk)
ctp = load("ctp-report.json")
# Its latency columns: input record fetched to the answer of the commit that makes its
# output visible to read_committed consumers.
if ctp and ctp.get("e2e_latency_ms"):
    add("(ctp) consume-transform-produce 1 KiB, exactly once: fetch to commit", dict(ctp, latency_ms=ctp["e2e_latency_ms"]), "disk write", disk)
add("(d) consume (topic of a)", load("d-consume-report.json"), "loopback TCP", net)
e2e = load("e2e-report.json")
add("e2e 100 B at 100k/s, acks=all: produce-ack", e2e, "disk write", disk)
if e2e and e2e.get("e2e_latency_ms"):
    add("e2e 100 B at 100k/s: end-to-end", dict(e2e, latency_ms=e2e["e2e_latency_ms"]), "disk write", disk)
add("cross-check: (a) driven by librdkafka (confluent-kafka)", load("librdkafka-report.json"), "disk write", disk)
g = load("group-report.json")
b = load("b-fixed-rate-report.json")
lines = [
    f"`make bench` on {time.strftime('%Y-%m-%d')}, commit {commit}, broker `--cores {cores}`, load generator on the same 2-core machine.",
    f"Ceilings measured in the same run: O_DIRECT sequential write {disk:.0f} MB/s, loopback TCP {net:.0f} MB/s." if ceil else "No ceilings in this run (a partial BENCH_PART run).",
    "",
    "| scenario | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | max ms | ratio |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
] + rows
if g:
    r = g["result"]
    lines += ["", f"Consumer groups: {g['config']['members']:,} lightweight members, {g['config']['partitions']:,} partitions: every member stable with its assignment {r['join_ms'] / 1000:.2f} s after the first JoinGroup (3 s of it is the initial rebalance delay); rebalance after one member leaves {r['rebalance_after_leave_ms']:.0f} ms (target: well under 30 s)."]
# Issue 45: both protocols side by side, at 1,000 and 10,000 members.
group_rows = []
for members in (1000, 10000):
    for proto in ("classic", "consumer"):
        name = "group-report.json" if proto == "classic" else f"group-{proto}-report.json"
        r = load(f"groups-{members}/{name}") or (
            load(name) if (members, proto) == (1000, "classic") else None)
        if not r:
            continue
        x = r["result"]
        group_rows.append(
            f"| {members:,} | {'classic (JoinGroup/SyncGroup)' if proto == 'classic' else 'consumer (KIP-848)'} "
            f"| {x['join_ms'] / 1000:.2f} s | {x['rebalance_after_leave_ms']:.0f} ms "
            f"| {x.get('leave_paused_members', '-')} (≤ {x.get('leave_max_pause_ms', 0):.0f} ms) "
            f"| {x['rebalance_after_join_ms']:.0f} ms "
            f"| {x.get('join_paused_members', '-')} (≤ {x.get('join_max_pause_ms', 0):.0f} ms) |")
if group_rows:
    lines += ["", "Consumer group protocols (`sluice-bench group`, members as many as partitions, 200 ms heartbeats; a stop is a member consuming nothing at some moment):", "",
              "| members | protocol | all stable after the joins | a leave absorbed | other members that stopped | a join absorbed | other members that stopped |",
              "|---:|---|---:|---:|---:|---:|---:|"] + group_rows
st = load("storage-report.json")
if st:
    c = st["ceilings"]
    lines += ["", f"Storage (`sluice-bench storage`, one partition, {st['appenders']} concurrent appenders, {st['seconds_per_scenario']:.0f} s each; ceiling: raw O_DIRECT 1 MiB writes {c['raw_odirect_write_mb_per_sec']:.0f} MB/s, raw 4 KiB write + fdatasync p50 {c['raw_fdatasync_us']['p50']} µs / p99 {c['raw_fdatasync_us']['p99']} µs; latency is append to acknowledgement — durable for `always`):", "",
              "| scenario | MB/s | batches/s | p50 µs | p99 µs | p99.9 µs | ratio to raw write |", "|---|---:|---:|---:|---:|---:|---:|"]
    for x in st["results"]:
        l = x["latency_us"]
        lines.append(f"| {x['scenario']} | {x['mb_per_sec']:.0f} | {x['batches_per_sec']:.0f} | {l['p50']} | {l['p99']} | {l['p999']} | {x['ratio_of_raw_write'] * 100:.0f}% |")
c_plain, c_idem = load("c-1k-acks-all-report.json"), load("c-1k-acks-all-idempotent-report.json")
if c_plain and c_idem:
    p99 = lambda r: (r.get("latency_ms") or {}).get("p99") or 0
    lines += ["", f"Idempotent vs plain producers (c-idem / c, same run): throughput {c_idem['records_per_sec'] / c_plain['records_per_sec']:.2f}x (goal >= 0.9x), p99 {p99(c_idem) / max(p99(c_plain), 1e-9):.2f}x (goal <= 1.2x)."]
if c_plain and c_txn:
    p99 = lambda r: (r.get("latency_ms") or {}).get("p99") or 0
    cl = c_txn.get("commit_latency_ms") or {}
    n = c_txn.get("transactions") or 0
    spacing = c_txn["seconds"] * c_txn["config"]["producers"] / n * 1000 if n else 0
    lines += ["", f"Transactional vs plain producers (c-txn / c, same run; each of the {c_txn['config']['producers']} producers commits when its transaction is {c_txn['config']['commit_interval_ms']} ms old): throughput {c_txn['records_per_sec'] / c_plain['records_per_sec']:.2f}x, produce p99 {p99(c_txn) / max(p99(c_plain), 1e-9):.2f}x; {n:,} commits, one per {spacing:.0f} ms per producer, commit (flush of the transaction's produce requests + EndTxn) p50 {cl.get('p50', 0):.2f} ms, p99 {cl.get('p99', 0):.2f} ms."]
if ctp:
    cl = ctp.get("commit_latency_ms") or {}
    vs_plain = f", {ctp['records_per_sec'] / c_plain['records_per_sec']:.2f}x the plain producers of (c)" if c_plain else ""
    n = ctp.get("transactions") or 0
    spacing = ctp["seconds"] / n * 1000 if n else 0
    lines += ["", f"Consume-transform-produce (ctp): one processor read {ctp['records']:,} records of {ctp['config']['record_size']} B with read_committed, wrote each again to the output in transactions that also committed its input offsets (AddOffsetsToTxn + TxnOffsetCommit with its group generation and member id; a commit once the transaction is {ctp['config']['commit_interval_ms']} ms old, checked after each fetch: {n:,} commits, one per {spacing:.0f} ms): {ctp['records_per_sec']:,.0f} records/s end to end ({ctp['mb_per_sec']:.0f} MB/s read and the same written{vs_plain}); commit (offsets + flush + EndTxn) p50 {cl.get('p50', 0):.2f} ms, p99 {cl.get('p99', 0):.2f} ms. Checked in the run: a read_committed count of the output equals the input, {ctp['consumed']:,} records."]
if b:
    target = b["config"].get("rate")
    lines += ["", f"(b) asked for {target:,.0f} records/s and achieved {b['records_per_sec']:,.0f}; produce p99 {ms(b, 'p99')} ms (target < 10 ms)."]
if c_1m:
    vs_c = f", {c_1m['records_per_sec'] / c_plain['records_per_sec']:.2f}x (c) with its 64 KiB batches" if c_plain else ""
    lines += ["", f"(c-1m) 1 KiB acks=all in 1 MiB batches (librdkafka's default batch.size): {c_1m['mb_per_sec']:,.0f} MB/s on one broker core{vs_c}, {c_1m['mb_per_sec'] / disk * 100 if disk else 0:.0f}% of the O_DIRECT ceiling (issue 17's goal: >= 1 GB/s)."]
b_tls = load("b-tls-fixed-rate-report.json")
if b and b_tls:
    lines += ["", f"(b-tls) over TLS against (b) plaintext, same run: throughput {b_tls['records_per_sec'] / b['records_per_sec']:.2f}x, p99 {ms(b_tls, 'p99')} ms against {ms(b, 'p99')} ms (issue 42's goal: >= 0.8x, p99 within 1.5x)."]
b_sasl = load("b-sasl-fixed-rate-report.json")
if b and b_sasl:
    lines += ["", f"(b-sasl) over SASL_SSL against (b) plaintext, same run: throughput {b_sasl['records_per_sec'] / b['records_per_sec']:.2f}x, p99 {ms(b_sasl, 'p99')} ms against {ms(b, 'p99')} ms (issue 42's goal: >= 0.8x, p99 within 1.5x)."]
b_low = load("b-low-acks-all-report.json")
if b_low:
    target = b_low["config"].get("rate")
    lines += ["", f"(b-low) asked for {target:,.0f} records/s and achieved {b_low['records_per_sec']:,.0f}; produce p99 {ms(b_low, 'p99')} ms (issue 17's goal: <= 1 ms)."]

# RF=3 on a 3-broker cluster beside the single-broker run of the same scenario.
def lat(r, k):
    v = (r.get("latency_ms") or {}).get(k)
    return v if isinstance(v, (int, float)) else None


def times(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "–"


def isr_note(r):
    c = r.get("config") or {}
    before = c.get("replicas_before") or []
    if not before:
        return "ISR not checked"
    ok = all(len(p["isr"]) == 3 == len(p["replicas"]) for p in before)
    after = c.get("all_in_sync_after")
    return f"{len(before)} partitions, ISR 3/3 before" + (" and after" if after else "; ISR shrank during the run" if after is False else "") if ok else "ISR < 3"


REPL = [
    ("r0", "produce 100 B, acks=all, fixed rate, fresh topic, no warm-up (cold)", "r0-single-acks-all-cold", "r0-rf3-acks-all-cold"),
    ("r1", "produce 100 B, acks=all, fixed rate (open loop)", "r1-single-acks-all-fixed", "r1-rf3-acks-all-fixed"),
    ("r2", "produce 100 B, acks=1, fixed rate (open loop)", "r2-single-acks-1-fixed", "r2-rf3-acks-1-fixed"),
    ("r3", "produce 100 B, acks=all, max throughput", "r3-single-acks-all-max", "r3-rf3-acks-all-max"),
    ("r4", "produce 100 B, acks=1, max throughput", "r4-single-acks-1-max", "r4-rf3-acks-1-max"),
]
rrows = []
for tag, label, single_name, rf3_name in REPL:
    one, rf3 = load(single_name + "-report.json"), load(rf3_name + "-report.json")
    rate = ((rf3 or one or {}).get("config") or {}).get("rate")
    label = label.replace("fixed rate", f"fixed {rate:,.0f}/s") if rate else label
    for who, r in (("1 broker", one), ("3 brokers, RF=3", rf3)):
        if not r:
            continue
        if r is rf3 and one:
            ratio = (f"records/s {times(rf3['records_per_sec'], one['records_per_sec'])}, "
                     f"p50 {times(lat(rf3, 'p50'), lat(one, 'p50'))}, p99 {times(lat(rf3, 'p99'), lat(one, 'p99'))}, "
                     f"p99.9 {times(lat(rf3, 'p999'), lat(one, 'p999'))}; {isr_note(rf3)}")
        elif r is rf3:
            ratio = f"no single-broker run; {isr_note(rf3)}"
        else:
            ratio = "baseline"
        if tag == "r0":
            warm = load(("r1-single" if r is one else "r1-rf3") + "-acks-all-fixed-report.json")
            if warm:
                ratio += f"; cold / warm (r1) p99 {times(lat(r, 'p99'), lat(warm, 'p99'))}, max {times(lat(r, 'max'), lat(warm, 'max'))}"
        cpu = ((r.get("config") or {}).get("cpu") or {}).get("us_per_record")
        if r is rf3 and one and cpu is not None:
            ratio += f"; CPU per record {times(cpu, ((one.get('config') or {}).get('cpu') or {}).get('us_per_record'))}"
        cpu = f"{cpu:.2f}" if cpu is not None else "–"
        rrows.append(f"| ({tag}) {label} | {who} | {r['records_per_sec']:,.0f} | {r['mb_per_sec']:.1f} | {ms(r, 'p50')} | {ms(r, 'p99')} | {ms(r, 'p999')} | {ms(r, 'max')} | {cpu} | {ratio} |")
if rrows:
    lines += ["", "Replication (RF=3, 3 brokers on one 2-core VM): the same `make bench` run starts a 3-broker cluster on "
              "this machine, each broker `--cores 1`, creates every topic with replication factor 3 (min.insync.replicas 2) and "
              "measures only after the Metadata shows all 3 replicas of every partition in the ISR and a 2 s acks=all warm-up "
              "(at the fixed rate) has gone through, except (r0): the same load on a fresh topic with no warm-up; the single-broker baselines run the same way, in the same run. The three brokers and the "
              "load generator share 2 cores, so every follower fetch competes with the leaders and the generator for CPU: a "
              "pessimistic setup, not what separate machines would show. Ratios are RF=3 over the single broker of the same "
              "scenario in this run (×; above 1 for latency means slower). CPU µs/record: the brokers' CPU time over the run "
              "(user + system, every thread, all three brokers for RF=3) per record produced, so for RF=3 the cluster's "
              "cost of one replicated record.", "",
              "| scenario | brokers | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | max ms | CPU µs/record | RF=3 / single broker |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"] + rrows

# Issue 14: many partitions (scripts/bench-scale.sh), each beside the 8-partition run.
def scale(kind, label):
    """(the sustain report with the setup's figures merged in, its resources)."""
    run, setup = load(f"scale-{kind}-{label}-scale.json"), load(f"scale-{kind}-{label}-setup-scale.json")
    if run and setup:
        for k, v in (setup.get("result") or {}).items():
            run["result"].setdefault(k, v)
    return run, load(f"scale-{kind}-{label}-resources.json")


def device_per_acked(name):
    """Bytes written to the device per byte acknowledged in sustain run `name`."""
    dev, run = load(f"{name}-device.json"), load(f"{name}-scale.json")
    if not dev or not run:
        return None
    sus = (run.get("result") or {}).get("sustain") or {}
    acked = sus.get("records", 0) * run["config"].get("record_size", 0)
    return dev["device_bytes"] / acked if acked else None


def fmt_ms(v):
    return f"{v / 1000:.2f} s" if isinstance(v, (int, float)) else "–"


srows = []
for kind, who in (("1b", "1 broker"), ("rf3", "3 brokers, RF=3")):
    (small, small_res), (big, big_res) = scale(kind, "p8"), scale(kind, "p10k")
    if not big:
        continue
    rs, rb = (small or {}).get("result") or {}, big["result"]
    n = rb.get("partitions", 0)

    def both(key, sub=None, f=fmt_ms):
        a, b = rs.get(key), rb.get(key)
        if sub:
            a = ((a or {}).get("latency_ms") or {}).get(sub)
            b = ((b or {}).get("latency_ms") or {}).get(sub)
            f = lambda v: f"{v:.1f} ms" if isinstance(v, (int, float)) else "–"
        return f"{f(b)} ({times(b, a)} of 8 partitions: {f(a)})" if a is not None else f(b)

    srows.append(f"| {who}: create {n:,} partitions to leaders | {both('create_to_leaders_ms')} |")
    if rb.get("create_to_in_sync_ms") is not None:
        srows.append(f"| {who}: create to a full ISR | {both('create_to_in_sync_ms')} |")
    srows.append(f"| {who}: one acks=all record to every partition | {both('one_record_each_ms')} |")
    sus = rb.get("sustain") or {}
    asked = big["config"]["rate"]
    srows.append(f"| {who}: {asked:,.0f} records/s acks=all over all partitions: achieved | {sus.get('records_per_sec', 0):,.0f} records/s, {sus.get('errors', 0)} errors |")
    srows.append(f"| {who}: same, produce p99 | {both('sustain', 'p99')} |")
    db, da = device_per_acked(f"scale-{kind}-p10k"), device_per_acked(f"scale-{kind}-p8")
    if db is not None:
        srows.append(f"| {who}: same, bytes written to the device per byte acknowledged | {db:.1f}"
                     + (f" (8 partitions: {da:.1f})" if da is not None else "") + " |")
    if kind == "1b":
        fb, fa = load("scale-1b-p10k-full-scale.json"), load("scale-1b-p8-full-scale.json")
        if fb:
            sb, sa = fb["result"].get("sustain") or {}, ((fa or {}).get("result") or {}).get("sustain") or {}
            pb, pa = (sb.get("latency_ms") or {}).get("p99"), (sa.get("latency_ms") or {}).get("p99")
            fdb, fda = device_per_acked("scale-1b-p10k-full"), device_per_acked("scale-1b-p8-full")
            srows.append(f"| {who}: {fb['config']['rate']:,.0f} records/s acks=all asked: achieved, p99, device bytes per acked byte | "
                         f"{sb.get('records_per_sec', 0):,.0f} records/s, p99 {pb:.1f} ms, {fdb or 0:.1f}"
                         + (f" (8 partitions: {sa.get('records_per_sec', 0):,.0f} records/s, p99 {pa:.1f} ms, {fda or 0:.1f}; p99 {times(pb, pa)})" if pa is not None else "") + " |")
        kb, ka = load("scale-1b-p10k-rdkafka.json"), load("scale-1b-p8-rdkafka.json")
        if kb:
            rb_, ra_ = kb["result"], (ka or {}).get("result") or {}
            lb, la = rb_["latency_ms"], ra_.get("latency_ms") or {}
            srows.append(f"| {who}: confluent-kafka (linger.ms=5, acks=all) {kb['config']['rate']:,.0f} records/s: achieved, p50, p99 | "
                         f"{rb_['records_per_sec']:,.0f} records/s, p50 {lb['p50']:.1f} ms, p99 {lb['p99']:.1f} ms, {rb_['errors']} errors"
                         + (f" (8 partitions: p50 {la['p50']:.1f} ms, p99 {la['p99']:.1f} ms; p99 {times(lb['p99'], la['p99'])})" if la.get("p99") else "") + " |")
    if big_res:
        per = lambda k: big_res[k] / max(n, 1)
        srows.append(f"| {who}: RSS / open descriptors / allocated disk after the load | {big_res['rss_kb'] / 1024:,.0f} MiB / {big_res['open_fds']:,} / {big_res['disk_kb'] / 1024:,.0f} MiB ({per('rss_kb'):.1f} KiB, {per('open_fds'):.2f}, {per('disk_kb'):.0f} KiB per partition) |")
    for suffix, what in (("restart", "SIGKILL, restart to every partition serving"), ("failover", "SIGKILL of broker 2 to a new leader for every partition it led"), ("rejoin", "broker 2 back to a full ISR everywhere")):
        b = load(f"scale-{kind}-p10k-{suffix}-scale.json")
        a = load(f"scale-{kind}-p8-{suffix}-scale.json")
        if b:
            vb, va = b["result"].get("verify_ms"), (a or {}).get("result", {}).get("verify_ms")
            srows.append(f"| {who}: {what} | {fmt_ms(vb)}" + (f" ({times(vb, va)} of 8 partitions: {fmt_ms(va)})" if va else "") + " |")
if srows:
    lines += ["", "Many partitions (`scripts/bench-scale.sh`, issue 14): 100 topics × 100 partitions on one broker (`--cores 2`) and on 3 brokers (`--cores 1` each, RF=3), each figure beside the same scenario with 8 partitions in this run.", "",
              "| scenario | figure |", "|---|---|"] + srows
# Issue 41: produce latency while a partition's data moves between brokers
# (scripts/bench-move.sh), each run beside the same load with no move.
mt = load("move-times.json")
m0 = load("move-m0-none-report.json")
if mt and m0:
    def p99(r):
        return (r.get("latency_ms") or {}).get("p99")
    gib = mt["bytes"] / 2**30
    lines += ["", f"Partition moves (issue 41): three brokers (--cores 1 each), an acks=all producer of 100 B records at "
              f"{mt['rate']:,} records/s over 8 partitions (RF=3) for {mt['seconds']} s, while one partition holding {gib:.2f} GiB "
              "moves to another broker (sluice cluster reassign); p99 beside the run with no move; the move's time is until it "
              "completed (it may outlast the load).", "",
              "| run | records/s | p50 ms | p99 ms | max ms | p99 vs no move | move took |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    runs = [("(m0) no move", m0, None),
            ("(m1) moving, unthrottled", load("move-m1-unthrottled-report.json"), mt.get("unthrottled_ms")),
            (f"(m2) moving, follower.replication.throttled.rate {mt['throttle_bytes_per_sec'] / 2**20:.0f} MiB/s",
             load("move-m2-throttled-report.json"), mt.get("throttled_ms"))]
    for label, r, took in runs:
        if not r:
            continue
        ratio = f"{p99(r) / p99(m0):.2f}×" if p99(r) and p99(m0) else "–"
        t = f"{took / 1000:.1f} s ({mt['bytes'] / 2**20 / (took / 1000):.0f} MiB/s)" if took else "–"
        lines.append(f"| {label} | {r['records_per_sec']:,.0f} | {ms(r, 'p50')} | {ms(r, 'p99')} | {ms(r, 'max')} | {ratio} | {t} |")
roll = load("move-rolling.json")
if roll:
    num = lambda v: f"{v:,.0f}" if isinstance(v, (int, float)) else "–"
    lines += ["", f"Rolling restart (issue 41): the same three brokers restarted one at a time (SIGTERM, start, "
              f"until no partition is under-replicated) under confluent-kafka at its defaults, acks=all, "
              f"{roll['rate']:,} records/s over 6 partitions RF=3: {roll['acked']:,} records acknowledged, "
              f"{roll['failed']} failed; longest delivery (the longest stall) {num(roll['max_ms'])} ms, "
              f"p99 {num(roll['p99_ms'])} ms."]

# Issue 44: tiered storage (scripts/bench-tiered.sh): produce with uploads running
# beside the same load without, reading from the store beside reading locally.
tf = load("tier-facts.json")
t0, t1 = load("tier-t0-local-report.json"), load("tier-t1-remote-report.json")
t2, t3 = load("tier-t2-local-report.json"), load("tier-t3-remote-report.json")
if tf and t0 and t1:
    def p99(r):
        return (r.get("latency_ms") or {}).get("p99")
    lines += ["", f"Tiered storage (issue 44): one broker (--cores 1) with --remote-storage on a folder of the same disk, "
              f"an acks=all producer of 100 B records at {tf['rate']:,} records/s over 8 partitions for {tf['seconds']} s "
              "(1 MiB segments; the tiered topic keeps 2 MiB per partition locally), then every record of each topic read "
              f"from offset 0 (when the tiered one was read, {tf['remote_bytes'] / 2**20:.0f} MiB were in the store and "
              f"{tf['local_bytes'] / 2**20:.0f} MiB on local disk).", "",
              "| run | records/s | MB/s | p50 ms | p99 ms | max ms | ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
    def row(label, r, ratio):
        lines.append(f"| {label} | {r['records_per_sec']:,.0f} | {r['mb_per_sec']:.1f} | {ms(r, 'p50')} | {ms(r, 'p99')} | {ms(r, 'max')} | {ratio} |")
    row("(t0) produce, no remote storage", t0, "baseline")
    row("(t1) produce, uploads running", t1, f"p99 {p99(t1) / p99(t0):.2f}× of (t0)" if p99(t0) and p99(t1) else "–")
    if t2 and t3:
        row("(t2) read from offset 0, local", t2, "baseline")
        row("(t3) read from offset 0, mostly remote", t3, f"{t3['records_per_sec'] / t2['records_per_sec']:.2f}× of (t2)")
    t4, t5, sf = load("tier-t4-s3-report.json"), load("tier-t5-s3-report.json"), load("tier-s3-facts.json")
    if t4:
        row("(t4) produce, uploads to S3 (moto on loopback) running", t4,
            f"p99 {p99(t4) / p99(t0):.2f}× of (t0)" if p99(t0) and p99(t4) else "–")
    if t2 and t5 and sf:
        row(f"(t5) read from offset 0, mostly from S3 ({sf['remote_bytes'] / 2**20:.0f} MiB in {sf['objects']} objects)", t5,
            f"{t5['records_per_sec'] / t2['records_per_sec']:.2f}× of (t2)")

# Issue 17: the soak, a row per sample interval of the broker's resources beside the
# interval's rates and latency; facts about growth, no verdict of pass or fail.
soak = load("soak-report.json")
if soak and soak.get("samples"):
    sm = soak["samples"]
    cfg = soak.get("config") or {}
    tcfg = ", ".join(f"{k}={v}" for k, v in cfg.get("topic_configs") or [])
    num = lambda v, f: f.format(v) if isinstance(v, (int, float)) else "–"
    mib = lambda v: v / 1024 if isinstance(v, (int, float)) else None
    lines += ["", f"Soak (issue 17): one broker, {cfg.get('partitions', '?')} partitions ({tcfg or 'default topic configs'}), "
              f"{cfg.get('record_size', '?')} B records, acks={cfg.get('acks', '?')}, asked {num(cfg.get('rate'), '{:,.0f}')} records/s "
              f"for {soak['seconds']:.0f} s, produce and consume at once: {soak['records_per_sec']:,.0f} records/s acknowledged, "
              f"{soak.get('consumed', 0):,} records consumed, {soak.get('errors', 0)} errors; whole run produce p99 {ms(soak, 'p99')} ms, "
              f"end-to-end p99 {num((soak.get('e2e_latency_ms') or {}).get('p99'), '{:.2f}')} ms. "
              "Each row is the interval ending at that second (latency of the records acknowledged in it; the row at 0 s is the broker before the load); RSS and descriptors are the broker's, disk the blocks allocated under its data dir.", "",
              "| elapsed s | produced/s | consumed/s | p50 ms | p99 ms | max ms | e2e p99 ms | RSS MiB | fds | disk MiB |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sm:
        lines.append(f"| {r['elapsed_s']:.0f} | {r['produced_per_sec']:,.0f} | {r['consumed_per_sec']:,.0f} | {num(r.get('produce_p50_ms'), '{:.2f}')} | "
                     f"{num(r.get('produce_p99_ms'), '{:.2f}')} | {num(r.get('produce_max_ms'), '{:.2f}')} | {num(r.get('e2e_p99_ms'), '{:.2f}')} | "
                     f"{num(mib(r.get('rss_kib')), '{:.1f}')} | {num(r.get('open_fds'), '{}')} | {num((r.get('disk_bytes') or 0) / 1048576 if r.get('disk_bytes') is not None else None, '{:.0f}')} |")
    facts = []
    rss = [(r["elapsed_s"], r["rss_kib"] / 1024) for r in sm if isinstance(r.get("rss_kib"), (int, float))]
    if rss:
        (t0, r0), (t1, r1) = rss[0], rss[-1]
        peak_t, peak = max(rss, key=lambda x: x[1])
        facts.append(f"RSS {r0:.1f} MiB at {t0:.0f} s → {r1:.1f} MiB at {t1:.0f} s, max {peak:.1f} MiB (first reached at {peak_t:.0f} s)")
        half = [x for x in rss if x[0] >= rss[-1][0] / 2]
        if len(half) >= 2 and half[-1][0] > half[0][0]:
            (h0, a), (h1, b) = half[0], half[-1]
            facts.append(f"over the last half ({h0:.0f} → {h1:.0f} s) RSS moved {b - a:+.1f} MiB ({(b - a) / (h1 - h0) * 60:+.2f} MiB/min)")
    fds = [r["open_fds"] for r in sm if isinstance(r.get("open_fds"), int)]
    if fds:
        facts.append(f"open descriptors {fds[0]} → {fds[-1]} (min {min(fds)}, max {max(fds)})")
    disk = [r["disk_bytes"] / 1048576 for r in sm if isinstance(r.get("disk_bytes"), (int, float))]
    if disk:
        facts.append(f"disk {disk[0]:.0f} → {disk[-1]:.0f} MiB (max {max(disk):.0f} MiB)")
    p99s = [(r["elapsed_s"], r["produce_p99_ms"]) for r in sm if isinstance(r.get("produce_p99_ms"), (int, float))]
    if p99s:
        worst_t, worst = max(p99s, key=lambda x: x[1])
        facts.append(f"interval p99 {p99s[0][1]:.2f} ms first, {p99s[-1][1]:.2f} ms last, highest {worst:.2f} ms (interval ending at {worst_t:.0f} s)")
    if facts:
        lines += ["", "Soak over time: " + "; ".join(facts) + "."]
text = "\n".join(lines)
open(os.path.join(out, "summary.md"), "w").write(text + "\n")
print(text)
if os.environ.get("UPDATE_DOCS") == "1":
    doc = "docs/benchmarks.md"
    s = open(doc).read()
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    if start in s and end in s:
        s = s[: s.index(start) + len(start)] + "\n" + text + "\n" + s[s.index(end):]
        open(doc, "w").write(s)
        print(f"updated {doc}")
    else:
        print(f"UPDATE_DOCS=1 but {doc} has no {start} ... {end} markers: nothing updated")
