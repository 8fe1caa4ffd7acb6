#!/usr/bin/env bash
# The Arm packages: scripts/build-deb.sh for aarch64 (arm64) or armv7 (armhf), linked
# against glibc 2.31 with zig; kept under this name for the README and old habits.
#   scripts/build-arm.sh aarch64|armv7 [--install-deps]
set -euo pipefail
exec "$(dirname "$0")/build-deb.sh" "$@"
