#!/usr/bin/env bash
# Issue 13: an alert sink that is down must not slow the broker. Two runs of the same
# fixed-rate acks=all produce against a fresh broker each, both with a consumer group
# that lags and an alert rule it breaches from the first lag sample: the baseline has
# no sink, the other --alert-webhook on a closed port, so every notice fails and is
# retried. Prints p50/p99/p99.9 of both and their ratios, and how many delivery
# attempts failed (none would make the comparison meaningless).
# Called by `make bench` (scripts/bench.sh); runs alone too. Results in $OUT/alert-sink-*.
# Every process it starts is stopped on any exit; each broker's ports (Kafka and
# metrics, BENCH_ALERT_PORT and + 1: the first free from 19492 unless set) are checked
# free before it starts and owned by it after (scripts/bench-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
bench_bins
OUT=${OUT:-bench/results}
SECS=${BENCH_SECONDS:-10}
RATE=${BENCH_ALERT_RATE:-50000}
bench_pick_port BENCH_ALERT_PORT 19492 0 1
PORT=$BENCH_ALERT_PORT
mkdir -p "$OUT"

run() { # name extra-flags...
  local name=$1; shift
  local data="$OUT/alert-sink-$name-data"
  rm -rf "$data"
  bench_require_free_ports "the broker" "$PORT" $((PORT + 1))
  bench_spawn "$SLUICE" serve --listen "127.0.0.1:$PORT" --data-dir "$data" --cores 1 \
    --metrics-listen "127.0.0.1:$((PORT + 1))" "$@" >"$OUT/alert-sink-$name.log" 2>&1
  local broker=$BENCH_PID
  bench_wait_broker "$broker" "$OUT/alert-sink-$name.log" 30 "$PORT" $((PORT + 1))
  # A group that lags from its first commit: committed offset 0 on a partition that
  # then receives the whole run.
  bench_run python3 - "$PORT" <<'PY'
import sys
from confluent_kafka import Consumer, Producer, TopicPartition
addr = f"127.0.0.1:{sys.argv[1]}"
p = Producer({"bootstrap.servers": addr})
p.produce("alert-bench", b"x", partition=0)
assert p.flush(30) == 0
c = Consumer({"bootstrap.servers": addr, "group.id": "lagging", "enable.auto.commit": False})
c.commit(offsets=[TopicPartition("alert-bench", 0, 0)], asynchronous=False)
c.close()
PY
  # Its output goes to a file first: run alone (not in a pipeline), a signal stops it.
  bench_run "$BENCH_BIN" produce --bootstrap "127.0.0.1:$PORT" --report-dir "$OUT" --name "alert-sink-$name" \
    --topic alert-bench --partitions 1 --record-size 100 --acks -1 --rate "$RATE" --linger-ms 1 \
    --batch-bytes 32768 --duration "$SECS" >"$OUT/alert-sink-$name-bench.txt"
  grep -A1 "latency (ms)" "$OUT/alert-sink-$name-bench.txt" | tail -1
  echo "failed webhook attempts: $(grep -c 'alert sink unreachable' "$OUT/alert-sink-$name.log" || true)"
  bench_check_owner "$broker" "$PORT" $((PORT + 1))
  bench_stop "$broker"
}

echo "== alert sink down: fixed $RATE records/s acks=all with a lagging group and a firing lag alert, without a sink, then with a webhook on a closed port =="
ALERTING=(--alert-lag-records 1 --alert-for-ms 0 --alert-repeat-ms 1000 --lag-sample-interval-ms 200)
run baseline "${ALERTING[@]}"
run sink-down "${ALERTING[@]}" --alert-webhook "http://127.0.0.1:9/alerts"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
r = {n: json.load(open(f"{out}/alert-sink-{n}-report.json")) for n in ("baseline", "sink-down")}
lat = lambda n, k: r[n]["latency_ms"][k]
for k in ("p50", "p99", "p999"):
    print(f"{k}: baseline {lat('baseline', k):.3f} ms, sink down {lat('sink-down', k):.3f} ms, ratio {lat('sink-down', k) / lat('baseline', k):.2f}x")
PY
