#!/usr/bin/env bash
# Issue 14's benchmark, part of `make bench` (BENCH_PART=scale runs it alone):
#   one broker (--cores $SCALE_CORES), 8 partitions and then $SCALE_TOPICS x
#   $SCALE_PARTITIONS (100 x 100 = 10,000): create time, one acks=all record to every
#   partition, sustained acks=all produce at $SCALE_RATE records/s spread over all of
#   them (p99), RSS, open descriptors and allocated disk, and after SIGKILL the time
#   from restart until every partition serves its records again; then (issue 40) the
#   same at $SCALE_FULL_RATE records/s (1,000,000: the design's per-broker rate) and
#   confluent-kafka at $SCALE_RDKAFKA_RATE records/s (scripts/bench_scale_rdkafka.py),
#   and for every sustained load the bytes written to the device (*-device.json);
#   three brokers (--cores 1 each), the same two sizes with replication factor 3:
#   create to a full ISR, sustained acks=all produce at $SCALE_RF3_RATE records/s
#   (30,000: three brokers sharing this machine's cores do three times the work of
#   one, so about a third of one broker's rate is their bound here, issue 17), time
#   to new leaders for every
#   partition of a broker killed with SIGKILL, and to a full ISR after it returns.
# Each 10,000-partition figure is reported beside the 8-partition one of this run
# (bench_summary.py). Reports land in $OUT as scale-*-scale.json and *-resources.json.
# Every process it starts is stopped on any exit, its ports are checked free before a
# broker starts and owned by that broker after (scripts/bench-lib.sh). SCALE_PORT and
# SCALE_CLUSTER_PORT choose the ports; unset, the first free ones from 19500 and 19510.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
bench_bins
OUT=${OUT:-bench/results}
SECS=${BENCH_SECONDS:-10}
RATE=${SCALE_RATE:-100000}
RF3_RATE=${SCALE_RF3_RATE:-30000}
# Issue 40's further single-broker loads: the design's per-broker rate, and the
# client most users run (confluent-kafka, librdkafka) at its defaults plus linger.ms=5.
FULL_RATE=${SCALE_FULL_RATE:-1000000}
RDKAFKA_RATE=${SCALE_RDKAFKA_RATE:-50000}
TOPICS=${SCALE_TOPICS:-100}
PARTS=${SCALE_PARTITIONS:-100}
CORES=${SCALE_CORES:-2}
mkdir -p "$OUT"
rm -f "$OUT"/scale-*.json

now_ms() { date +%s%3N; }

# Bytes written to the block device that holds $OUT (/proc/diskstats, sectors of 512
# bytes): read before and after a sustained load, beside the bytes it acknowledged.
# Whatever else writes to that device meanwhile counts too (this machine runs
# nothing else heavy during `make bench`).
DEV=$(basename "$(df --output=source "$OUT" | tail -1)")
device_bytes() { local s; s=$(awk -v d="$DEV" '$3 == d { print $10 }' /proc/diskstats); [ -n "$s" ] && echo $((s * 512)); }
# Runs a sustain phase (args after the report name) and writes the device bytes it
# caused to $OUT/<name>-device.json.
sustain_measured() { # name args...
  local name=$1 w0 w1
  shift
  w0=$(device_bytes)
  bench_run "$BENCH_BIN" scale "$@" --name "$name" --phases sustain
  w1=$(device_bytes)
  if [ -n "$w0" ] && [ -n "$w1" ]; then
    echo "{\"device\": \"$DEV\", \"device_bytes\": $((w1 - w0))}" >"$OUT/$name-device.json"
  fi
}

# Resident memory, open descriptors and allocated disk of brokers (pids) over their
# data dirs, summed, as $OUT/<name>-resources.json.
resources() { # name "pids" "dirs"
  bench_resources "$OUT/$1-resources.json" "$@"
}

# Starts the single broker (its metrics are off: only its Kafka port to check), its
# output appended to $OUT/scale-<label>.log; the pid is left in BENCH_PID.
serve() { # label dir
  bench_require_free_ports "the single broker's Kafka port" "$PORT"
  bench_spawn "$SLUICE" serve --listen "127.0.0.1:$PORT" --data-dir "$2" --cores "$CORES" --metrics-listen off >>"$OUT/scale-$1.log" 2>&1
}

single() { # label topics partitions
  local label=$1 topics=$2 parts=$3 dir="$OUT/scale-$1-data" pid t0
  local args=(--bootstrap "127.0.0.1:$PORT" --prefix "$label" --topics "$topics" --partitions "$parts" --report-dir "$OUT")
  rm -rf "$dir"
  : >"$OUT/scale-$label.log"
  echo "== scale: one broker, $topics x $parts partitions: create, one record each, $RATE records/s acks=all over all of them =="
  serve "$label" "$dir"
  pid=$BENCH_PID
  bench_wait_broker "$pid" "$OUT/scale-$label.log" 60 "$PORT"
  bench_run "$BENCH_BIN" scale "${args[@]}" --name "scale-1b-$label-setup" --phases create,one --acks -1
  sustain_measured "scale-1b-$label" "${args[@]}" --rate "$RATE" --duration "$SECS" --acks -1
  bench_check_owner "$pid" "$PORT"
  resources "scale-1b-$label" "$pid" "$dir"
  echo "== scale: one broker, $topics x $parts partitions: $FULL_RATE records/s acks=all =="
  sustain_measured "scale-1b-$label-full" "${args[@]}" --rate "$FULL_RATE" --duration "$SECS" --acks -1
  echo "== scale: one broker, $topics x $parts partitions: confluent-kafka, $RDKAFKA_RATE records/s acks=all, linger.ms=5 =="
  bench_run python3 scripts/bench_scale_rdkafka.py --bootstrap "127.0.0.1:$PORT" --prefix "$label" --topics "$topics" \
    --partitions "$parts" --rate "$RDKAFKA_RATE" --seconds "$SECS" --out "$OUT/scale-1b-$label-rdkafka.json"
  bench_check_owner "$pid" "$PORT"
  bench_kill "$pid"
  echo "== scale: one broker, $topics x $parts partitions: SIGKILL, restart, until every partition serves its records =="
  bench_require_free_ports "the single broker's Kafka port" "$PORT"
  t0=$(now_ms)
  serve "$label" "$dir"
  pid=$BENCH_PID
  # The restart is timed from t0 by the verify phase itself; which broker answered is
  # checked right after it.
  bench_run "$BENCH_BIN" scale "${args[@]}" --name "scale-1b-$label-restart" --phases verify --min-offset 1 --since-unix-ms "$t0" --timeout 300
  bench_check_owner "$pid" "$PORT"
  resources "scale-1b-$label-restart" "$pid" "$dir"
  bench_stop "$pid"
  rm -rf "$dir"
}

