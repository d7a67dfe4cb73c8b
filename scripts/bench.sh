#!/usr/bin/env bash
# shellcheck disable=SC2086 # $B, $C, $b, $args and $1 of rf_scenarios are lists of flags, split on purpose
# `make bench`: the canonical scenarios against a local broker, each beside the
# machine's own ceiling measured in the same run. Results land in bench/results/
# (git-ignored); the summary table is bench/results/summary.md, and with
# UPDATE_DOCS=1 it also replaces the figures in docs/benchmarks.md.
# BENCH_PART=replication runs only the RF=3 part (its single-broker baselines and the
# 3-broker cluster), e.g. to check it alone; BENCH_PART=txn only the ceilings and the
# exactly-once scenarios with their plain baseline (c, c-idem, c-txn, ctp). The
# summary then has only those rows, and the docs are left alone unless UPDATE_DOCS=1.
# BENCH_PART=scale runs only the many-partitions scenarios (scripts/bench-scale.sh).
# BENCH_PART=move runs only the partition-move scenarios (scripts/bench-move.sh).
# BENCH_PART=tiered runs only the tiered storage scenarios (scripts/bench-tiered.sh).
# BENCH_PART=groups runs only the consumer-group scenarios of both protocols (classic and
# KIP-848) at 1,000 and 10,000 members.
# BENCH_PART=tls runs only (b), (b) over TLS to an SSL listener (b-tls, issue 42) and
# (b) over SASL_SSL (b-sasl).
# BENCH_PART=soak runs only the soak (last in a full run): SOAK_SECONDS (default 180)
# of produce + consume, acks=all, at SOAK_RATE records/s (default 100000) of
# SOAK_RECORD_SIZE bytes (default 100; 1024 at SOAK_RATE=200000 is issue 17's 200 MB/s
# soak) on its own broker, a row every SOAK_SAMPLE s (default 15) with the broker's RSS, open
# descriptors and allocated disk beside the interval's rates and latency.
# BENCH_OUT puts the results elsewhere than bench/results.
# Each scenario's topic is deleted once it is measured (sluice-bench --delete-topic;
# bench-a after (d) reads it): kept, the single broker's topics grew to 62 GB on a
# fast day (1 GB/s for 10 s per 1 KiB scenario) and filled the disk, so the last RF=3
# scenario's appends were refused (KAFKA_STORAGE_ERROR below the free-space floor).
# scripts/bench-alert-sink.sh alone runs only the alert-sink-down comparison.
# Every process it starts is stopped on any exit (Ctrl-C included), each broker's ports
# are checked free before it starts and owned by it after (scripts/bench-lib.sh).
# BENCH_PORT, BENCH_CLUSTER_PORT and BENCH_SOAK_PORT choose the ports; unset, the
# first free ones from their defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
bench_bins
OUT=${BENCH_OUT:-bench/results}
SECS=${BENCH_SECONDS:-10}
CORES=${BROKER_CORES:-1}
RATE=${BENCH_RATE:-1000000}
LOW_RATE=${BENCH_LOW_RATE:-20000}
PART=${BENCH_PART:-all}
# RF=3 scenarios: Kafka ports CLUSTER_PORT+1..3, controllers CLUSTER_PORT+11..13,
# metrics CLUSTER_PORT+553..555 (BENCH_CLUSTER_PORT, from 19400).
# Fixed rate of the RF=3 open-loop runs and their single-broker baselines: 100,000
# records/s of 100 B (10 MB/s). The three brokers and the load generator share the
# machine's 2 cores, and every record is written three times and shipped twice over
# loopback by follower fetches, so the brokers do ~3x the work of scenario (b) while
# sharing both cores with the generator (in (b) the broker had one to itself): 1/10 of (b)'s
# rate keeps the CPUs from saturating, so the latency measured is the replication
# round trip (follower fetch, high-watermark advance) rather than run-queue waits.
# The max-throughput runs show where the saturated cluster ends up.
RF_RATE=${BENCH_RF_RATE:-100000}
# The machine is shared: run the broker and the load generator at a raised CPU
# priority when allowed, so that unrelated jobs disturb the latency tail less.
NICE=()
if [ "$(id -u)" = 0 ] && [ "${BENCH_NICE:-1}" = 1 ]; then NICE=(nice -n -10); fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.hgrm "$OUT"/*.svg
rm -rf "$OUT"/groups-*

if [ "$PART" = all ] || [ "$PART" = txn ]; then
echo "== machine ceilings =="
bench_run "$BENCH_BIN" ceiling --seconds 3 --dir "$OUT/ceiling-data" --report-dir "$OUT"
fi

if [ "$PART" = all ]; then
echo "== storage: partition log append path vs raw O_DIRECT write and fdatasync =="
bench_run "$BENCH_BIN" storage --seconds "${STORAGE_SECONDS:-3}" --dir "$OUT/storage-data" --report-dir "$OUT"
fi

bench() { bench_run "${NICE[@]}" "$BENCH_BIN" "$@"; }

# The soak alone needs none of the shared broker's scenarios.
if [ "$PART" != soak ] && [ "$PART" != move ]; then
# Its Kafka port (BENCH_PORT, from 19392) and its default metrics port, + 552.
bench_pick_port BENCH_PORT 19392 0 552
PORT=$BENCH_PORT
DATA="$OUT/broker-data"
rm -rf "$DATA"
bench_require_free_ports "the broker" "$PORT" $((PORT + 552))
bench_spawn "${NICE[@]}" "$SLUICE" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA" --cores "$CORES" >"$OUT/broker.log" 2>&1
BROKER=$BENCH_PID
bench_wait_broker "$BROKER" "$OUT/broker.log" 30 "$PORT" $((PORT + 552))
B="--bootstrap 127.0.0.1:$PORT --report-dir $OUT"
fi

if [ "$PART" = all ]; then
echo "== (a) 100-byte records, acks=1, 8 partitions, maximum throughput =="
bench produce $B --name a-max-throughput --topic bench-a --partitions 8 --record-size 100 --acks 1 --duration "$SECS"
fi

# BENCH_PART=tls runs (b), (b-tls) and (b-sasl) alone.
if [ "$PART" = all ] || [ "$PART" = tls ]; then
echo "== (b) 100-byte records, acks=1, 8 partitions, fixed $RATE records/s (open loop) =="
bench produce $B --name b-fixed-rate --topic bench-b --delete-topic --partitions 8 --record-size 100 --acks 1 --rate "$RATE" --linger-ms 1 --batch-bytes 32768 --duration "$SECS"

# (b-tls) (issue 42): (b) again over TLS, to a broker of its own whose listener is SSL
# (certificates made here with openssl), beside (b)'s plaintext in the same run. The
# goal: >= 0.8x (b)'s throughput, p99 within 1.5x.
TLS_DIR="$OUT/tls"
rm -rf "$TLS_DIR" "$OUT/tls-broker-data"
mkdir -p "$TLS_DIR"
(
  cd "$TLS_DIR"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=bench-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr -subj /CN=broker 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >broker.ext
  openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile broker.ext -out broker.pem 2>/dev/null
  printf 'security.protocol=SSL\nssl.ca.location=%s\n' "$TLS_DIR/ca.pem" >client.properties
)
bench_pick_port TLS_PORT 19492 0 552
bench_require_free_ports "the TLS broker" "$TLS_PORT" $((TLS_PORT + 552))
bench_spawn "${NICE[@]}" "$SLUICE" serve --listen "127.0.0.1:$TLS_PORT" --data-dir "$OUT/tls-broker-data" --cores "$CORES" \
  --security-protocol SSL --ssl-certificate "$TLS_DIR/broker.pem" --ssl-key "$TLS_DIR/broker.key" --ssl-ca "$TLS_DIR/ca.pem" >"$OUT/tls-broker.log" 2>&1
TLS_BROKER=$BENCH_PID
bench_wait_broker "$TLS_BROKER" "$OUT/tls-broker.log" 30 "$TLS_PORT" $((TLS_PORT + 552))
echo "== (b-tls) (b) over TLS: 100-byte records, acks=1, 8 partitions, fixed $RATE records/s =="
bench produce --command-config "$TLS_DIR/client.properties" --bootstrap "127.0.0.1:$TLS_PORT" --report-dir "$OUT" --name b-tls-fixed-rate --topic bench-b --partitions 8 --record-size 100 --acks 1 --rate "$RATE" --linger-ms 1 --batch-bytes 32768 --duration "$SECS"
bench_stop "$TLS_BROKER"

# (b-sasl) (issue 42): (b) again over SASL_SSL (SCRAM-SHA-512 logins, then TLS), to a
# broker of its own; the same goal against (b).
printf 'security.protocol=SASL_SSL\nssl.ca.location=%s\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=bench\nsasl.password=bench-secret\n' \
  "$TLS_DIR/ca.pem" >"$TLS_DIR/sasl.properties"
rm -rf "$OUT/sasl-broker-data"
bench_spawn env SLUICE_SASL_BOOTSTRAP_USER=bench:bench-secret "${NICE[@]}" "$SLUICE" serve --listen "127.0.0.1:$TLS_PORT" --data-dir "$OUT/sasl-broker-data" --cores "$CORES" \
  --security-protocol SASL_SSL --ssl-certificate "$TLS_DIR/broker.pem" --ssl-key "$TLS_DIR/broker.key" --ssl-ca "$TLS_DIR/ca.pem" >"$OUT/sasl-broker.log" 2>&1
SASL_BROKER=$BENCH_PID
bench_wait_broker "$SASL_BROKER" "$OUT/sasl-broker.log" 30 "$TLS_PORT" $((TLS_PORT + 552))
echo "== (b-sasl) (b) over SASL_SSL: 100-byte records, acks=1, 8 partitions, fixed $RATE records/s =="
bench produce --command-config "$TLS_DIR/sasl.properties" --bootstrap "127.0.0.1:$TLS_PORT" --report-dir "$OUT" --name b-sasl-fixed-rate --topic bench-b --partitions 8 --record-size 100 --acks 1 --rate "$RATE" --linger-ms 1 --batch-bytes 32768 --duration "$SECS"
bench_stop "$SASL_BROKER"
fi

if [ "$PART" = all ]; then
# (b-low): acks=all at a low rate with linger 0, as a latency-minded producer sends
# (issue 17's goal: p99 <= 1 ms). Each request carries a record or two for most of the
# 8 partitions, and acks once every partition it touched has made its write durable.
echo "== (b-low) 100-byte records, acks=all, 8 partitions, fixed $LOW_RATE records/s, linger 0 (open loop) =="
bench produce $B --name b-low-acks-all --topic bench-bl --delete-topic --partitions 8 --record-size 100 --acks -1 --rate "$LOW_RATE" --linger-ms 0 --duration "$SECS"
fi

# Exactly-once: (c) is the plain baseline of the idempotent and transactional runs.
if [ "$PART" = all ] || [ "$PART" = txn ]; then
echo "== (c) 1 KiB records, acks=all =="
bench produce $B --name c-1k-acks-all --topic bench-c --delete-topic --partitions 8 --record-size 1024 --acks -1 --duration "$SECS"

# (c-1m): the same with 1 MiB batches, librdkafka's default batch.size (1,000,000
# bytes): (c)'s 64 KiB batches bound it by the broker's per-batch work, not by the disk.
echo "== (c-1m) 1 KiB records, acks=all, 1 MiB batches =="
bench produce $B --name c-1k-acks-all-1m-batches --topic bench-c1m --delete-topic --partitions 8 --record-size 1024 --acks -1 --batch-bytes 1048576 --duration "$SECS"

echo "== (c-idem) 1 KiB records, acks=all, idempotent producers (sequenced batches) =="
bench produce $B --name c-1k-acks-all-idempotent --topic bench-ci --delete-topic --partitions 8 --record-size 1024 --acks -1 --idempotent --duration "$SECS"

echo "== (c-txn) 1 KiB records, acks=all, transactional producers committing every 100 ms =="
bench produce $B --name c-1k-acks-all-txn --topic bench-ct --delete-topic --partitions 8 --record-size 1024 --acks -1 --transactional --commit-interval-ms 100 --duration "$SECS"

# CTP_RECORDS records of 1 KiB go into the input first (acks=all, not timed); the
# timed phase reads them all with read_committed and writes them again, exactly once.
echo "== (ctp) consume-transform-produce, exactly once: 1 KiB records, read_committed in, transactional out, commit every 100 ms =="
bench ctp $B --name ctp --input bench-ctp-in --output bench-ctp-out --group bench-ctp --partitions 8 --record-size 1024 --records "${CTP_RECORDS:-1000000}" --commit-interval-ms 100
fi

if [ "$PART" = all ]; then
echo "== (d) consume throughput (topic of scenario a) =="
bench consume $B --name d-consume --topic bench-a --delete-topic --record-size 100

echo "== e2e: 100-byte records at 100,000 records/s, produce and consume at once =="
bench e2e $B --name e2e --topic bench-e2e --delete-topic --partitions 8 --record-size 100 --acks -1 --rate 100000 --linger-ms 1 --duration "$SECS"

echo "== consumer groups: 1,000 lightweight members join one group over 1,000 partitions =="
bench group --bootstrap "127.0.0.1:$PORT" --report-dir "$OUT" --members 1000 --partitions 1000
fi

# Issue 45: the next consumer group protocol (KIP-848) beside the classic one, 1,000 and
# 10,000 members (BENCH_PART=groups runs these alone). Each member and the broker hold
# one connection per member: 10,000 needs an open-file limit above 10,064.
if [ "$PART" = all ] || [ "$PART" = groups ]; then
for members in 1000 10000; do
  for proto in classic consumer; do
    [ "$PART" = all ] && [ "$members" = 1000 ] && [ "$proto" = classic ] && continue  # ran above
    echo "== consumer groups ($proto protocol): $members members, $members partitions =="
    bench group --bootstrap "127.0.0.1:$PORT" --report-dir "$OUT/groups-$members" --members "$members" \
      --partitions "$members" --protocol "$proto" --group "bench-group-$proto-$members" --topic "bench-group-$members"
  done
done
fi

if [ "$PART" = all ]; then

if [ "${CROSS_CHECK:-1}" = 1 ] && python3 -c 'import confluent_kafka' 2>/dev/null; then
  echo "== cross-check: scenario (a) driven by librdkafka (confluent-kafka) =="
  bench_run python3 scripts/bench_librdkafka.py --bootstrap "127.0.0.1:$PORT" --topic bench-a-rdkafka --seconds "$SECS" --out "$OUT/librdkafka-report.json"
fi
fi

# The RF=3 scenarios (r1-r4) below, first on this single broker as their baselines:
# same record size, acks, partitions, rate and batching, and the same warm-up.
# Warm-up: 2 s of acks=all at $RF_RATE records/s into the topic before it is measured
# (it also proves that all three replicas acknowledge). (r0) is the same acks=all load
# on a fresh topic with no warm-up: the cold figure, to set beside the warm (r1). It
# once stalled for ~100 ms in its first seconds (a new partition waited for its
# followers' running fetch poll to end; issue 17), and until c74bb07 the three brokers'
# shards all ran on CPU 0, where a fresh topic's set-up queued behind the other
# brokers; so keep both figures.
warm_and_run() { # bootstrap-args topic name rest...
  local args=$1 topic=$2 name=$3; shift 3
  bench produce $args --name "warmup-$name" --topic "$topic" --partitions 8 --record-size 100 --acks -1 --rate "$RF_RATE" --linger-ms 1 --batch-bytes 32768 --duration 2 >/dev/null
  bench produce $args --name "$name" --topic "$topic" --delete-topic --partitions 8 --record-size 100 "$@" --duration "$SECS"
}
rf_scenarios() { # bootstrap-args name-infix title
  echo "== (r0) $3: 100-byte records, acks=all, 8 partitions, fixed $RF_RATE records/s on a fresh topic, no warm-up (cold) =="
  bench produce $1 --name "r0-$2-acks-all-cold" --topic bench-r0 --delete-topic --partitions 8 --record-size 100 --acks -1 --rate "$RF_RATE" --linger-ms 1 --batch-bytes 32768 --duration "$SECS"
  echo "== (r1) $3: 100-byte records, acks=all, 8 partitions, fixed $RF_RATE records/s (open loop) =="
  warm_and_run "$1" bench-r1 "r1-$2-acks-all-fixed" --acks -1 --rate "$RF_RATE" --linger-ms 1 --batch-bytes 32768
  echo "== (r2) $3: 100-byte records, acks=1, 8 partitions, fixed $RF_RATE records/s (open loop) =="
  warm_and_run "$1" bench-r2 "r2-$2-acks-1-fixed" --acks 1 --rate "$RF_RATE" --linger-ms 1 --batch-bytes 32768
  echo "== (r3) $3: 100-byte records, acks=all, 8 partitions, maximum throughput =="
  warm_and_run "$1" bench-r3 "r3-$2-acks-all-max" --acks -1
  echo "== (r4) $3: 100-byte records, acks=1, 8 partitions, maximum throughput =="
  warm_and_run "$1" bench-r4 "r4-$2-acks-1-max" --acks 1
}
if [ "$PART" = all ] || [ "$PART" = replication ]; then
# --cpu-pid: each row also reports the brokers' CPU time per record produced.
rf_scenarios "$B --cpu-pid $BROKER" single "single broker"
fi

if [ "$PART" != soak ] && [ "$PART" != move ]; then bench_check_owner "$BROKER" "$PORT"; bench_stop "$BROKER"; fi

if [ "$PART" = all ] || [ "$PART" = replication ]; then
# RF=3: a 3-broker cluster on this machine (scripts/cluster.sh on the bench's own
# ports and data dir), each broker with --cores $CORES. sluice-bench creates each
# topic with replication factor 3 and refuses to measure until the Metadata shows
# every partition with 3 replicas, all 3 in the ISR (and reports the ISR after the
# run; an ISR that shrank mid-run fails the run).
CDIR="$OUT/cluster"
rm -rf "$CDIR"
bench_pick_port BENCH_CLUSTER_PORT 19400 1 2 3 11 12 13 553 554 555
CLUSTER_PORT=$BENCH_CLUSTER_PORT
cluster() {
  BENCH_RUN_GRACE=60 bench_run env CLUSTER_DIR="$CDIR" SLUICE_BIN="$SLUICE" KAFKA_PORT_BASE="$CLUSTER_PORT" \
    CONTROLLER_PORT_BASE=$((CLUSTER_PORT + 10)) SLUICE_EXTRA_FLAGS="--cores $CORES" \
    bash scripts/cluster.sh "$@"
}
cluster_stop_quiet() { cluster stop >/dev/null 2>&1 || true; }
bench_on_cleanup cluster_stop_quiet
# Broker n: Kafka CLUSTER_PORT+n, controller CLUSTER_PORT+10+n, metrics CLUSTER_PORT+552+n.
bench_require_free_ports "the 3-broker cluster" $((CLUSTER_PORT + 1)) $((CLUSTER_PORT + 2)) $((CLUSTER_PORT + 3)) \
  $((CLUSTER_PORT + 11)) $((CLUSTER_PORT + 12)) $((CLUSTER_PORT + 13)) $((CLUSTER_PORT + 553)) $((CLUSTER_PORT + 554)) $((CLUSTER_PORT + 555))
cluster start >/dev/null
CLUSTER_PIDS=()
for n in 1 2 3; do
  pid=$(cat "$CDIR/node-$n.pid")
  bench_track "$pid"
  CLUSTER_PIDS+=("$pid")
  bench_wait_broker "$pid" "$CDIR/node-$n.log" 30 $((CLUSTER_PORT + n)) $((CLUSTER_PORT + 10 + n)) $((CLUSTER_PORT + 552 + n))
  if [ ${#NICE[@]} -gt 0 ]; then renice -n -10 -p "$pid" >/dev/null || true; fi
done
C="--bootstrap 127.0.0.1:$((CLUSTER_PORT + 1)) --report-dir $OUT --replication-factor 3"
for f in "$CDIR"/node-*.pid; do C="$C --cpu-pid $(cat "$f")"; done

rf_scenarios "$C" rf3 "RF=3, 3 brokers"
"$SLUICE" cluster describe --bootstrap-server "127.0.0.1:$((CLUSTER_PORT + 1))" >"$OUT/cluster-describe.txt" 2>&1 || true
for n in 1 2 3; do
  bench_check_owner "${CLUSTER_PIDS[$((n - 1))]}" $((CLUSTER_PORT + n)) $((CLUSTER_PORT + 10 + n)) $((CLUSTER_PORT + 552 + n))
done
cluster stop >/dev/null
for pid in "${CLUSTER_PIDS[@]}"; do bench_stop "$pid"; done # gone by now: untracks them
fi
# An alert sink that is down must not slow produce (issue 13): same load with and
# without a failing webhook, side by side.
if [ "$PART" = all ]; then
  # A nested bench script cleans up after itself on SIGTERM: give it time to.
  BENCH_RUN_GRACE=120 bench_run env OUT="$OUT" SLUICE_BIN="$SLUICE" SLUICE_BENCH_BIN="$BENCH_BIN" bash scripts/bench-alert-sink.sh
fi
# Many partitions (issue 14): 10,000 on one broker and RF=3 on three.
if [ "$PART" = all ] || [ "$PART" = scale ]; then
  # A scenario that fails (e.g. RF=3 with 10,000 partitions on this 2-core VM) ends
  # this part; the summary then lacks its rows and says so.
  BENCH_RUN_GRACE=120 bench_run env OUT="$OUT" SLUICE_BIN="$SLUICE" SLUICE_BENCH_BIN="$BENCH_BIN" bash scripts/bench-scale.sh ||
    echo "bench-scale: a scenario failed (output above); the summary has only the figures measured before it"
fi
# Partition moves (issue 41): produce p99 while 1 GiB moves between brokers, at full
# speed and throttled, beside the same load with no move (scripts/bench-move.sh).
if [ "$PART" = all ] || [ "$PART" = move ]; then
  BENCH_RUN_GRACE=120 bench_run env OUT="$OUT" SLUICE_BIN="$SLUICE" SLUICE_BENCH_BIN="$BENCH_BIN" bash scripts/bench-move.sh ||
    echo "bench-move: a scenario failed (output above); the summary has only the figures measured before it"
fi
# Tiered storage (issue 44): produce p99 with uploads running beside the same load
# without, and reading old data from the store beside reading it locally
# (scripts/bench-tiered.sh).
if [ "$PART" = all ] || [ "$PART" = tiered ]; then
  BENCH_RUN_GRACE=120 bench_run env OUT="$OUT" SLUICE_BIN="$SLUICE" SLUICE_BENCH_BIN="$BENCH_BIN" bash scripts/bench-tiered.sh ||
    echo "bench-tiered: a scenario failed (output above); the summary has only the figures measured before it"
fi
# Soak (issue 17): one broker of its own, produce + consume at a fixed rate, acks=all,
# for SOAK_SECONDS; every SOAK_SAMPLE s a row of the interval (records/s produced and
# consumed, produce p50/p99/max, end-to-end p99) and of the broker (RSS, open
# descriptors, allocated bytes of its data dir), so that growth over time shows. The
# topic keeps at most SOAK_RETENTION_BYTES per partition in segments of
# SOAK_SEGMENT_BYTES and the broker checks retention every 5 s, so old segments are
# deleted throughout the run and the disk stays bounded (about 8 partitions x
# (retention + one segment)) however long it runs.
if [ "$PART" = all ] || [ "$PART" = soak ]; then
  bench_pick_port BENCH_SOAK_PORT 19600 0 1
  SOAK_PORT=$BENCH_SOAK_PORT
  SOAK_SECONDS=${SOAK_SECONDS:-180}
  SOAK_RATE=${SOAK_RATE:-100000}
  SOAK_SAMPLE=${SOAK_SAMPLE:-15}
  SOAK_RECORD_SIZE=${SOAK_RECORD_SIZE:-100}
  SOAK_RETENTION_BYTES=${SOAK_RETENTION_BYTES:-33554432}
  SOAK_SEGMENT_BYTES=${SOAK_SEGMENT_BYTES:-8388608}
  SDATA="$OUT/soak-data"
  rm -rf "$SDATA"
  echo "== soak: $SOAK_RECORD_SIZE-byte records at $SOAK_RATE records/s, acks=all, produce and consume for $SOAK_SECONDS s, a sample every $SOAK_SAMPLE s =="
  bench_require_free_ports "the soak's broker" "$SOAK_PORT" $((SOAK_PORT + 1))
  bench_spawn "${NICE[@]}" "$SLUICE" serve --listen "127.0.0.1:$SOAK_PORT" --data-dir "$SDATA" --cores "$CORES" \
    --metrics-listen "127.0.0.1:$((SOAK_PORT + 1))" --log-retention-check-interval-ms 5000 >"$OUT/soak-broker.log" 2>&1
  SOAK_BROKER=$BENCH_PID
  bench_wait_broker "$SOAK_BROKER" "$OUT/soak-broker.log" 30 "$SOAK_PORT" $((SOAK_PORT + 1))
  bench e2e --bootstrap "127.0.0.1:$SOAK_PORT" --report-dir "$OUT" --name soak --topic bench-soak \
    --partitions 8 --record-size "$SOAK_RECORD_SIZE" --acks -1 --rate "$SOAK_RATE" --linger-ms 1 --batch-bytes 32768 \
    --duration "$SOAK_SECONDS" --sample-secs "$SOAK_SAMPLE" --watch-pid "$SOAK_BROKER" --watch-dir "$SDATA" \
    --topic-config "retention.bytes=$SOAK_RETENTION_BYTES" --topic-config "segment.bytes=$SOAK_SEGMENT_BYTES" ||
    echo "soak: the run failed (output above); the summary has no soak rows"
  bench_check_owner "$SOAK_BROKER" "$SOAK_PORT" $((SOAK_PORT + 1))
  bench_stop "$SOAK_BROKER"
  rm -rf "$SDATA"
fi
# Only a full run replaces the figures in the docs by default: a partial one would
# leave the table with only its own rows.
if [ "$PART" = all ]; then UPDATE_DOCS=${UPDATE_DOCS:-1}; fi
UPDATE_DOCS=${UPDATE_DOCS:-0} python3 scripts/bench_summary.py "$OUT" "$CORES"
