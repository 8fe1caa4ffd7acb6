#!/usr/bin/env bash
# What the VM tests boot (tests/vm/), built from Debian's own packages on this machine's
# apt mirror and Bumble's wheels from PyPI, and cached:
#   - the kernel of Debian's kernel metapackage (its current ABI), unpacked;
#   - a busybox initramfs that loads the modules for the root disk and hands over to it;
#   - a Debian root made with debootstrap (systemd as PID 1, bluez, python3 with Bumble
#     in /opt/bumble, sqlite3), with the kernel's modules and a unit that runs the
#     test's agent from the 9p share, as a raw ext4 disk image compressed with zstd.
# A foreign architecture (arm64, armhf on an amd64 machine) is debootstrapped in two
# stages, the second run under qemu-user through binfmt_misc (qemu-user-static's
# handlers, registered here when the machine has not); its kernel package is fetched
# by the new root's own apt (the machine's apt needs no foreign architecture), and its
# initramfs takes the root's own static busybox.
# Everything a test changes (the package under test, the agent, the radio) comes through
# the share at run time, so the image depends only on the packages and this script.
#
# Usage: scripts/vm/image.sh OUT_DIR
#   env: DEB_ARCH (amd64), KERNEL_PACKAGE (linux-image-amd64), SUITE (bookworm),
#        BUMBLE (bumble==0.0.236), PYTHON_VERSION (3.11, the suite's), WHEEL_PLATFORM
#        (x86_64), IMAGE_MB (2048), KEY (a cache key the caller adds: its own inputs),
#        PACKAGES (what debootstrap includes; BUMBLE=none for a root without Bumble)
# Prints, on stdout, KERNEL=, INITRD=, IMAGE= and KERNEL_ABI= lines; progress on stderr.
# Needs root, debootstrap, dpkg-deb, cpio, busybox-static, zstd, mkfs.ext4 and pip.
set -euo pipefail

OUT=${1:?usage: image.sh OUT_DIR}
DEB_ARCH=${DEB_ARCH:-amd64}
KERNEL_PACKAGE=${KERNEL_PACKAGE:-linux-image-amd64}
SUITE=${SUITE:-bookworm}
BUMBLE=${BUMBLE:-bumble==0.0.236}
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
WHEEL_PLATFORM=${WHEEL_PLATFORM:-x86_64}
IMAGE_MB=${IMAGE_MB:-2048}
PACKAGES=${PACKAGES:-systemd,systemd-sysv,dbus,bluez,python3,python3-venv,kmod,udev,procps,adduser,sqlite3}
HERE=$(cd "$(dirname "$0")" && pwd)
FOREIGN=
[ "$DEB_ARCH" = "$(dpkg --print-architecture)" ] || FOREIGN=1

say() { echo "image.sh: $*" >&2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# The Debian mirror this machine's apt already uses for $SUITE (no host name is written
# here): a deb822 stanza of /etc/apt/sources.list.d/*.sources whose Suites has it, or a
# `deb` line of /etc/apt/sources.list.
mirror() {
  { awk -v suite="$SUITE" 'BEGIN { RS = "" }
      { uri = ""; ok = 0; n = split($0, line, "\n")
        for (i = 1; i <= n; i++) {
          if (line[i] ~ /^URIs:/) { split(line[i], w, " "); uri = w[2] }
          if (line[i] ~ /^Suites:/) { m = split(line[i], w, " "); for (j = 2; j <= m; j++) if (w[j] == suite) ok = 1 }
        }
        if (ok && uri != "") print uri }' /etc/apt/sources.list.d/*.sources 2>/dev/null
    awk -v suite="$SUITE" '$1 == "deb" { f = 2; if ($2 ~ /^\[/) while ($f !~ /\]$/) f++; if ($2 ~ /^\[/) f++
      if ($(f + 1) == suite) print $f }' /etc/apt/sources.list 2>/dev/null
    true; } | head -1
}

# The kernel package the metapackage names now (the archive keeps only the current ABI),
# by the machine's apt, or by the root's apt in ROOT (a foreign one).
kernel_package() {
  local apt=(apt-cache depends "$KERNEL_PACKAGE:$DEB_ARCH")
  [ -z "${1:-}" ] || apt=(chroot "$1" apt-cache depends "$KERNEL_PACKAGE")
  "${apt[@]}" 2>/dev/null \
    | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}' | sed 's/:.*//'
}

