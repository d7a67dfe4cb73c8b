#!/usr/bin/env bash
# shellcheck disable=SC2086 # $B and $T are lists of flags, split on purpose
# Issue 44's benchmark, part of `make bench` (BENCH_PART=tiered runs it alone): tiered
# storage's cost on this machine. One broker (--cores $TIER_CORES) with
# --remote-storage on a folder of the same disk (file://; an S3 store adds its network
# round trips, not measured here), and an acks=all producer of 100 B records at
# $TIER_RATE records/s over 8 partitions for $BENCH_SECONDS:
#   (t0) into a topic without remote storage,
#   (t1) into a topic with remote.storage.enable=true, 1 MiB segments and a local
#        window of 2 MiB per partition: closed segments are uploaded during the load;
# then, once (t1)'s uploads caught up, every record of each topic read from offset 0
# as fast as the consumer goes:
#   (t2) (t0)'s topic, from the local log,
#   (t3) (t1)'s topic, most of it from the store (chunked ranged reads, cached).
# Then, where moto's S3 server is installed (`make test` installs it), the same as
# (t1) and (t3) with the store behind the S3 API on loopback (a second broker,
# --remote-storage s3://...: every upload is PUTs, every remote read ranged GETs, each
# an HTTP round trip to a Python server; a real S3's network latency is not here):
#   (t4) produce into a tiered topic, uploads to S3 running,
#   (t5) read it from offset 0, most of it from S3.
# Reports: $OUT/tier-t{0,1}-*-report.json (sluice-bench produce),
# $OUT/tier-t{2,3,5}-*-report.json (sluice-bench consume) and $OUT/tier-facts.json /
# tier-s3-facts.json (what was remote when (t3) / (t5) read); bench_summary.py puts (t1) beside (t0) and (t3) beside
# (t2). Every process it starts is stopped on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
bench_bins
OUT=${OUT:-bench/results}
SECS=${BENCH_SECONDS:-10}
RATE=${TIER_RATE:-100000}
CORES=${TIER_CORES:-1}
mkdir -p "$OUT"
rm -f "$OUT"/tier-*.json

bench_pick_port BENCH_TIER_PORT 19600 0 552
P=$BENCH_TIER_PORT
DATA="$OUT/tier-data"
REMOTE="$(cd "$OUT" && pwd)/tier-remote"
DATA_S3="$OUT/tier-data-s3"
rm -rf "$DATA" "$REMOTE" "$DATA_S3"
tier_cleanup() { rm -rf "$DATA" "$REMOTE" "$DATA_S3"; }
bench_on_cleanup tier_cleanup
bench_require_free_ports "the tiered benchmark's broker" "$P" $((P + 552))
tier_broker() { # port data-dir store-url log: starts it; sets BROKER and B (the clients' flags)
  bench_spawn "$SLUICE" serve --listen "127.0.0.1:$1" --data-dir "$2" --cores "$CORES" \
    --remote-storage "$3" --remote-log-manager-task-interval-ms 200 \
    --log-retention-check-interval-ms 500 >"$4" 2>&1
  BROKER=$BENCH_PID
  bench_wait_broker "$BROKER" "$4" 30 "$1" $(($1 + 552))
  B="--bootstrap 127.0.0.1:$1 --report-dir $OUT"
}
tier_broker "$P" "$DATA" "file://$REMOTE" "$OUT/tier-broker.log"
T="--topic-config remote.storage.enable=true --topic-config segment.bytes=1048576 --topic-config local.retention.bytes=2097152"
bench() { bench_run "$BENCH_BIN" "$@"; }
load() { # name topic [flags]
  bench produce $B --cpu-pid "$BROKER" --name "$1" --topic "$2" --partitions 8 --record-size 100 --acks -1 \
    --rate "$RATE" --linger-ms 1 --batch-bytes 32768 --duration "$SECS" "${@:3}"
}

echo "== (t0) acks=all 100 B at $RATE records/s, 8 partitions, no remote storage =="
load tier-t0-local bench-tier-local --topic-config segment.bytes=1048576
echo "== (t1) the same with remote.storage.enable=true (uploads during the load) =="
load tier-t1-remote bench-tier-remote $T

# Until the uploads caught up: the local files hold about the window per partition.
remote_bytes() { du -sb "$REMOTE" 2>/dev/null | cut -f1; }
local_bytes() { du -sb "$1"/bench-tier-remote-* 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
caught_up() { # data dir
  local deadline=$((SECONDS + 120))
  while [ "$(local_bytes "$1")" -gt $((8 * 5 * 1048576)) ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
}
caught_up "$DATA"
echo "remote: $(remote_bytes) bytes; local: $(local_bytes "$DATA") bytes"
printf '{"remote_bytes": %s, "local_bytes": %s, "rate": %s, "seconds": %s}\n' \
  "$(remote_bytes)" "$(local_bytes "$DATA")" "$RATE" "$SECS" >"$OUT/tier-facts.json"

echo "== (t2) read (t0)'s topic from offset 0: local =="
bench consume $B --name tier-t2-local --topic bench-tier-local --record-size 100
echo "== (t3) read (t1)'s topic from offset 0: mostly from the store =="
bench consume $B --name tier-t3-remote --topic bench-tier-remote --record-size 100
bench_stop "$BROKER"

if ! command -v moto_server >/dev/null || ! python3 -c 'import boto3' 2>/dev/null; then
  echo "== (t4, t5) skipped: moto_server and boto3 are not installed (make test installs them) =="
  exit 0
fi
bench_pick_port BENCH_TIER_S3_PORT $((P + 1)) 0 552 553
P3=$BENCH_TIER_S3_PORT
MOTO=$((P3 + 553))
bench_spawn moto_server -H 127.0.0.1 -p "$MOTO" >"$OUT/tier-moto.log" 2>&1
export AWS_ENDPOINT_URL="http://127.0.0.1:$MOTO" AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
s3_objects() { # count and bytes of the bucket's objects: "n bytes"
  python3 - <<'PY'
import boto3
s3 = boto3.client("s3")
n = size = 0
for page in s3.get_paginator("list_objects_v2").paginate(Bucket="sluice-bench"):
    for o in page.get("Contents", []):
        n, size = n + 1, size + o["Size"]
print(n, size)
PY
}
deadline=$((SECONDS + 60))
until python3 -c 'import boto3; boto3.client("s3").create_bucket(Bucket="sluice-bench")' 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || bench_die "moto_server did not answer on port $MOTO (see $OUT/tier-moto.log)"
  sleep 0.5
done
tier_broker "$P3" "$DATA_S3" "s3://sluice-bench/tier" "$OUT/tier-broker-s3.log"
echo "== (t4) as (t1), the store behind moto's S3 server on loopback =="
load tier-t4-s3 bench-tier-remote $T
caught_up "$DATA_S3"
read -r objects s3_bytes <<<"$(s3_objects)"
echo "S3: $objects objects, $s3_bytes bytes; local: $(local_bytes "$DATA_S3") bytes"
printf '{"remote_bytes": %s, "objects": %s, "local_bytes": %s}\n' \
  "$s3_bytes" "$objects" "$(local_bytes "$DATA_S3")" >"$OUT/tier-s3-facts.json"
echo "== (t5) read (t4)'s topic from offset 0: mostly from S3 =="
bench consume $B --name tier-t5-s3 --topic bench-tier-remote --record-size 100
bench_stop "$BROKER"
