#!/usr/bin/env bash
# NATS JetStream, memory-storage stream over ev.>. See nats.sh.
set -euo pipefail
exec "$(dirname "$0")/nats.sh" jetstream "$@"
