#!/usr/bin/env bash
# Peer: NATS (Debian's nats-server 2.9), core or JetStream, driven by nats_blast.py.
#   nats.sh core      [--events N] [--payload-bytes S]
#   nats.sh jetstream [--events N] [--payload-bytes S]
# nats-core.sh and nats-jetstream.sh are thin wrappers around this.
#
# The server is started fresh for every run, bound to 127.0.0.1 on a kernel-chosen port (not
# 4222, so a real nats-server on this box is neither hit nor in the way), with JetStream's
# store dir in a temp dir that is removed on exit. See nats_blast.py for the protocol side.
#
# JetStream: JS_N overrides N for the JetStream run only (it is ~15x slower than core and keeps
# every event in memory). The RESULT line's events= is what the stream actually stored.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:-}
[[ $mode == core || $mode == jetstream ]] || { echo "usage: $0 core|jetstream [--events N] [--payload-bytes S]" >&2; exit 2; }
shift
# shellcheck source=scripts/bench-peers/lib.sh
. "$here/lib.sh"
bp_parse_args "$@"
bp_need nats-server python3

port=$(bp_free_port)
args=(-a 127.0.0.1 -p "$port" -l "$BP_TMP/nats.log")
events=$N
if [[ $mode == jetstream ]]; then
  events=${JS_N:-$N}
  mkdir -p "$BP_TMP/js"
  args+=(-js -sd "$BP_TMP/js")
  bp_log "JetStream run uses N=$events"
fi

nats-server "${args[@]}" &
BP_PIDS+=($!)
bp_wait_port "$port" "${BP_PIDS[0]}"

peer=(--peer "nats-$mode")
if [[ $mode == jetstream && ${JS_STORAGE:-memory} == file ]]; then
  peer=(--peer nats-jetstream-file)  # JS_STORAGE=file: the stream is on disk (bench-compare --durable)
fi
python3 "$here/nats_blast.py" "$mode" --port "$port" --events "$events" --payload-bytes "$S" "${peer[@]}"
