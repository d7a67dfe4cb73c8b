# shellcheck shell=bash
# Shared by the bench scripts (scripts/bench*.sh), which source it after `cd` to the
# repository root. It gives a run four guarantees (issue 38, item 5):
#   - whatever way the script ends (success, a failed step under `set -e`, Ctrl-C,
#     SIGTERM), the EXIT/INT/TERM traps stop every process it started (brokers, load
#     generators, nested bench scripts) and only those: SIGTERM, a bounded wait, then
#     SIGKILL; cleanup hooks (e.g. `cluster.sh stop`) run after them;
#   - a broker is only started on ports that nothing listens on (glommio binds with
#     SO_REUSEPORT, so a second broker on a busy port can start without an error and
#     share, or lose, the port to a broker left over from an earlier run);
#   - once started, the broker is checked to be the one that listens: every socket
#     listening on its ports (from /proc/net/tcp{,6}) is one of its own descriptors;
#   - resource samples (RSS, descriptors, allocated disk) skip files and processes that
#     vanish or are renamed while they are read, instead of failing the run.
# Functions:
#   bench_spawn CMD...          start CMD in the background and track it; its pid is
#                               left in BENCH_PID (redirect the call to send its output)
#   bench_run CMD...            run CMD to its end as a tracked background job (so that
#                               a signal stops it at once), return its exit status
#   bench_stop PID [GRACE]      SIGTERM, wait up to GRACE s (BENCH_STOP_TIMEOUT), SIGKILL
#   bench_kill PID              SIGKILL now (a crash on purpose) and wait for it
#   bench_track PID [GRACE]     track a process started elsewhere (a cluster.sh broker)
#   bench_on_cleanup FUNC       run FUNC at exit, after the tracked processes are stopped
#   bench_pick_port VAR DEFAULT OFFSET...
#                               set VAR to a port P such that P+OFFSET... are all free:
#                               $VAR itself when the caller's environment set it (then
#                               they must be free), else the first such P from DEFAULT up
#   bench_require_free_ports WHAT PORT...   fail with a clear message if one is busy
#   bench_wait_broker PID LOG TIMEOUT PORT... wait until PID, and nothing else, listens
#                               on every PORT; fail (with LOG's tail) if PID exits first
#   bench_check_owner PID PORT...  the same check once, for after a measurement
#   bench_resources OUTFILE NAME "PIDS" "DIRS"  RSS, descriptors and allocated disk
#   bench_require_bins BIN...   fail with a hint when a binary is not built
#   bench_bins                  set SLUICE and BENCH_BIN (from SLUICE_BIN and
#                               SLUICE_BENCH_BIN, else the release builds) and check them
# Environment: BENCH_STOP_TIMEOUT (default 30), seconds between SIGTERM and SIGKILL;
# BENCH_RUN_GRACE, the same for one bench_run call (a nested bench script needs time
# to stop its own brokers); BENCH_PORT_WAIT (default 10), seconds to wait for a port
# whose listener no process holds any more (a broker killed a moment ago).

BENCH_NAME=${BENCH_NAME:-$(basename "$0" .sh)}
BENCH_STOP_TIMEOUT=${BENCH_STOP_TIMEOUT:-30}
BENCH_PIDS=()              # tracked processes not yet stopped, in start order
declare -A BENCH_GRACE=()  # pid -> seconds between SIGTERM and SIGKILL
declare -A BENCH_START=()  # pid -> start time (field 22 of /proc/PID/stat): a pid that
                           # was recycled for another process is never signalled
BENCH_HOOKS=()
BENCH_PID=

bench_log() { echo "$BENCH_NAME: $*" >&2; }
bench_die() { bench_log "$*"; exit 1; }

bench_require_bins() {
  local b
  for b in "$@"; do
    [ -x "$b" ] || bench_die "$b not found or not executable: build it first (cargo build --release --workspace), or point SLUICE_BIN / SLUICE_BENCH_BIN at the binaries"
  done
}

bench_bins() {
  SLUICE=${SLUICE_BIN:-./target/release/sluice}
  BENCH_BIN=${SLUICE_BENCH_BIN:-./target/release/sluice-bench}
  bench_require_bins "$SLUICE" "$BENCH_BIN"
}

