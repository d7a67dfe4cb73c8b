#!/usr/bin/env bash
# Issue 14's benchmark, part of `make bench` (BENCH_PART=scale runs it alone):
#   one broker (--cores $SCALE_CORES), 8 partitions and then $SCALE_TOPICS x
#   $SCALE_PARTITIONS (100 x 100 = 10,000): create time, one acks=all record to every
#   partition, sustained acks=all produce at $SCALE_RATE records/s spread over all of
#   them (p99), RSS, open descriptors and allocated disk, and after SIGKILL the time
#   from restart until every partition serves its records again;
#   three brokers (--cores 1 each), the same two sizes with replication factor 3:
#   create to a full ISR, sustained acks=all produce at $SCALE_RF3_RATE records/s
#   (30,000: three brokers sharing this machine's cores do three times the work of
#   one, so about a third of one broker's rate is their bound here, issue 17), time
#   to new leaders for every
#   partition of a broker killed with SIGKILL, and to a full ISR after it returns.
# Each 10,000-partition figure is reported beside the 8-partition one of this run
# (bench_summary.py). Reports land in $OUT as scale-*-scale.json and *-resources.json.
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICE=${SLUICE_BIN:-./target/release/sluice}
BENCH_BIN=${SLUICE_BENCH_BIN:-./target/release/sluice-bench}
OUT=${OUT:-bench/results}
SECS=${BENCH_SECONDS:-10}
RATE=${SCALE_RATE:-100000}
RF3_RATE=${SCALE_RF3_RATE:-30000}
TOPICS=${SCALE_TOPICS:-100}
PARTS=${SCALE_PARTITIONS:-100}
CORES=${SCALE_CORES:-2}
PORT=${SCALE_PORT:-19500}
CLUSTER_PORT=${SCALE_CLUSTER_PORT:-19510}
mkdir -p "$OUT"
rm -f "$OUT"/scale-*.json

now_ms() { date +%s%3N; }

wait_port() { # port
  local deadline=$((SECONDS + 60))
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "bench-scale: nothing listens on $1 after 60 s" >&2; return 1; }
    sleep 0.1
  done
}

# Resident memory, open descriptors and allocated disk of brokers (pids) over their
# data dirs, summed, as $OUT/<name>-resources.json.
resources() { # name "pids" "dirs"
  local name=$1 rss=0 fds=0 disk=0 p d
  for p in $2; do
    rss=$((rss + $(awk '/^VmRSS/{print $2}' "/proc/$p/status")))
    fds=$((fds + $(ls "/proc/$p/fd" | wc -l)))
  done
  for d in $3; do disk=$((disk + $(du -sk "$d" | cut -f1))); done
  printf '{"name":"%s","rss_kb":%d,"open_fds":%d,"disk_kb":%d}\n' "$name" "$rss" "$fds" "$disk" >"$OUT/$name-resources.json"
  cat "$OUT/$name-resources.json"
}

single() { # label topics partitions
  local label=$1 topics=$2 parts=$3 dir="$OUT/scale-$1-data" pid t0
  local args=(--bootstrap "127.0.0.1:$PORT" --prefix "$label" --topics "$topics" --partitions "$parts" --report-dir "$OUT")
  rm -rf "$dir"
  echo "== scale: one broker, $topics x $parts partitions: create, one record each, $RATE records/s acks=all over all of them =="
  "$SLUICE" serve --listen "127.0.0.1:$PORT" --data-dir "$dir" --cores "$CORES" --metrics-listen off >"$OUT/scale-$label.log" 2>&1 &
  pid=$!
  wait_port "$PORT"
  "$BENCH_BIN" scale "${args[@]}" --name "scale-1b-$label" --phases create,one,sustain --rate "$RATE" --duration "$SECS" --acks -1
  resources "scale-1b-$label" "$pid" "$dir"
  kill -KILL "$pid"; wait "$pid" 2>/dev/null || true
  echo "== scale: one broker, $topics x $parts partitions: SIGKILL, restart, until every partition serves its records =="
  t0=$(now_ms)
  "$SLUICE" serve --listen "127.0.0.1:$PORT" --data-dir "$dir" --cores "$CORES" --metrics-listen off >>"$OUT/scale-$label.log" 2>&1 &
  pid=$!
  "$BENCH_BIN" scale "${args[@]}" --name "scale-1b-$label-restart" --phases verify --min-offset 1 --since-unix-ms "$t0" --timeout 300
  resources "scale-1b-$label-restart" "$pid" "$dir"
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

CDIR="$OUT/scale-cluster"
cluster() {
  CLUSTER_DIR="$CDIR" SLUICE_BIN="$SLUICE" KAFKA_PORT_BASE="$CLUSTER_PORT" START_TIMEOUT=120 \
    CONTROLLER_PORT_BASE=$((CLUSTER_PORT + 10)) SLUICE_EXTRA_FLAGS="--cores 1" \
    bash scripts/cluster.sh "$@"
}

replicated() { # label topics partitions
  local label=$1 topics=$2 parts=$3 t0 victim=2
  local args=(--bootstrap "127.0.0.1:$((CLUSTER_PORT + 1))" --prefix "$label" --topics "$topics" --partitions "$parts" --replication 3 --report-dir "$OUT")
  rm -rf "$CDIR"
  trap 'cluster stop >/dev/null 2>&1 || true' EXIT
  cluster start >/dev/null
  echo "== scale: 3 brokers, $topics x $parts partitions RF=3: create to a full ISR, one record each, $RF3_RATE records/s acks=all =="
  "$BENCH_BIN" scale "${args[@]}" --name "scale-rf3-$label" --phases create,one,sustain --rate "$RF3_RATE" --duration "$SECS" --acks -1 --timeout 300
  resources "scale-rf3-$label" "$(cat "$CDIR"/node-*.pid)" "$CDIR/node-1 $CDIR/node-2 $CDIR/node-3"
  echo "== scale: 3 brokers, $topics x $parts partitions RF=3: SIGKILL broker $victim, until every partition has a leader elsewhere =="
  t0=$(now_ms)
  kill -KILL "$(cat "$CDIR/node-$victim.pid")"
  "$BENCH_BIN" scale "${args[@]}" --name "scale-rf3-$label-failover" --phases verify --avoid-leader "$victim" --min-offset 1 --since-unix-ms "$t0" --timeout 300
  echo "== scale: 3 brokers, $topics x $parts partitions RF=3: broker $victim back, until every partition has 3 in-sync replicas =="
  t0=$(now_ms)
  cluster start >/dev/null
  "$BENCH_BIN" scale "${args[@]}" --name "scale-rf3-$label-rejoin" --phases verify --want-isr 3 --min-offset 1 --since-unix-ms "$t0" --timeout 300
  cluster stop >/dev/null; trap - EXIT
  rm -rf "$CDIR"
}

if [ "${SCALE_SINGLE:-1}" = 1 ]; then
  single p8 1 8
  single p10k "$TOPICS" "$PARTS"
fi
if [ "${SCALE_REPLICATED:-1}" = 1 ]; then
  replicated p8 1 8
  replicated p10k "$TOPICS" "$PARTS"
fi
