#!/usr/bin/env bash
# Peer: Redis Streams (Debian's Redis 7), XADD pipelined 64 deep over 4 connections.
#
# REDIS_AOF=everysec|always turns the append-only file on with that appendfsync (the durable
# comparison of `bench-compare --durable`); unset, no persistence.
#
# Driven as DESIGN.md section 6 says:
#   redis-server --save "" --appendonly no              (in memory, no persistence: like the
#                                                          NATS memory stream, nothing hits disk)
#   redis-benchmark -n N -P 64 -c 4 XADD mystream '*' k user42 v <S-4 byte value>
# redis-benchmark is Redis's own load generator (C, pipelined), so the client is not the
# bottleneck; the server stores every entry with an auto-generated ID, i.e. a stored stream.
# The entry carries the key "user42" as a field value and an S-4 byte value (DESIGN's 60 bytes
# for S=64); mb_per_s counts S bytes per event so it lines up with the other peers.
#
# REDIS_N overrides N for this peer only (DESIGN measured 2_000_000; the default here is the
# same N as everyone else, which is the fairer comparison and fits in memory easily).
# The rate is redis-benchmark's own (requests / its measured time); the stream length is then
# checked with XLEN (which must be >= N; see below).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/bench-peers/lib.sh
. "$here/lib.sh"
bp_parse_args "$@"
bp_need redis-server redis-benchmark redis-cli python3

n=${REDIS_N:-$N}
port=$(bp_free_port)
# --bind 127.0.0.1 only; --dir in our temp dir so even a stray dump lands there and is removed.
persistence=(--appendonly no)
if [[ -n ${REDIS_AOF:-} ]]; then
  persistence=(--appendonly yes --appendfsync "$REDIS_AOF")
  bp_log "AOF on, appendfsync $REDIS_AOF"
fi
redis-server --save "" "${persistence[@]}" --port "$port" --bind 127.0.0.1 \
  --dir "$BP_TMP" --logfile "$BP_TMP/redis.log" --daemonize no &
BP_PIDS+=($!)
bp_wait_port "$port" "${BP_PIDS[0]}"

value=$(printf 'v%.0s' $(seq 1 $((S - 4))))
bp_log "redis-benchmark -p $port -n $n -P 64 -c 4 XADD mystream '*' k user42 v <$((S - 4)) bytes>"
t0=$(date +%s.%N)
redis-benchmark -p "$port" -n "$n" -P 64 -c 4 --csv XADD mystream '*' k user42 v "$value" >"$BP_TMP/bench.csv"
t1=$(date +%s.%N)
xlen=$(redis-cli -p "$port" XLEN mystream)
version=$(redis-cli -p "$port" INFO server | sed -n 's/^redis_version:\([^[:space:]]*\).*/\1/p')

peer=redis-streams${REDIS_AOF:+-aof-$REDIS_AOF}
python3 - "$BP_TMP/bench.csv" "$n" "$xlen" "$t0" "$t1" "$version" "$peer" <<'PY'
import csv, os, sys
path, n, xlen, t0, t1, version, peer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6], sys.argv[7]
S = int(os.environ["S"])
rows = [r for r in csv.reader(open(path)) if r and r[0] != "test"]
if not rows:
    sys.exit("redis-benchmark printed no result row:\n" + open(path).read())
rps = float(rows[-1][1])
# redis-benchmark stops its clock when n replies are in; a few pipelined requests beyond n may
# still be in flight (XLEN can exceed n by < 64 * clients). Report n over its clock, and require
# that at least n entries were really stored.
if xlen < n:
    sys.exit(f"[redis] XLEN={xlen} < {n} XADDs sent: entries were lost")
secs = n / rps
note = (f"redis {version}; XADD -P 64 -c 4, value {S-4} B; XLEN={xlen}; "
        f"rate from redis-benchmark, wall incl. connect {t1-t0:.2f}s")
print(f'RESULT peer={peer} events={n} seconds={secs:.3f} events_per_s={rps:.0f} '
      f'mb_per_s={n*S/secs/1e6:.1f} note="{note}"')
PY
