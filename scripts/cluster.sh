#!/usr/bin/env bash
# A local 3-broker Sluice cluster on 127.0.0.1 (`make cluster`, `make cluster-stop`).
#
#   scripts/cluster.sh start    start brokers 1-3 (Kafka 9092-9094, controllers 9192-9194,
#                               metrics 9644-9646)
#   scripts/cluster.sh stop     SIGTERM each broker, wait (bounded), then SIGKILL
#   scripts/cluster.sh status   which brokers run and answer their Kafka port
#
# Broker N: data in ./data/cluster/node-N, log in ./data/cluster/node-N.log, pid in
# ./data/cluster/node-N.pid. Environment: SLUICE_BIN (default target/release/sluice),
# CLUSTER_DIR (default ./data/cluster), START_TIMEOUT and STOP_TIMEOUT in seconds
# (default 30 and 30), SLUICE_EXTRA_FLAGS (added to every `sluice serve`),
# KAFKA_PORT_BASE and CONTROLLER_PORT_BASE (broker N listens on BASE+N; default 9091
# and 9191, so 9092-9094 and 9192-9194; `make bench` uses its own). Broker N serves
# its metrics (/metrics, /health, /ready) on its Kafka port + 552: 9644-9646.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${SLUICE_BIN:-target/release/sluice}"
DIR="${CLUSTER_DIR:-./data/cluster}"
START_TIMEOUT="${START_TIMEOUT:-30}"
STOP_TIMEOUT="${STOP_TIMEOUT:-30}"
NODES=(1 2 3)
HOST=127.0.0.1
KAFKA_PORT_BASE="${KAFKA_PORT_BASE:-9091}"
CONTROLLER_PORT_BASE="${CONTROLLER_PORT_BASE:-9191}"

kafka_port() { echo $((KAFKA_PORT_BASE + $1)); }
controller_port() { echo $((CONTROLLER_PORT_BASE + $1)); }
metrics_port() { echo $((KAFKA_PORT_BASE + $1 + 552)); }
QUORUM="1@$HOST:$(controller_port 1),2@$HOST:$(controller_port 2),3@$HOST:$(controller_port 3)"

