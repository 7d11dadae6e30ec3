#!/usr/bin/env bash
# Install the peer servers/clients that scripts/bench-compare measures spate against.
#
# Idempotent: only packages whose binary is missing are installed, so re-running it on a
# machine that already has everything does no apt work at all. Everything comes from Debian
# (bookworm) so that the versions are the ones DESIGN.md section 6 was measured with
# (NATS 2.9, Redis 7, iperf3 3.12). Fails loudly (non-zero exit, message on stderr) when a
# package cannot be installed or a binary is still missing afterwards.
set -euo pipefail

# binary -> Debian package that provides it
declare -A want=(
  [nats-server]=nats-server
  [redis-server]=redis-server
  [redis-benchmark]=redis-tools
  [redis-cli]=redis-tools
  [iperf3]=iperf3
  [python3]=python3
)

missing=()
for bin in "${!want[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("${want[$bin]}")
done

if ((${#missing[@]} == 0)); then
  echo "install.sh: all peers present"
  exit 0
fi

# de-duplicate (redis-tools provides two of the binaries)
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "install.sh: installing ${pkgs[*]}"

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install.sh: not root and no sudo; install ${pkgs[*]} by hand" >&2; exit 1; }
  sudo_cmd=(sudo)
fi

# noninteractive: iperf3's postinst asks (via debconf) whether to start a system daemon.
# The answer is no; we only ever run our own short-lived servers on 127.0.0.1.
echo "iperf3 iperf3/start_daemon boolean false" | "${sudo_cmd[@]}" debconf-set-selections 2>/dev/null || true
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${pkgs[@]}"; then
  # The package lists may be missing or stale on a fresh machine: refresh once and retry.
  "${sudo_cmd[@]}" apt-get update
  "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${pkgs[@]}" || {
    echo "install.sh: apt-get install ${pkgs[*]} failed" >&2; exit 1; }
fi

for bin in "${!want[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || { echo "install.sh: $bin still missing after install" >&2; exit 1; }
done
echo "install.sh: done"
