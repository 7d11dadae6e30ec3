#!/usr/bin/env bash
# Peer: the disk itself. `dd if=/dev/zero of=<file in TMPDIR> bs=1M count=<N*(S+8) bytes> oflag=direct`
# then one sync: the sequential write rate a durable log on this filesystem cannot beat. Its
# "events" are bytes / (S+8), one spate ingest line; MB/s is raw bytes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/bench-peers/lib.sh
. "$here/lib.sh"
bp_parse_args "$@"
bp_need dd python3

line=$((S + 8))
mib=$(((N * line + (1 << 20) - 1) >> 20))
file=$BP_TMP/dd.bin
bp_log "dd if=/dev/zero of=$file bs=1M count=$mib oflag=direct conv=fdatasync"
t0=$(date +%s.%N)
dd if=/dev/zero of="$file" bs=1M count="$mib" oflag=direct conv=fdatasync status=none
t1=$(date +%s.%N)
rm -f "$file"
python3 - "$mib" "$line" "$t0" "$t1" <<'PY'
import sys
mib, line, t0, t1 = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
secs = t1 - t0
nbytes = mib << 20
print(f'RESULT peer=dd events={nbytes // line} seconds={secs:.3f} events_per_s={nbytes / line / secs:.0f} '
      f'mb_per_s={nbytes / secs / 1e6:.1f} note="dd bs=1M oflag=direct conv=fdatasync, {mib} MiB"')
PY
