#!/usr/bin/env bash
# The C library floor of packages, held to what they claim: for each .deb given, the
# highest GLIBC_ symbol version its binary references (its ELF version needs, read
# with binutils' readelf, which reads every architecture's) against the version its
# `Depends: libc6 (>= X)` claims. Fails when the binary needs more than the package
# says: apt would install it where the daemon fails at exec.
#   scripts/check-glibc.sh target/*/debian/tapegate_*.deb
set -euo pipefail

status=0
for deb in "$@"; do
  tmp=$(mktemp -d)
  dpkg-deb -x "$deb" "$tmp"
  needs=$(readelf -W --version-info "$tmp/usr/bin/tapegate" \
    | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -uV | tail -1)
  rm -rf "$tmp"
  depends=$(dpkg-deb -f "$deb" Depends)
  claims=$(sed -n 's/.*libc6[^,]*(>= *\([0-9][0-9.]*\)).*/\1/p' <<<"$depends")
  arch=$(dpkg-deb -f "$deb" Architecture)
  if [ -z "$needs" ] || [ -z "$claims" ]; then
    echo "$deb ($arch): cannot tell (binary needs '${needs}', Depends: $depends)" >&2
    status=1
  elif dpkg --compare-versions "$needs" gt "$claims"; then
    echo "$deb ($arch): the binary needs GLIBC_$needs, the package claims libc6 (>= $claims)" >&2
    status=1
  else
    echo "$deb ($arch): needs GLIBC_$needs, claims libc6 (>= $claims): ok"
  fi
done
exit $status