# Runs the foreign architecture's binaries through qemu-user-static: its binfmt_misc
# handler registered, as systemd-binfmt does at boot (F: the interpreter opened now, so
# it works inside a chroot).
binfmt() {
  local q
  case "$DEB_ARCH" in arm64) q=aarch64 ;; armhf) q=arm ;; *) q=$DEB_ARCH ;; esac
  [ -e /proc/sys/fs/binfmt_misc/register ] \
    || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  [ -e "/proc/sys/fs/binfmt_misc/qemu-$q" ] && return 0
  [ -f "/usr/lib/binfmt.d/qemu-$q.conf" ] \
    || { say "no /usr/lib/binfmt.d/qemu-$q.conf (apt-get install qemu-user-static)"; exit 1; }
  say "binfmt_misc: registering qemu-$q"
  grep -v '^#' "/usr/lib/binfmt.d/qemu-$q.conf" > /proc/sys/fs/binfmt_misc/register
}

# Fetches and unpacks kernel package $1 into KDIR (by the root's apt in $2, if given).
fetch_kernel() {
  local dl
  say "kernel: $1"
  rm -rf "$KDIR"
  mkdir -p "$KDIR"
  if [ -n "${2:-}" ]; then
    mkdir -p "$2/tmp/kernel"
    chroot "$2" sh -c "cd /tmp/kernel && apt-get download -q -o APT::Sandbox::User=root $1" >&2
    dl=$2/tmp/kernel
  else
    dl=$OUT/dl
    rm -rf "$dl"
    mkdir -p "$dl"
    # apt's sandbox user cannot write to a directory under root's home: download as root.
    (cd "$dl" && apt-get download -q -o APT::Sandbox::User=root "$1:$DEB_ARCH" >&2)
  fi
  dpkg-deb -x "$dl"/"$1"_*.deb "$KDIR"
  rm -rf "$dl"
  touch "$KDIR/.done"
}

