#!/usr/bin/env bash
# Installs an amd64 package with apt in a minimal Debian root of release SUITE
# (debootstrap, cached as a tarball under target/debian-roots/) and runs it there with
# systemd-nspawn: `tapegate --version`, `check --config-only` on the shipped example
# config, and a short replay with `run --until-drained` read back with `status --json`.
# It shows the package's C library floor where it matters: bullseye's glibc 2.31.
#   scripts/debian-check.sh bullseye target/x86_64-unknown-linux-gnu/debian/tapegate_*.deb
# Needs root, debootstrap (first run), systemd-nspawn (systemd-container) and zstd. The
# Debian mirror is the one this machine's apt uses.
set -euo pipefail
cd "$(dirname "$0")/.."

suite=${1:?usage: $0 SUITE DEB}
deb=${2:?usage: $0 SUITE DEB}

# The mirror of this machine's apt sources (one-line and deb822 forms).
mirror() {
  {
    sed -n 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' \
      /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null
    sed -n 's/^[[:space:]]*URIs:[[:space:]]*\([^[:space:]]\+\).*/\1/p' \
      /etc/apt/sources.list.d/*.sources 2>/dev/null
  } | grep -E '/debian/?$' | head -1
}

cache=target/debian-roots
tarball="$cache/$suite.tar.zst"
mkdir -p "$cache"
if [ ! -f "$tarball" ]; then
  url=$(mirror)
  [ -n "$url" ] || { echo "no Debian mirror in this machine's apt sources" >&2; exit 1; }
  build=$(mktemp -d "$cache/$suite.XXXXXX")
  echo "== debootstrapping $suite (cached as $tarball)"
  debootstrap --variant=minbase --include=adduser "$suite" "$build" "$url" >/dev/null
  tar -C "$build" --zstd -cf "$tarball.partial" .
  mv "$tarball.partial" "$tarball"
  rm -rf "$build"
fi

root=$(mktemp -d "$cache/run.XXXXXX")
trap 'rm -rf "$root"' EXIT
tar -C "$root" --zstd -xf "$tarball"
chmod 755 "$root"
cp "$deb" "$root/srv/tapegate.deb"
# (nspawn mounts a tmpfs on the container's /tmp: the files go to /srv.)
in_root() {
  systemd-nspawn -q -D "$root" --register=no --keep-unit --pipe \
    -E PATH=/usr/sbin:/usr/bin:/sbin:/bin -E LANG=C.UTF-8 "$@" \
    2> >(grep -v 'Attempted to remove disk file system' >&2)
}

echo "== $suite: $(in_root getconf GNU_LIBC_VERSION)"
in_root apt-get install -y -q --no-install-recommends /srv/tapegate.deb >/dev/null
in_root tapegate --version
echo password > "$root/etc/tapegate/password"
in_root tapegate check --config-only --config /etc/tapegate/config.toml
cat > "$root/srv/trace.jsonl" <<'TRACE'
{"ts": 1763719200.1, "mac": "C0:FF:EE:00:00:01", "rssi": -61, "manufacturer_data": {"3831": "4956e29f84211e44ffb51e"}}
{"ts": 1763719201.1, "mac": "C0:FF:EE:00:00:02", "rssi": -70, "manufacturer_data": {"3831": "4956e29f84211e44ffb51f"}}
{"ts": 1763719202.1, "mac": "11:22:33:44:55:66", "manufacturer_data": {"76": "0215"}}
TRACE
cat > "$root/srv/replay.toml" <<'CONF'
[gateway]
id = "ci-debian"
state_dir = "/srv/state"
[scanner]
source = "replay"
replay_path = "/srv/trace.jsonl"
CONF
in_root tapegate run --until-drained --config /srv/replay.toml 2>/dev/null
pending=$(in_root tapegate status --json --config /srv/replay.toml | sed -n 's/.*"pending": \([0-9]*\).*/\1/p')
[ "$pending" = "2" ] || { echo "$suite: expected 2 captures pending after the replay, got '$pending'" >&2; exit 1; }
echo "$suite: installed with apt, ran, replayed: $pending captures pending, as expected"