CDIR="$OUT/scale-cluster"
cluster() {
  BENCH_RUN_GRACE=60 bench_run env CLUSTER_DIR="$CDIR" SLUICE_BIN="$SLUICE" KAFKA_PORT_BASE="$CLUSTER_PORT" START_TIMEOUT=120 \
    CONTROLLER_PORT_BASE=$((CLUSTER_PORT + 10)) SLUICE_EXTRA_FLAGS="--cores 1" \
    bash scripts/cluster.sh "$@"
}
cluster_stop_quiet() { cluster stop >/dev/null 2>&1 || true; }
# Kafka, controller and metrics ports of broker n (scripts/cluster.sh's layout).
node_ports() { echo $((CLUSTER_PORT + $1)) $((CLUSTER_PORT + 10 + $1)) $((CLUSTER_PORT + 552 + $1)); }
# After `cluster start`: track each broker's pid (so that any exit stops it) and check
# that it, and nothing else, listens on its three ports.
CLUSTER_PIDS=()
track_cluster() {
  local n pid
  CLUSTER_PIDS=()
  for n in 1 2 3; do
    pid=$(cat "$CDIR/node-$n.pid")
    bench_track "$pid"
    CLUSTER_PIDS+=("$pid")
    # shellcheck disable=SC2046 # three ports
    bench_wait_broker "$pid" "$CDIR/node-$n.log" 30 $(node_ports "$n")
  done
}

replicated() { # label topics partitions
  local label=$1 topics=$2 parts=$3 t0 victim=2 vpid
  local args=(--bootstrap "127.0.0.1:$((CLUSTER_PORT + 1))" --prefix "$label" --topics "$topics" --partitions "$parts" --replication 3 --report-dir "$OUT")
  rm -rf "$CDIR"
  # shellcheck disable=SC2046
  bench_require_free_ports "the 3-broker cluster" $(node_ports 1) $(node_ports 2) $(node_ports 3)
  cluster start >/dev/null
  track_cluster
  echo "== scale: 3 brokers, $topics x $parts partitions RF=3: create to a full ISR, one record each, $RF3_RATE records/s acks=all =="
  bench_run "$BENCH_BIN" scale "${args[@]}" --name "scale-rf3-$label-setup" --phases create,one --acks -1 --timeout 300
  sustain_measured "scale-rf3-$label" "${args[@]}" --rate "$RF3_RATE" --duration "$SECS" --acks -1 --timeout 300
  resources "scale-rf3-$label" "$(cat "$CDIR"/node-*.pid)" "$CDIR/node-1 $CDIR/node-2 $CDIR/node-3"
  echo "== scale: 3 brokers, $topics x $parts partitions RF=3: SIGKILL broker $victim, until every partition has a leader elsewhere =="
  vpid=$(cat "$CDIR/node-$victim.pid")
  t0=$(now_ms)
  bench_kill "$vpid"
  bench_run "$BENCH_BIN" scale "${args[@]}" --name "scale-rf3-$label-failover" --phases verify --avoid-leader "$victim" --min-offset 1 --since-unix-ms "$t0" --timeout 300
  echo "== scale: 3 brokers, $topics x $parts partitions RF=3: broker $victim back, until every partition has 3 in-sync replicas =="
  # shellcheck disable=SC2046
  bench_require_free_ports "broker $victim of the cluster" $(node_ports "$victim")
  t0=$(now_ms)
  cluster start >/dev/null
  vpid=$(cat "$CDIR/node-$victim.pid")
  bench_track "$vpid"
  CLUSTER_PIDS+=("$vpid")
  bench_run "$BENCH_BIN" scale "${args[@]}" --name "scale-rf3-$label-rejoin" --phases verify --want-isr 3 --min-offset 1 --since-unix-ms "$t0" --timeout 300
  # shellcheck disable=SC2046
  bench_check_owner "$vpid" $(node_ports "$victim")
  cluster stop >/dev/null
  for vpid in "${CLUSTER_PIDS[@]}"; do bench_stop "$vpid"; done # gone by now: untracks them
  rm -rf "$CDIR"
}

if [ "${SCALE_SINGLE:-1}" = 1 ]; then
  bench_pick_port SCALE_PORT 19500 0
  PORT=$SCALE_PORT
  single p8 1 8
  single p10k "$TOPICS" "$PARTS"
fi
if [ "${SCALE_REPLICATED:-1}" = 1 ]; then
  bench_pick_port SCALE_CLUSTER_PORT 19510 1 2 3 11 12 13 553 554 555
  CLUSTER_PORT=$SCALE_CLUSTER_PORT
  bench_on_cleanup cluster_stop_quiet
  replicated p8 1 8
  replicated p10k "$TOPICS" "$PARTS"
fi