# The root as debootstrap made it, kept as a tarball (the slow step: a few minutes; a
# foreign root's second stage, under qemu-user, several). A foreign root's kernel is
# fetched with it, from the same state of the archive, and its ABI kept beside it.
BASE=$OUT/$SUITE-$DEB_ARCH-base-$(echo "$PACKAGES" | cksum | cut -d' ' -f1).tar.zst
[ -z "$FOREIGN" ] || binfmt
if [ -z "$FOREIGN" ]; then
  KPKG=$(kernel_package)
  if [ -z "$KPKG" ]; then
    say "apt knows no $KERNEL_PACKAGE yet: apt-get update"
    apt-get update -qq >&2
    KPKG=$(kernel_package)
  fi
  [ -n "$KPKG" ] || { say "apt knows no $KERNEL_PACKAGE for $DEB_ARCH (apt-get update?)"; exit 1; }
  ABI=${KPKG#linux-image-}
  KDIR=$OUT/kernel-$ABI
  [ -f "$KDIR/.done" ] || fetch_kernel "$KPKG"
fi
if [ ! -f "$BASE" ]; then
  MIRROR=$(mirror)
  [ -n "$MIRROR" ] || { say "no Debian mirror in this machine's apt sources"; exit 1; }
  say "debootstrap $SUITE ($DEB_ARCH) from the machine's mirror (a few minutes, cached)"
  tmp=$(mktemp -d "$OUT/debootstrap.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  if [ -n "$FOREIGN" ]; then
    { debootstrap --foreign --variant=minbase --arch="$DEB_ARCH" --include="$PACKAGES" \
        "$SUITE" "$tmp" "$MIRROR" && chroot "$tmp" /debootstrap/debootstrap --second-stage; } \
      > "$OUT/debootstrap.log" 2>&1 || { tail -20 "$OUT/debootstrap.log" >&2; exit 1; }
    KPKG=$(kernel_package "$tmp")
    [ -n "$KPKG" ] || { say "the $DEB_ARCH root's apt knows no $KERNEL_PACKAGE"; exit 1; }
    ABI=${KPKG#linux-image-}
    KDIR=$OUT/kernel-$ABI
    fetch_kernel "$KPKG" "$tmp"
    echo "$ABI" > "$BASE.abi"
  else
    debootstrap --variant=minbase --arch="$DEB_ARCH" --include="$PACKAGES" \
      "$SUITE" "$tmp" "$MIRROR" > "$OUT/debootstrap.log" 2>&1 \
      || { tail -20 "$OUT/debootstrap.log" >&2; exit 1; }
  fi
  tar -C "$tmp" --zstd -cf "$BASE.partial" .
  mv "$BASE.partial" "$BASE"
  rm -rf "$tmp"
  trap - EXIT
fi
if [ -n "$FOREIGN" ]; then
  ABI=$(cat "$BASE.abi")
  KDIR=$OUT/kernel-$ABI
fi
VMLINUZ=$(ls "$KDIR"/boot/vmlinuz-* | head -1)

# The image: the base, the kernel's modules, Bumble, the agent's unit. Keyed on
# everything that goes into it.
KEY=$( { cat "$0" "$HERE/initramfs.sh"; echo "$ABI $BUMBLE $PYTHON_VERSION $IMAGE_MB $PACKAGES ${KEY:-}"; } | cksum | cut -d' ' -f1)
IMAGE=$OUT/root-$SUITE-$DEB_ARCH-$ABI-$KEY.img.zst
INITRD=$OUT/initrd-$ABI-$KEY.img
if [ ! -f "$IMAGE" ] || [ ! -f "$INITRD" ]; then
  root=$(mktemp -d "$OUT/root.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  say "root: unpacking the base"
  tar -C "$root" --zstd -xf "$BASE"
  chmod 755 "$root"

  say "root: the kernel's modules"
  mkdir -p "$root/lib/modules"
  cp -a "$KDIR/lib/modules/$ABI" "$root/lib/modules/"
  chroot "$root" depmod "$ABI"

  if [ "$BUMBLE" != none ]; then
    say "root: $BUMBLE (wheels for CPython $PYTHON_VERSION from PyPI, installed offline)"
    platforms=()
    for v in 36 35 34 33 32 31 30 29 28 27 26 25 24 23 22 21 20 19 18 17 5; do
      platforms+=(--platform "manylinux_2_${v}_$WHEEL_PLATFORM")
    done
    platforms+=(--platform "manylinux2014_$WHEEL_PLATFORM" --platform "manylinux1_$WHEEL_PLATFORM")
    mkdir -p "$root/tmp/wheels"
    python3 -m pip download -q --disable-pip-version-check --only-binary=:all: \
      --python-version "$PYTHON_VERSION" --implementation cp "${platforms[@]}" \
      -d "$root/tmp/wheels" "$BUMBLE" >&2
    chroot "$root" python3 -m venv /opt/bumble
    chroot "$root" env -u PIP_FIND_LINKS /opt/bumble/bin/pip install -q --no-index \
      --disable-pip-version-check --find-links /tmp/wheels "$BUMBLE" >&2
    rm -rf "$root/tmp/wheels"
  fi

  say "root: the share, the agent, a quiet boot"
  echo tapegate-vm > "$root/etc/hostname"
  mkdir -p "$root/share"
  cat > "$root/etc/fstab" <<'FSTAB'
/dev/vda / ext4 rw,errors=remount-ro 0 1
share /share 9p trans=virtio,version=9p2000.L,msize=262144,nofail 0 0
FSTAB
  # The agent (bash, tests/vm/guest/agent.sh) starts as soon as systemd does, before
  # sysinit.target, mounting the share itself: waiting for multi-user.target and a
  # Python start cost half of a TCG boot. What it runs waits for what it needs
  # (`systemctl start` for the unit's own dependencies).
  cat > "$root/etc/systemd/system/vm-agent.service" <<'UNIT'
[Unit]
Description=The VM test's agent: runs the commands the host puts in /share/agent
DefaultDependencies=no

[Service]
ExecStartPre=/bin/sh -c 'mountpoint -q /share || mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share'
ExecStart=/bin/bash /share/agent.sh /share/agent
Restart=always
RestartSec=1

[Install]
WantedBy=sysinit.target
UNIT
  mkdir -p "$root/etc/systemd/system/sysinit.target.wants"
  ln -sf /etc/systemd/system/vm-agent.service \
    "$root/etc/systemd/system/sysinit.target.wants/vm-agent.service"
  # No timers, network waits, scrubs or consoles in a test machine with no network.
  for unit in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
      fstrim.timer systemd-networkd-wait-online.service e2scrub_reap.service \
      getty@tty1.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
  done
  # The journal persistent, so that it survives the VM's power being cut.
  mkdir -p "$root/var/log/journal"

  say "image: ext4 of ${IMAGE_MB} MB"
  raw=$(mktemp "$OUT/image.XXXXXX")
  mkfs.ext4 -q -F -L tapegate-vm -d "$root" "$raw" "${IMAGE_MB}M"
  zstd -q -T0 --rm -f "$raw" -o "$IMAGE.partial"
  mv "$IMAGE.partial" "$IMAGE"

  say "initramfs"
  # A foreign root brings its own static busybox (PACKAGES has busybox-static).
  if [ -n "$FOREIGN" ]; then
    BUSYBOX=$root/bin/busybox "$HERE/initramfs.sh" "$root" "$ABI" "$INITRD"
  else
    "$HERE/initramfs.sh" "$root" "$ABI" "$INITRD"
  fi
  rm -rf "$root"
  trap - EXIT
fi

echo "KERNEL=$VMLINUZ"
echo "INITRD=$INITRD"
echo "IMAGE=$IMAGE"
echo "KERNEL_ABI=$ABI"
