#!/usr/bin/env bash
# Builds a signed apt repository (flat layout) from .deb files, the way a fleet serves
# tapegate to its gateways (see README, "Upgrading a fleet"):
#
#   scripts/apt-repo.sh REPO_DIR tapegate_*.deb...
#
# REPO_DIR gets the packages, Packages(.gz), Release, InRelease and Release.gpg, and
# key.gpg (the public key, for `signed-by=` on the gateways). The signing key is taken
# from $GNUPGHOME when set (a real fleet's release key); otherwise a throwaway key is
# made once in REPO_DIR.gnupg and reused by later runs (tests, trials). Needs gpg and
# apt-ftparchive (apt-utils). Running it again with more packages re-signs the index.
#
# A gateway then uses it with:
#   deb [signed-by=/usr/share/keyrings/tapegate.gpg] https://repo.example/tapegate ./
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 REPO_DIR DEB..." >&2
  exit 2
fi
repo=$1
shift
command -v apt-ftparchive >/dev/null || { echo "apt-ftparchive missing: apt-get install apt-utils" >&2; exit 1; }
command -v gpg >/dev/null || { echo "gpg missing: apt-get install gnupg" >&2; exit 1; }

mkdir -p "$repo"
repo=$(cd "$repo" && pwd)
if [ -z "${GNUPGHOME:-}" ]; then
  export GNUPGHOME="$repo.gnupg"
  if [ ! -d "$GNUPGHOME" ]; then
    mkdir -m 700 "$GNUPGHOME"
    # A throwaway signing key without a passphrase: for tests and trials only.
    gpg --batch --quiet --passphrase '' --quick-gen-key \
      "tapegate test repository <tapegate@example.invalid>" ed25519 sign never
  fi
fi
key=$(gpg --batch --with-colons --list-secret-keys | awk -F: '$1 == "fpr" {print $10; exit}')
[ -n "$key" ] || { echo "no signing key in $GNUPGHOME" >&2; exit 1; }

for deb in "$@"; do
  cp -f "$deb" "$repo/"
done
cd "$repo"
apt-ftparchive packages . > Packages
gzip -9 -k -f Packages
apt-ftparchive \
  -o APT::FTPArchive::Release::Origin=tapegate \
  -o APT::FTPArchive::Release::Label=tapegate \
  -o APT::FTPArchive::Release::Suite=stable \
  -o APT::FTPArchive::Release::Codename=tapegate \
  release . > Release
rm -f InRelease Release.gpg
gpg --batch --yes --local-user "$key" --clearsign -o InRelease Release
gpg --batch --yes --local-user "$key" --armor --detach-sign -o Release.gpg Release
gpg --batch --yes --export "$key" > key.gpg
echo "signed repository in $repo ($(ls ./*.deb | wc -l) packages, key $key)"
