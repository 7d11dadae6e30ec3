#!/usr/bin/env bash
# Peer: the disk from huge pages. The same bytes as dd.sh (N*(S+8)), written with O_DIRECT in
# 1 MiB writes from a buffer on 2 MiB transparent huge pages (scripts/bench-disk-pages, one
# cell), then fdatasync. On a disk that takes one piece per physical page (this VM's virtio
# disk) this is the ceiling for a writer whose buffers are on huge pages; dd's buffer is 4 KiB
# pages. Its "events" are bytes / (S+8); MB/s is raw bytes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/bench-peers/lib.sh
. "$here/lib.sh"
bp_parse_args "$@"
bp_need python3

line=$((S + 8))
mib=$(((N * line + (1 << 20) - 1) >> 20))
bp_log "scripts/bench-disk-pages $BP_TMP $mib (MODES=huge SIZES=1024 ROUNDS=1)"
out=$(MODES=huge SIZES=1024 ROUNDS=1 "$here/../bench-disk-pages" "$BP_TMP" "$mib")
bp_log "$out"
# The cell's line: "huge  1024 KiB writes  <MB/s> MB/s ...".
rate=$(awk '/^huge/ {print $5; exit}' <<<"$out")
[[ -n $rate ]] || bp_die "no rate in: $out"
nbytes=$((mib << 20))
seconds=$(python3 -c "print($nbytes / ($rate * 1e6))")
bp_result disk-huge $((nbytes / line)) "$seconds" "O_DIRECT 1 MiB writes from huge pages + fdatasync, $mib MiB" "$rate"
