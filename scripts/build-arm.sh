#!/usr/bin/env bash
# Builds the stripped release binary and the .deb for a Raspberry Pi-class box with
# Debian's cross compilers, no Docker:
#   scripts/build-arm.sh aarch64   # 64-bit Raspberry Pi OS / Debian arm64
#   scripts/build-arm.sh armv7     # 32-bit Raspberry Pi OS / Debian armhf
# Output: target/<triple>/release/tapegate and target/<triple>/debian/tapegate_*.deb
# Needs (installed with --install-deps): gcc-<arch>-linux-gnu*, libc6-dev-<arch>-cross,
# the rustup target, cargo-deb. libdbus is built from source (the dbus crate's
# "vendored" feature), so no multiarch libdbus-1-dev is needed.
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${1:-}
install_deps=${2:-}
case "$arch" in
  aarch64) triple=aarch64-unknown-linux-gnu; gnu=aarch64-linux-gnu; libc=libc6-dev-arm64-cross ;;
  armv7)   triple=armv7-unknown-linux-gnueabihf; gnu=arm-linux-gnueabihf; libc=libc6-dev-armhf-cross ;;
  *) echo "usage: $0 aarch64|armv7 [--install-deps]" >&2; exit 2 ;;
esac

if [ "$install_deps" = "--install-deps" ]; then
  if ! command -v "$gnu-gcc" >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq "gcc-$gnu" "$libc"
  fi
  rustup target add "$triple"
  command -v cargo-deb >/dev/null || cargo install cargo-deb --locked
fi

upper=$(echo "$triple" | tr 'a-z-' 'A-Z_')
export "CARGO_TARGET_${upper}_LINKER=$gnu-gcc"
export "CC_${triple//-/_}=$gnu-gcc"
export "AR_${triple//-/_}=$gnu-ar"

start=$(date +%s)
# The package's binary: the gateway alone, without the mock service and the demo (the
# `mock` feature), as [package.metadata.deb] says for cargo deb's own builds.
cargo build --release --locked --target "$triple" -p tapegate --bin tapegate --no-default-features
# The binary is stripped by the release profile; the .deb's dependencies are fixed in
# Cargo.toml (cargo-deb's detection would ask the host's dpkg about an Arm binary).
cargo deb --no-build --no-strip --target "$triple"
end=$(date +%s)

bin="target/$triple/release/tapegate"
echo "built $bin ($(stat -c %s "$bin") bytes, stripped) in $((end - start)) s"
ls -1 "target/$triple/debian/"*.deb
