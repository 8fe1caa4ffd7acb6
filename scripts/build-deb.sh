#!/usr/bin/env bash
# Builds the stripped release binary and the .deb of one architecture, linked against
# glibc 2.31 (Debian 11 bullseye, Raspberry Pi OS bullseye) whatever this machine's C
# library is: `cargo zigbuild` with a `.2.31` target, zig and cargo-zigbuild from the
# Python package index in a virtual environment under target/ (made on first use).
#   scripts/build-deb.sh x86_64    # amd64
#   scripts/build-deb.sh aarch64   # 64-bit Raspberry Pi OS / Debian arm64
#   scripts/build-deb.sh armv7     # 32-bit Raspberry Pi OS / Debian armhf
# Output: target/<triple>/release/tapegate and target/<triple>/debian/tapegate_*.deb,
# whose `Depends: libc6 (>= 2.31)` (Cargo.toml) scripts/check-glibc.sh holds to the
# binary. Needs python3 with venv, the rustup target (added here) and cargo-deb
# (installed with --install-deps). libdbus is built from source (the dbus crate's
# "vendored" feature) by zig's C compiler, so no cross gcc and no multiarch libdbus.
set -euo pipefail
cd "$(dirname "$0")/.."

# The C library the packages are built for, and the tools that build them.
GLIBC=2.31
ZIGLANG=0.17.1
CARGO_ZIGBUILD=0.24.1

arch=${1:-}
install_deps=${2:-}
case "$arch" in
  x86_64)  triple=x86_64-unknown-linux-gnu ;;
  aarch64) triple=aarch64-unknown-linux-gnu ;;
  armv7)   triple=armv7-unknown-linux-gnueabihf ;;
  *) echo "usage: $0 x86_64|aarch64|armv7 [--install-deps]" >&2; exit 2 ;;
esac

venv=target/zig-venv
if ! "$venv/bin/cargo-zigbuild" --version 2>/dev/null | grep -qF "$CARGO_ZIGBUILD"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "ziglang==$ZIGLANG" "cargo-zigbuild==$CARGO_ZIGBUILD"
fi
# cargo-zigbuild finds zig as `python3 -m ziglang`: the environment's python3 first.
export PATH="$PWD/$venv/bin:$PATH"
rustup target add "$triple" >/dev/null
if [ "$install_deps" = "--install-deps" ]; then
  command -v cargo-deb >/dev/null || cargo install cargo-deb --locked
fi

start=$(date +%s)
# The package's binary: the gateway alone, without the mock service and the demo (the
# `mock` feature), as [package.metadata.deb] says for cargo deb's own builds.
cargo zigbuild --release --locked --target "$triple.$GLIBC" -p tapegate --bin tapegate \
  --no-default-features
# The man pages and completions, from the command line's definition (arch-independent).
scripts/package-docs.sh
# The binary is stripped by the release profile; the .deb's dependencies are fixed in
# Cargo.toml (cargo-deb's detection would ask this machine's dpkg about the binary).
cargo deb --no-build --no-strip --target "$triple"
end=$(date +%s)

bin="target/$triple/release/tapegate"
echo "built $bin ($(stat -c %s "$bin") bytes, stripped, glibc $GLIBC) in $((end - start)) s"
ls -1 "target/$triple/debian/"*.deb
