#!/usr/bin/env bash
# shellcheck disable=SC2086 # $b is a list of flags, split on purpose
# A/B benchmark of two broker builds in one run, for changes that must not cost speed
# (e.g. a refactor): scenarios (a) 100 B acks=1 max throughput, (b) 100 B acks=1 at a
# fixed 1M records/s and (c) 1 KiB acks=all, against each binary in turn, ROUNDS times
# interleaved (A B, B A, A B, ...) so that drift of the shared machine and the order within
# a round hit both alike.
# Prints a table of medians and B/A ratios, beside the machine's O_DIRECT ceiling
# measured in the same run.
#   usage: scripts/bench-ab.sh A_BIN B_BIN        (e.g. a build of the parent commit,
#          and ./target/release/sluice)
#   env: ROUNDS (3), BENCH_SECONDS (8), BENCH_PORT (the first free from 19492, with
#        its metrics port + 552), BROKER_CORES (1), SLUICE_BENCH_BIN
# Every process it starts is stopped on any exit; each broker's ports are checked free
# before it starts and owned by it after (scripts/bench-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
[ $# -eq 2 ] || bench_die "usage: scripts/bench-ab.sh A_BIN B_BIN"
A=$1
B=$2
ROUNDS=${ROUNDS:-3}
SECS=${BENCH_SECONDS:-8}
CORES=${BROKER_CORES:-1}
BENCH_BIN=${SLUICE_BENCH_BIN:-./target/release/sluice-bench}
bench_require_bins "$A" "$B" "$BENCH_BIN"
bench_pick_port BENCH_PORT 19492 0 552
PORT=$BENCH_PORT
OUT=bench/results/ab
rm -rf "$OUT"
mkdir -p "$OUT"
NICE=()
if [ "$(id -u)" = 0 ]; then NICE=(nice -n -10); fi
bench_run "$BENCH_BIN" ceiling --seconds 3 --dir "$OUT/ceiling-data" --report-dir "$OUT" >/dev/null

run_one() { # label binary round
  local label=$1 bin=$2 round=$3 data="$OUT/data-$1-$3"
  # Kafka port and the default metrics port (+ 552).
  bench_require_free_ports "broker $label" "$PORT" $((PORT + 552))
  bench_spawn "${NICE[@]}" "$bin" serve --listen "127.0.0.1:$PORT" --data-dir "$data" --cores "$CORES" >"$OUT/broker-$label-$round.log" 2>&1
  local pid=$BENCH_PID
  bench_wait_broker "$pid" "$OUT/broker-$label-$round.log" 30 "$PORT" $((PORT + 552))
  local b="--bootstrap 127.0.0.1:$PORT --report-dir $OUT"
  bench_run "${NICE[@]}" "$BENCH_BIN" produce $b --name "a-$label-$round" --topic a --partitions 8 --record-size 100 --acks 1 --duration "$SECS" >/dev/null
  bench_run "${NICE[@]}" "$BENCH_BIN" produce $b --name "b-$label-$round" --topic b --partitions 8 --record-size 100 --acks 1 --rate 1000000 --linger-ms 1 --batch-bytes 32768 --duration "$SECS" >/dev/null
  bench_run "${NICE[@]}" "$BENCH_BIN" produce $b --name "c-$label-$round" --topic c --partitions 8 --record-size 1024 --acks -1 --duration "$SECS" >/dev/null
  bench_check_owner "$pid" "$PORT"
  bench_stop "$pid"
  rm -rf "$data"
}

# A B, B A, A B, ...: the build that runs second in a round was measured faster (a
# position effect of this VM, about 5-10% on (a) and (c), issue 39's A/B), so each
# build runs first in half the rounds.
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then
    echo "== round $round: A =="; run_one A "$A" "$round"
    echo "== round $round: B =="; run_one B "$B" "$round"
  else
    echo "== round $round: B =="; run_one B "$B" "$round"
    echo "== round $round: A =="; run_one A "$A" "$round"
  fi
done

python3 - "$OUT" "$ROUNDS" "$A" "$B" <<'PY'
import json, os, statistics, sys
out, rounds, a_bin, b_bin = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def rep(name):
    return json.load(open(os.path.join(out, f"{name}-report.json")))
ceil = json.load(open(os.path.join(out, "ceiling-report.json")))
disk = ceil.get("odirect_write_mb_per_sec") or 0
print(f"A = {a_bin}\nB = {b_bin}\nmedians of {rounds} interleaved rounds; O_DIRECT write ceiling {disk:.0f} MB/s\n")
print("| scenario | A records/s | B records/s | B/A | A p99 ms | B p99 ms | B/A p99 | B MB/s vs disk |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
names = {"a": "(a) 100 B acks=1 max", "b": "(b) 100 B acks=1 at 1M/s", "c": "(c) 1 KiB acks=all"}
for s, label in names.items():
    med = {}
    for who in "AB":
        rs = [rep(f"{s}-{who}-{r}") for r in range(1, rounds + 1)]
        med[who] = (statistics.median(r["records_per_sec"] for r in rs),
                    statistics.median(r["latency_ms"]["p99"] for r in rs),
                    statistics.median(r["mb_per_sec"] for r in rs))
    (ar, ap, _), (br, bp, bm) = med["A"], med["B"]
    print(f"| {label} | {ar:,.0f} | {br:,.0f} | {br / ar:.2f} | {ap:.2f} | {bp:.2f} | {bp / ap:.2f} | {bm / disk * 100:.0f}% |")
PY
