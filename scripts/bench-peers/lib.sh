# shellcheck shell=bash
# Shared helpers for the peer benchmark scripts in this folder. Sourced, not executed.
#
# Every peer script takes the same knobs so that the comparison with spate is like for like:
#   N / --events N        events to send (default 5_000_000)
#   S / --payload-bytes S payload bytes per event (default 64)
# and prints exactly one machine-readable line on stdout:
#   RESULT peer=<name> events=<stored/accepted> seconds=<s> events_per_s=<r> mb_per_s=<payload MB/s> note="..."
# MB is 10^6 bytes of *payload* (events * S), never protocol framing, so figures compare across
# protocols; iperf3 is the exception (it has no events) and reports raw bytes, see iperf3.sh.
# Diagnostics go to stderr so that stdout stays parseable.

N=${N:-5000000}
S=${S:-64}

bp_usage() {
  cat >&2 <<USAGE
usage: $(basename "$0") [--events N] [--payload-bytes S]
  env N and S work too (flags win). Defaults: N=5000000 S=64.
USAGE
}

# Parse the common flags; anything else is an error (fail loudly rather than silently ignore).
bp_parse_args() {
  while (($#)); do
    case $1 in
      -n|--events) N=$2; shift 2 ;;
      -s|--payload-bytes) S=$2; shift 2 ;;
      -h|--help) bp_usage; exit 0 ;;
      *) echo "$(basename "$0"): unknown argument: $1" >&2; bp_usage; exit 2 ;;
    esac
  done
  [[ $N =~ ^[0-9]+$ && $N -gt 0 ]] || { echo "N must be a positive integer, got '$N'" >&2; exit 2; }
  [[ $S =~ ^[0-9]+$ && $S -ge 5 ]] || { echo "S must be an integer >= 5, got '$S'" >&2; exit 2; }
  export N S
}

bp_log() { echo "[$(basename "$0" .sh)] $*" >&2; }
bp_die() { echo "[$(basename "$0" .sh)] ERROR: $*" >&2; exit 1; }

bp_need() {
  local b
  for b in "$@"; do
    command -v "$b" >/dev/null 2>&1 || bp_die "$b not found; run scripts/bench-peers/install.sh"
  done
}

# A free TCP port on 127.0.0.1, chosen by the kernel. Avoids clashing with a real service
# (4222, 6379, 5201) or with a previous run whose socket is still in TIME_WAIT.
bp_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Wait until something accepts TCP connections on 127.0.0.1:$1 (servers start asynchronously).
bp_wait_port() {
  local port=$1 pid=${2:-} i
  for ((i = 0; i < 200; i++)); do
    if python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1",int(sys.argv[1])),0.2).close()' "$port" 2>/dev/null; then
      return 0
    fi
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
      bp_die "server (pid $pid) exited before listening on port $port"
    fi
    sleep 0.05
  done
  bp_die "nothing listening on 127.0.0.1:$port after 10s"
}

# Temp dir + server pid, both cleaned up on any exit (success, error, ^C).
BP_TMP=$(mktemp -d "${TMPDIR:-/tmp}/spate-peer.XXXXXX")
BP_PIDS=()
bp_cleanup() {
  local p
  for p in "${BP_PIDS[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  for p in "${BP_PIDS[@]}"; do
    # wait only works for our own children; fall back to polling so a server is gone before
    # the next peer starts and competes for the same two cores.
    wait "$p" 2>/dev/null || while kill -0 "$p" 2>/dev/null; do sleep 0.05; done
  done
  rm -rf "$BP_TMP"
}
trap bp_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Print the RESULT line. mb_per_s is computed here from payload bytes unless given.
#   bp_result PEER EVENTS SECONDS NOTE [MB_PER_S]
bp_result() {
  python3 - "$@" <<'PY'
import sys
peer, events, seconds, note = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
import os
S = int(os.environ["S"])
eps = events / seconds if seconds > 0 else 0.0
mbps = float(sys.argv[5]) if len(sys.argv) > 5 else events * S / seconds / 1e6
note = note.replace('"', "'")
print(f'RESULT peer={peer} events={events} seconds={seconds:.3f} '
      f'events_per_s={eps:.0f} mb_per_s={mbps:.1f} note="{note}"')
PY
}
