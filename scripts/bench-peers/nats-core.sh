#!/usr/bin/env bash
# NATS core PUB, no subscriber (parse and drop). See nats.sh.
set -euo pipefail
exec "$(dirname "$0")/nats.sh" core "$@"
