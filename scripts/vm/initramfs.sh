#!/usr/bin/env bash
# A tiny initramfs for the VM tests: busybox (static, the host's busybox-static), the
# modules the root disk needs (virtio on PCI or MMIO, ext4) with their dependencies as the root's
# modules.dep lists them, and an /init that loads them, mounts /dev/vda and hands over
# to the root's systemd.
# Usage: scripts/vm/initramfs.sh ROOT KERNEL_ABI OUT   (ROOT has lib/modules/ABI, depmod run)
set -euo pipefail
ROOT=${1:?root}; ABI=${2:?abi}; OUT=${3:?out}
MODS=$ROOT/lib/modules/$ABI
BUSYBOX=${BUSYBOX:-/bin/busybox}
! ldd "$BUSYBOX" >/dev/null 2>&1 \
  || { echo "initramfs.sh: $BUSYBOX is not static (apt-get install busybox-static)" >&2; exit 1; }

w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
mkdir -p "$w"/{bin,dev,proc,sys,newroot,mods}
cp "$BUSYBOX" "$w/bin/busybox"

# Each wanted module after its dependencies (modules.dep: "path: dep dep ...", the
# dependencies of a module listed so that the last must be loaded first).
deps() {
  local path
  path=$(awk -v m="/$1.ko" 'index($1, m ":") {sub(":", "", $1); print $1; exit}' "$MODS/modules.dep")
  [ -n "$path" ] || return 0
  awk -v p="$path:" '$1 == p {for (i = NF; i > 1; i--) print $i}' "$MODS/modules.dep"
  echo "$path"
}
for m in virtio_pci virtio_mmio virtio_blk crc32c_generic ext4; do deps "$m"; done | awk '!seen[$0]++' > "$w/order"
: > "$w/mods/order"
while read -r p; do
  cp "$MODS/$p" "$w/mods/"
  basename "$p" >> "$w/mods/order"
done < "$w/order"
rm "$w/order"

cat > "$w/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod "/mods/$m" 2>/dev/null; done
for i in $(seq 1 50); do [ -b /dev/vda ] && break; sleep 0.1; done
mount -t ext4 -o rw /dev/vda /newroot || { echo "initramfs: cannot mount /dev/vda"; exec sh; }
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /lib/systemd/systemd
INIT
chmod +x "$w/init"
(cd "$w" && find . | cpio -o -H newc --quiet | gzip -1) > "$OUT.partial"
mv "$OUT.partial" "$OUT"