# --- processes -------------------------------------------------------------------

# Start time of PID in clock ticks since boot, or nothing if it is gone.
bench__starttime() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }                 # the fields after the command name, from field 3
  read -r -a s <<<"$s"
  echo "${s[19]}"             # field 22
}

# True while PID is the process that was tracked and has not exited (a zombie, exited
# but not yet reaped, counts as exited).
bench__alive() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  read -r -a s <<<"$s"
  [ "${s[0]}" != Z ] || return 1
  [ -z "${BENCH_START[$1]:-}" ] || [ "${s[19]}" = "${BENCH_START[$1]}" ]
}

bench_track() { # pid [grace]
  BENCH_PIDS+=("$1")
  BENCH_GRACE[$1]=${2:-$BENCH_STOP_TIMEOUT}
  BENCH_START[$1]=$(bench__starttime "$1" || true)
}

bench__untrack() {
  local p keep=()
  for p in "${BENCH_PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  BENCH_PIDS=("${keep[@]}")
  unset "BENCH_GRACE[$1]" "BENCH_START[$1]"
}

# `<&0`: an asynchronous command's stdin is /dev/null unless it is redirected
# explicitly, and some commands read a here-document given to the call.
bench_spawn() {
  "$@" <&0 &
  BENCH_PID=$!
  bench_track "$BENCH_PID"
}

bench_run() {
  local pid rc=0
  "$@" <&0 &
  pid=$!
  bench_track "$pid" "${BENCH_RUN_GRACE:-$BENCH_STOP_TIMEOUT}"
  wait "$pid" || rc=$?
  bench__untrack "$pid"
  return "$rc"
}

