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
add("(c) produce 1 KiB, acks=all", load("c-1k-acks-all-report.json"), "disk write", disk)
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
    f"Ceilings measured in the same run: O_DIRECT sequential write {disk:.0f} MB/s, loopback TCP {net:.0f} MB/s.",
    "",
    "| scenario | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | max ms | ratio |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
] + rows
if g:
    r = g["result"]
    lines += ["", f"Consumer groups: {g['config']['members']:,} lightweight members, {g['config']['partitions']:,} partitions: every member stable with its assignment {r['join_ms'] / 1000:.2f} s after the first JoinGroup (3 s of it is the initial rebalance delay); rebalance after one member leaves {r['rebalance_after_leave_ms']:.0f} ms (target: well under 30 s)."]
st = load("storage-report.json")
if st:
    c = st["ceilings"]
    lines += ["", f"Storage (`sluice-bench storage`, one partition, {st['appenders']} concurrent appenders, {st['seconds_per_scenario']:.0f} s each; ceiling: raw O_DIRECT 1 MiB writes {c['raw_odirect_write_mb_per_sec']:.0f} MB/s, raw 4 KiB write + fdatasync p50 {c['raw_fdatasync_us']['p50']} µs / p99 {c['raw_fdatasync_us']['p99']} µs; latency is append to acknowledgement — durable for `always`):", "",
              "| scenario | MB/s | batches/s | p50 µs | p99 µs | p99.9 µs | ratio to raw write |", "|---|---:|---:|---:|---:|---:|---:|"]
    for x in st["results"]:
        l = x["latency_us"]
        lines.append(f"| {x['scenario']} | {x['mb_per_sec']:.0f} | {x['batches_per_sec']:.0f} | {l['p50']} | {l['p99']} | {l['p999']} | {x['ratio_of_raw_write'] * 100:.0f}% |")
if b:
    target = b["config"].get("rate")
    lines += ["", f"(b) asked for {target:,.0f} records/s and achieved {b['records_per_sec']:,.0f}; produce p99 {ms(b, 'p99')} ms (target < 10 ms)."]
text = "\n".join(lines)
open(os.path.join(out, "summary.md"), "w").write(text + "\n")
print(text)
if os.environ.get("UPDATE_DOCS") == "1":
    doc = "docs/architecture.md"
    s = open(doc).read()
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    if start in s and end in s:
        s = s[: s.index(start) + len(start)] + "\n" + text + "\n" + s[s.index(end):]
        open(doc, "w").write(s)
        print(f"updated {doc}")