# The pid of broker N if it is running (and is the process we started), else nothing.
# A broker this run started has not exited. Its command line is not checked: right
# after the fork it is still this script's, until the broker binary is exec'd (a cold
# binary took long enough for `running_pid` to call a starting broker exited).
started_alive() {
  local pid
  pid="$(cat "$DIR/node-$1.pid" 2>/dev/null)" && [[ -n "$pid" ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]
}
# Stops what a failed start began: a broker not yet exec'd is still this script's
# child, which `stop_all` (checking for a sluice command line) would leave running.
abort_start() {
  local n pid
  for n in "${started[@]}"; do
    if started_alive "$n" && ! running_pid "$n" >/dev/null; then
      pid="$(cat "$DIR/node-$n.pid")"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  stop_all >&2
  exit 1
}
running_pid() {
  local f="$DIR/node-$1.pid" pid
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  # A recycled pid belongs to some other program: only trust it if it is sluice.
  grep -q sluice "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

# True when something accepts TCP connections on HOST:$1.
port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

start() {
  if [[ ! -x "$BIN" ]]; then
    echo "cluster: $BIN not found; build it first (make release)" >&2
    exit 1
  fi
  mkdir -p "$DIR"
  local n pid port started=()
  for n in "${NODES[@]}"; do
    if pid="$(running_pid "$n")"; then
      echo "broker $n already running (pid $pid)"
      continue
    fi
    for port in "$(kafka_port "$n")" "$(controller_port "$n")" "$(metrics_port "$n")"; do
      if port_open "$port"; then
        echo "cluster: port $port is already in use; is another broker running? (scripts/cluster.sh status)" >&2
        exit 1
      fi
    done
    mkdir -p "$DIR/node-$n"
    # shellcheck disable=SC2086 # SLUICE_EXTRA_FLAGS is a list of flags
    nohup "$BIN" serve \
      --node-id "$n" \
      --listen "$HOST:$(kafka_port "$n")" \
      --controller-listen "$HOST:$(controller_port "$n")" \
      --controller-quorum "$QUORUM" \
      --metrics-listen "$HOST:$(metrics_port "$n")" \
      --data-dir "$DIR/node-$n" \
      ${SLUICE_EXTRA_FLAGS:-} \
      >>"$DIR/node-$n.log" 2>&1 </dev/null &
    echo $! >"$DIR/node-$n.pid"
    started+=("$n")
  done
  # Bounded wait: every broker must answer its Kafka port before START_TIMEOUT.
  local deadline=$((SECONDS + START_TIMEOUT)) pending
  while :; do
    pending=()
    for n in "${NODES[@]}"; do
      if ! started_alive "$n"; then
        echo "cluster: broker $n exited; last lines of $DIR/node-$n.log:" >&2
        tail -n 20 "$DIR/node-$n.log" >&2 || true
        abort_start
      fi
      port_open "$(kafka_port "$n")" || pending+=("$n")
    done
    # Every Kafka port answers: wait for the cluster metadata to list all three.
    if [[ ${#pending[@]} -eq 0 ]]; then
      # Read whole before matching: with `| grep -q` and pipefail, a describe of
      # thousands of partitions was cut off by grep's early exit and the pipeline
      # failed, so a restarted broker of a big cluster never counted as registered.
      local described
      described=$("$BIN" cluster describe --bootstrap-server "$HOST:$(kafka_port 1)" 2>/dev/null || true)
      grep -q "^Brokers (${#NODES[@]})" <<<"$described" && break
      pending=("registration")
    fi
    if ((SECONDS >= deadline)); then
      echo "cluster: still waiting for ${pending[*]} after ${START_TIMEOUT}s; see $DIR/node-N.log" >&2
      abort_start
    fi
    sleep 0.2
  done
  cat <<EOF
Sluice cluster up: 3 brokers on $HOST.
  broker 1  kafka $HOST:$(kafka_port 1)  controller $HOST:$(controller_port 1)  metrics http://$HOST:$(metrics_port 1)/metrics  data $DIR/node-1  log $DIR/node-1.log
  broker 2  kafka $HOST:$(kafka_port 2)  controller $HOST:$(controller_port 2)  metrics http://$HOST:$(metrics_port 2)/metrics  data $DIR/node-2  log $DIR/node-2.log
  broker 3  kafka $HOST:$(kafka_port 3)  controller $HOST:$(controller_port 3)  metrics http://$HOST:$(metrics_port 3)/metrics  data $DIR/node-3  log $DIR/node-3.log
Try:
  $BIN cluster describe --bootstrap-server $HOST:$(kafka_port 1)
  kcat -b $HOST:$(kafka_port 1),$HOST:$(kafka_port 2),$HOST:$(kafka_port 3) -L
  kcat -b $HOST:$(kafka_port 1) -P -t demo   (then kcat -b $HOST:$(kafka_port 1) -C -t demo -e)
  curl -s http://$HOST:$(metrics_port 1)/metrics | grep '^sluice_partition_high_watermark'
Stop: make cluster-stop (scripts/cluster.sh stop); status: scripts/cluster.sh status
EOF
}

# SIGTERM every running broker, wait up to STOP_TIMEOUT for all, SIGKILL the rest.
stop_all() {
  local n pid pids=() nodes=()
  for n in "${NODES[@]}"; do
    if pid="$(running_pid "$n")"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
      nodes+=("$n")
    else
      rm -f "$DIR/node-$n.pid"
    fi
  done
  if [[ ${#pids[@]} -eq 0 ]]; then
    echo "cluster: no broker running"
    return 0
  fi
  local deadline=$((SECONDS + STOP_TIMEOUT)) i alive
  while :; do
    alive=0
    for i in "${!pids[@]}"; do
      kill -0 "${pids[$i]}" 2>/dev/null && alive=1
    done
    ((alive == 0)) && break
    if ((SECONDS >= deadline)); then
      for i in "${!pids[@]}"; do
        if kill -0 "${pids[$i]}" 2>/dev/null; then
          echo "cluster: broker ${nodes[$i]} (pid ${pids[$i]}) ignored SIGTERM for ${STOP_TIMEOUT}s; SIGKILL"
          kill -KILL "${pids[$i]}" 2>/dev/null || true
        fi
      done
      break
    fi
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    rm -f "$DIR/node-${nodes[$i]}.pid"
    echo "broker ${nodes[$i]} stopped (pid ${pids[$i]})"
  done
}

status() {
  local n pid up=0 state
  for n in "${NODES[@]}"; do
    if pid="$(running_pid "$n")"; then
      if port_open "$(kafka_port "$n")"; then state="answering"; up=$((up + 1)); else state="not answering"; fi
      echo "broker $n: running (pid $pid), kafka $HOST:$(kafka_port "$n") $state, metrics http://$HOST:$(metrics_port "$n")/metrics"
    else
      echo "broker $n: stopped"
    fi
  done
  # Exit 0 only when all three answer.
  [[ $up -eq ${#NODES[@]} ]]
}

case "${1:-}" in
  start) start ;;
  stop) stop_all ;;
  status) status ;;
  *)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
