#!/usr/bin/env bash
# shellcheck disable=SC2086 # $C is a list of flags, split on purpose
# Issue 41's benchmark, part of `make bench` (BENCH_PART=move runs it alone): produce
# latency while a partition's data moves between brokers. Three brokers (--cores
# $MOVE_CORES each, scripts/cluster.sh on the bench's own ports), a partition holding
# $MOVE_BYTES (1 GiB) of 1 KiB records on broker 1 alone, and an acks=all producer at
# $MOVE_RATE records/s of 100 B over 8 partitions with replication factor 3 for
# $BENCH_SECONDS each:
#   (m0) with no move,
#   (m1) while the partition moves to broker 2 at full speed (sluice cluster reassign),
#   (m2) while it moves on to broker 3 with broker 3's
#        follower.replication.throttled.rate at $MOVE_THROTTLE bytes/s and the topic's
#        follower.replication.throttled.replicas naming it.
# Then (roll) a rolling restart of the three brokers under confluent-kafka at its
# defaults: the longest delivery and the failed ones ($OUT/move-rolling.json).
# Reports: $OUT/move-m{0,1,2}-*-report.json (sluice-bench produce) and
# $OUT/move-times.json (bytes moved, each move's duration); bench_summary.py puts each
# p99 beside m0's. A move still running when its load ends is waited for (its time
# covers the whole move). Every process it starts is stopped on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
bench_bins
OUT=${OUT:-bench/results}
SECS=${BENCH_SECONDS:-10}
RATE=${MOVE_RATE:-30000}
BYTES=${MOVE_BYTES:-1073741824}
THROTTLE=${MOVE_THROTTLE:-52428800}
CORES=${MOVE_CORES:-1}
mkdir -p "$OUT"
rm -f "$OUT"/move-*.json

CDIR="$OUT/move-cluster"
rm -rf "$CDIR"
bench_pick_port BENCH_MOVE_PORT 19700 1 2 3 11 12 13 553 554 555
P=$BENCH_MOVE_PORT
cluster() {
  BENCH_RUN_GRACE=60 bench_run env CLUSTER_DIR="$CDIR" SLUICE_BIN="$SLUICE" KAFKA_PORT_BASE="$P" \
    CONTROLLER_PORT_BASE=$((P + 10)) SLUICE_EXTRA_FLAGS="--cores $CORES" bash scripts/cluster.sh "$@"
}
cluster_stop_quiet() { cluster stop >/dev/null 2>&1 || true; rm -rf "$CDIR"; }
bench_on_cleanup cluster_stop_quiet
bench_require_free_ports "the move benchmark's cluster" $((P + 1)) $((P + 2)) $((P + 3)) \
  $((P + 11)) $((P + 12)) $((P + 13)) $((P + 553)) $((P + 554)) $((P + 555))
cluster start >/dev/null
PIDS=()
for n in 1 2 3; do
  pid=$(cat "$CDIR/node-$n.pid")
  bench_track "$pid"
  PIDS+=("$pid")
  bench_wait_broker "$pid" "$CDIR/node-$n.log" 30 $((P + n)) $((P + 10 + n)) $((P + 552 + n))
done
BOOT="127.0.0.1:$((P + 1))"
C="--bootstrap $BOOT --report-dir $OUT --replication-factor 3"
for pid in "${PIDS[@]}"; do C="$C --cpu-pid $pid"; done

# The data to move: one partition on broker 1 alone, filled with 1 KiB records.
admin() { python3 - "$BOOT" "$@"; }
echo "== move: filling one partition on broker 1 with $BYTES bytes =="
admin "$BYTES" <<'PY'
import sys, time
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
boot, total = sys.argv[1], int(sys.argv[2])
a = AdminClient({"bootstrap.servers": boot})
a.create_topics([NewTopic("bench-move-data", 1, replica_assignment=[[1]])])["bench-move-data"].result(30)
p = Producer({"bootstrap.servers": boot, "acks": 1, "linger.ms": 20, "batch.size": 1048576,
              "compression.type": "none", "queue.buffering.max.kbytes": 1048576})
