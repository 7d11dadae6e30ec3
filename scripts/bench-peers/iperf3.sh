#!/usr/bin/env bash
# Peer: iperf3, one TCP stream over loopback. The transport's ceiling: bytes only, no parsing,
# no storage. Anything that moves events over one loopback TCP connection cannot beat this.
#
# Driven as DESIGN.md section 6 says: `iperf3 -s -1` (one-shot server) and
# `iperf3 -c 127.0.0.1 -t 5 -J`. IPERF_SECONDS overrides the 5 s.
#
# iperf3 has no events, so "events" here is an *equivalent*: the bytes it moved divided by the
# size of one spate ingest line carrying an S-byte payload, `user42 <S bytes>\n` = S + 8 bytes
# (LINE_BYTES overrides). That is the rate spate's wire format would reach if the network
# stack were the only cost. mb_per_s is the raw TCP goodput (10^6 bytes/s) on this line only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/bench-peers/lib.sh
. "$here/lib.sh"
bp_parse_args "$@"
bp_need iperf3 python3

secs=${IPERF_SECONDS:-5}
line_bytes=${LINE_BYTES:-$((S + 8))}
port=$(bp_free_port)

# -B 127.0.0.1: bind loopback only. -1: exit after one test, so nothing lingers.
# --forceflush: its stdout is a file, and the "listening" line must reach it now, not at exit.
iperf3 -s -1 --forceflush -B 127.0.0.1 -p "$port" >"$BP_TMP/server.log" 2>&1 &
BP_PIDS+=($!)
# Do not probe the port: `-s -1` takes a probe connection as its one test and exits.
# Wait for its "Server listening" line instead.
for ((i = 0; i < 200; i++)); do
  grep -q "Server listening" "$BP_TMP/server.log" 2>/dev/null && break
  kill -0 "${BP_PIDS[0]}" 2>/dev/null || bp_die "iperf3 server exited: $(cat "$BP_TMP/server.log")"
  sleep 0.05
done
grep -q "Server listening" "$BP_TMP/server.log" || bp_die "iperf3 server not listening after 10s"

bp_log "iperf3 -c 127.0.0.1 -p $port -t $secs -J"
iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -J >"$BP_TMP/client.json"

python3 - "$BP_TMP/client.json" "$line_bytes" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
if "error" in j:
    sys.exit(f"iperf3 error: {j['error']}")
line = int(sys.argv[2])
r = j["end"]["sum_received"]
bytes_, secs = r["bytes"], r["seconds"]
bps = bytes_ / secs
ev = bytes_ // line
note = (f"one TCP stream, {bps/1e9:.2f} GB/s received; events = bytes/{line} "
        f"(one 'user42 SP payload LF' line); mb_per_s = raw bytes")
print(f'RESULT peer=iperf3 events={ev} seconds={secs:.3f} events_per_s={ev/secs:.0f} '
      f'mb_per_s={bps/1e6:.1f} gb_per_s={bps/1e9:.3f} note="{note}"')
PY