# Waits up to $2 s for every pid in $1 to exit, then SIGKILLs the rest and waits for
# them; reaps those that are children of this shell. Call it with 3>&2 2>/dev/null:
# its messages go to fd 3, and the shell's own notice of a child killed by a signal
# ("Killed ...") to nowhere.
bench__wait_gone() { # "pids" grace
  local deadline=$((SECONDS + $2)) p alive
  while :; do
    alive=()
    for p in $1; do bench__alive "$p" && alive+=("$p"); done
    [ ${#alive[@]} -eq 0 ] && break
    if [ $SECONDS -ge $deadline ]; then
      for p in "${alive[@]}"; do
        bench_log "pid $p ($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-80)) ignored SIGTERM for $2 s: SIGKILL" 2>&3
        kill -KILL "$p" 2>/dev/null || true
      done
      deadline=$((SECONDS + 10))
      while :; do
        alive=()
        for p in $1; do bench__alive "$p" && alive+=("$p"); done
        [ ${#alive[@]} -eq 0 ] || [ $SECONDS -ge $deadline ] && break
        sleep 0.1
      done
      break
    fi
    sleep 0.1
  done
  for p in $1; do wait "$p" 2>/dev/null || true; done
}

bench_stop() { # pid [grace]
  local grace=${2:-${BENCH_GRACE[$1]:-$BENCH_STOP_TIMEOUT}}
  if bench__alive "$1"; then kill -TERM "$1" 2>/dev/null || true; fi
  bench__wait_gone "$1" "$grace" 3>&2 2>/dev/null
  bench__untrack "$1"
}

bench_kill() { # pid
  if bench__alive "$1"; then kill -KILL "$1" 2>/dev/null || true; fi
  bench__wait_gone "$1" 10 3>&2 2>/dev/null
  bench__untrack "$1"
}

bench_on_cleanup() { BENCH_HOOKS+=("$1"); }

# The EXIT trap: SIGTERM to every tracked process still running (newest first), one
# bounded wait for all, SIGKILL for the rest, then the hooks. Keeps the exit status.
bench__cleanup() {
  local rc=$? p i pids=() grace=0
  set +e
  trap '' INT TERM          # a second Ctrl-C must not cut the cleanup short
  for ((i = ${#BENCH_PIDS[@]} - 1; i >= 0; i--)); do
    p=${BENCH_PIDS[$i]}
    bench__alive "$p" || { wait "$p" 2>/dev/null; continue; }
    pids+=("$p")
    [ "${BENCH_GRACE[$p]:-$BENCH_STOP_TIMEOUT}" -gt "$grace" ] && grace=${BENCH_GRACE[$p]:-$BENCH_STOP_TIMEOUT}
    kill -TERM "$p" 2>/dev/null
  done
  if [ ${#pids[@]} -gt 0 ]; then
    bench_log "stopping what this run started and is still running: pid ${pids[*]}"
    bench__wait_gone "${pids[*]}" "$grace" 3>&2 2>/dev/null
  fi
  BENCH_PIDS=()
  for ((i = ${#BENCH_HOOKS[@]} - 1; i >= 0; i--)); do "${BENCH_HOOKS[$i]}"; done
  exit "$rc"
}
bench__on_signal() {
  bench_log "got SIG$1: stopping"
  # 128 + the signal's number, as a shell reports a command killed by it; the EXIT
  # trap then cleans up.
  exit $((128 + $2))
}
trap bench__cleanup EXIT
trap 'bench__on_signal INT 2' INT
trap 'bench__on_signal TERM 15' TERM

# --- ports -----------------------------------------------------------------------

# Inodes of the sockets listening on TCP port $1, any address, IPv4 or IPv6.
bench__listen_inodes() {
  local hex
  printf -v hex ':%04X' "$1"
  awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { print $10 }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null || true
}

# Inodes of the sockets among PID's descriptors.
bench__socket_inodes() {
  find "/proc/$1/fd" -lname 'socket:*' -printf '%l\n' 2>/dev/null | sed -n 's/^socket:\[\([0-9]*\)\]$/\1/p' || true
}

# The processes listening on port $1 as ss shows them (users:((...))), or nothing.
bench__owners() { ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'users:(.*' | sort -u | paste -sd ' ' || true; }

# Who listens on port $1, for messages.
bench__who() {
  local who
  who=$(bench__owners "$1")
  echo "${who:-a socket no process holds}"
}

bench_port_free() { [ -z "$(bench__listen_inodes "$1")" ]; }

# A listening socket that no process holds any more is one a broker killed a moment ago
# has not finished closing: its io_uring's teardown, which drops the socket's last
# reference, runs after the process has exited and been reaped. Such a port is free
# again within milliseconds, so it is waited for (up to BENCH_PORT_WAIT s, default
# 10); a port some process listens on is refused at once.
bench_require_free_ports() { # what port...
  local what=$1 p busy held deadline=$((SECONDS + ${BENCH_PORT_WAIT:-10}))
  shift
  while :; do
    busy=()
    held=0
    for p in "$@"; do
      bench_port_free "$p" && continue
      busy+=("$p")
      [ -n "$(bench__owners "$p")" ] && held=1
    done
    [ ${#busy[@]} -eq 0 ] && return 0
    if [ $held = 1 ] || [ $SECONDS -ge $deadline ]; then break; fi
    sleep 0.05
  done
  for p in "${busy[@]}"; do
    bench_log "port $p (for $what) is already in use by $(bench__who "$p")"
  done
  bench_die "refusing to start a broker there: its load could go to the process already listening (a broker left over from an earlier run?). Stop that process or choose other ports."
}

bench_pick_port() { # var default offset...
  local var=$1 default=$2 base=$2 tries=0 o ok
  shift 2
  if [ -n "${!var:-}" ]; then
    local ports=()
    for o in "$@"; do ports+=($((${!var} + o))); done
    bench_require_free_ports "$var=${!var}" "${ports[@]}"
    return 0
  fi
  while :; do
    ok=1
    for o in "$@"; do bench_port_free $((base + o)) || { ok=0; break; }; done
    [ $ok = 1 ] && break
    tries=$((tries + 1))
    [ $tries -lt 200 ] || bench_die "no free ports found for $var from $default to $base; set $var to choose them"
    base=$((base + 1))
  done
  [ "$base" = "$default" ] || bench_log "ports of $var=$default are in use: using $var=$base"
  printf -v "$var" '%s' "$base"
}

# One look at PID and PORTs: 0 when PID lives and every socket listening on every
# PORT is PID's own (and there is at least one), 1 when PID is gone, 2 when some
# listener on a PORT is not PID's (the message says which), 3 when a PORT has no
# listener yet.
bench__owner_state() { # pid port...
  local pid=$1 p i listen owned missing=0
  shift
  bench__alive "$pid" || return 1
  owned=" $(bench__socket_inodes "$pid" | tr '\n' ' ') "
  for p in "$@"; do
    listen=$(bench__listen_inodes "$p")
    [ -n "$listen" ] || { missing=1; continue; }
    for i in $listen; do
      if [[ $owned != *" $i "* ]]; then
        # Our sockets could have been opened since the list was read: read it again.
        owned=" $(bench__socket_inodes "$pid" | tr '\n' ' ') "
        [[ $owned == *" $i "* ]] && continue
        bench_log "port $p is served by $(bench__who "$p"), not only by the broker this run started (pid $pid)"
        return 2
      fi
    done
  done
  [ $missing = 0 ] || return 3
}

bench_wait_broker() { # pid log timeout port...
  local pid=$1 log=$2 timeout=$3 st
  shift 3
  local deadline=$((SECONDS + timeout))
  while :; do
    st=0
    bench__owner_state "$pid" "$@" || st=$?
    case $st in
      0) return 0 ;;
      1)
        bench_log "the broker (pid $pid) exited before it listened on ports $*; last lines of $log:"
        tail -n 20 "$log" >&2 || true
        exit 1 ;;
      2) bench_die "the broker measured would not be the one this run started (pid $pid): stopping" ;;
    esac
    if [ $SECONDS -ge $deadline ]; then
      bench_log "the broker (pid $pid) does not listen on every one of ports $* after $timeout s; last lines of $log:"
      tail -n 20 "$log" >&2 || true
      exit 1
    fi
    sleep 0.1
  done
}

bench_check_owner() { # pid port...
  local st=0
  bench__owner_state "$@" || st=$?
  case $st in
    0) return 0 ;;
    1) bench_die "the broker this run started (pid $1) is gone" ;;
    2) bench_die "the broker measured may not be the one this run started (pid $1)" ;;
    *) bench_die "the broker this run started (pid $1) no longer listens on ports ${*:2}" ;;
  esac
}

# --- resources -------------------------------------------------------------------

# Resident memory and open descriptors of PIDS and allocated disk under DIRS, summed,
# as one JSON line in OUTFILE (also printed). Files that vanish or are renamed during
# the walk (a checkpoint's .tmp renamed over the old one, a segment deleted by
# retention) are skipped; a process that is gone counts nothing and is named in
# "gone_pids". Never fails the run: a sample that cannot be taken is reported.
bench_resources() { # outfile name "pids" "dirs"
  python3 - "$@" <<'PY' || bench_log "resource sample $2 failed (see above); the run goes on"
import json, os, stat, sys

out, name, pids, dirs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return 0  # a zombie or kernel thread has no VmRSS


def open_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def allocated_kb(top):
    """Allocated KiB under top as `du -sk` counts them: every file and directory once
    (hard links once), st_blocks of 512 bytes."""
    seen, total, stack = set(), 0, [top]
    while stack:
        d = stack.pop()
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
        try:
            it = os.scandir(d)
        except OSError:  # removed or renamed since it was listed, or not a directory
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        continue
                    st = e.stat(follow_symlinks=False)
                except OSError:  # vanished between listing and stat
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total // 1024


rss = fds = 0
gone = []
for p in pids:
    r, n = rss_kb(p), open_fds(p)
    if r is None or n is None:
        gone.append(int(p))
        continue
    rss, fds = rss + r, fds + n
disk = sum(allocated_kb(d) for d in dirs)
row = {"name": name, "rss_kb": rss, "open_fds": fds, "disk_kb": disk}
if gone:
    row["gone_pids"] = gone
    print(f"resources {name}: pid(s) {gone} gone, not counted", file=sys.stderr)
line = json.dumps(row, separators=(",", ":"))
with open(out, "w") as f:
    f.write(line + "\n")
print(line)
PY
}
