#!/usr/bin/env bash
# Peer: NATS JetStream R3 (Debian's nats-server 2.9): three nats-server processes clustered on
# loopback, each with JetStream and its own store dir in a temp dir, then nats_r3.py creates a
# file-storage stream with num_replicas 3 and publishes to it with acknowledgements.
#   nats-r3.sh [--events N] [--payload-bytes S]     (env SECONDS_RUN, default 3, and CONNECTIONS,
#                                                    default 8: N is not used, the run is timed)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/bench-peers/lib.sh
. "$here/lib.sh"
bp_parse_args "$@"
bp_need nats-server python3

clients=() routes=() cluster_ports=()
for index in 0 1 2; do
  clients+=("$(bp_free_port)")
  cluster_ports+=("$(bp_free_port)")
done
for index in 0 1 2; do routes+=("nats-route://127.0.0.1:${cluster_ports[$index]}"); done
route_list=$(IFS=,; echo "${routes[*]}")
for index in 0 1 2; do
  mkdir -p "$BP_TMP/n$index"
  cat >"$BP_TMP/n$index.conf" <<CONF
listen: 127.0.0.1:${clients[$index]}
server_name: n$index
jetstream { store_dir: "$BP_TMP/n$index" }
cluster {
  name: spatebench
  listen: 127.0.0.1:${cluster_ports[$index]}
  routes: [$route_list]
}
CONF
  nats-server -c "$BP_TMP/n$index.conf" -l "$BP_TMP/n$index.log" &
  BP_PIDS+=($!)
done
for index in 0 1 2; do bp_wait_port "${clients[$index]}" "${BP_PIDS[$index]}"; done
ports=$(IFS=,; echo "${clients[*]}")
python3 "$here/nats_r3.py" --ports "$ports" --seconds "${SECONDS_RUN:-3}" --connections "${CONNECTIONS:-8}" \
  --payload-bytes "$S" --batch "${BATCH:-128}"