value = b"m" * 1024
t0 = time.monotonic()
for i in range(total // 1024):
    while True:
        try:
            p.produce("bench-move-data", value, partition=0)
            break
        except BufferError:
            p.poll(0.01)
assert p.flush(300) == 0
print(f"filled {total} bytes in {time.monotonic() - t0:.1f} s")
PY

bench() { bench_run "$BENCH_BIN" "$@"; }
load() { # name
  bench produce $C --name "$1" --topic bench-move-load --partitions 8 --record-size 100 --acks -1 \
    --rate "$RATE" --linger-ms 1 --batch-bytes 32768 --duration "$SECS"
}
now_ms() { date +%s%3N; }
# Moves bench-move-data-0 to $1 in the background (`reassign --wait`), writing the
# move's duration in ms to $2 once it completed.
move() { # replicas file
  local t0
  t0=$(now_ms)
  ( "$SLUICE" cluster reassign --bootstrap-server "$BOOT" --partition bench-move-data:0 --replicas "$1" \
      --wait --timeout 1800 >/dev/null && echo $(($(now_ms) - t0)) >"$2" ) &
  MOVE_WAITER=$!
}

echo "== (m0) acks=all 100 B at $RATE records/s, 8 partitions RF=3, no move =="
bench produce $C --name move-warmup --topic bench-move-load --partitions 8 --record-size 100 --acks -1 \
  --rate "$RATE" --linger-ms 1 --batch-bytes 32768 --duration 2 >/dev/null
load move-m0-none
echo "== (m1) the same while $BYTES bytes move from broker 1 to broker 2, unthrottled =="
move 1,2 "$OUT/move-m1.ms"
load move-m1-unthrottled
wait "$MOVE_WAITER"
echo "moved in $(cat "$OUT/move-m1.ms") ms"
echo "== (m2) the same while they move on to broker 3, throttled at $THROTTLE bytes/s =="
admin "$THROTTLE" <<'PY'
import sys
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
a = AdminClient({"bootstrap.servers": sys.argv[1]})
for r in (ConfigResource(ResourceType.BROKER, "3", incremental_configs=[ConfigEntry(
              "follower.replication.throttled.rate", sys.argv[2], incremental_operation=AlterConfigOpType.SET)]),
          ConfigResource(ResourceType.TOPIC, "bench-move-data", incremental_configs=[ConfigEntry(
              "follower.replication.throttled.replicas", "0:3", incremental_operation=AlterConfigOpType.SET)])):
    a.incremental_alter_configs([r])[r].result(30)
PY
move 2,3 "$OUT/move-m2.ms"
load move-m2-throttled
wait "$MOVE_WAITER"
echo "moved in $(cat "$OUT/move-m2.ms") ms"
# A rolling restart under a real client (confluent-kafka at its defaults, acks=all,
# ROLL_RATE records/s): each broker in turn gets SIGTERM (a controlled shutdown), is
# started again, and the next waits until no partition is under-replicated. The
# longest delivery (the longest stall a producer saw) and the failed deliveries.
echo "== (roll) rolling restart of the three brokers under a confluent-kafka producer =="
ROLL_RATE=${ROLL_RATE:-2000}
python3 - "$BOOT" "$ROLL_RATE" "$OUT/move-rolling.json" "$CDIR" "$SLUICE" <<'PY' &
import json, sys, threading, time
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
boot, rate, out, cdir, sluice = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
admin = AdminClient({"bootstrap.servers": boot})
admin.create_topics([NewTopic("bench-roll", 6, 3, config={"min.insync.replicas": "2"})])["bench-roll"].result(30)
p = Producer({"bootstrap.servers": boot})
lat, failed, done = [], [], threading.Event()
def report(err, msg):
    (failed.append(err.code()) if err else lat.append(msg.latency()))
def run():
    i, t0 = 0, time.monotonic()
    while not done.is_set():
        if i < (time.monotonic() - t0) * rate:
            try:
                p.produce("bench-roll", b"r" * 100, partition=i % 6, on_delivery=report)
                i += 1
            except BufferError:
                pass
        p.poll(0.001)
t = threading.Thread(target=run)
t.start()
open(out + ".ready", "w").close()
while not __import__("os").path.exists(out + ".stop"):
    time.sleep(0.1)
done.set()
t.join()
p.flush(60)
json.dump({"acked": len(lat), "failed": len(failed), "max_ms": max(lat) * 1000 if lat else None,
           "p99_ms": sorted(lat)[int(len(lat) * 0.99)] * 1000 if lat else None, "rate": rate}, open(out, "w"))
PY
ROLLER=$!
for _ in $(seq 300); do [ -e "$OUT/move-rolling.json.ready" ] && break; sleep 0.1; done
sleep 2
for n in 1 2 3; do
  pid=$(cat "$CDIR/node-$n.pid")
  kill -TERM "$pid"
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  cluster start >/dev/null
  newpid=$(cat "$CDIR/node-$n.pid")
  bench_track "$newpid"
  PIDS[$((n - 1))]=$newpid
  for _ in $(seq 600); do
    "$SLUICE" cluster describe --bootstrap-server "$BOOT" 2>/dev/null | grep -q "^Under-replicated partitions (0)" && break
    sleep 0.2
  done
done
sleep 2
touch "$OUT/move-rolling.json.stop"
wait "$ROLLER"
rm -f "$OUT"/move-rolling.json.ready "$OUT"/move-rolling.json.stop
cat "$OUT/move-rolling.json"; echo

cat >"$OUT/move-times.json" <<EOF
{"bytes": $BYTES, "rate": $RATE, "throttle_bytes_per_sec": $THROTTLE, "seconds": $SECS,
 "unthrottled_ms": $(cat "$OUT/move-m1.ms"), "throttled_ms": $(cat "$OUT/move-m2.ms")}
EOF
rm -f "$OUT"/move-m?.ms
for n in 1 2 3; do
  bench_check_owner "${PIDS[$((n - 1))]}" $((P + n)) $((P + 10 + n)) $((P + 552 + n))
done
cluster stop >/dev/null
for pid in "${PIDS[@]}"; do bench_stop "$pid"; done
rm -rf "$CDIR"
