#!/bin/bash
# What a reader of the outbox sees committed, written to the share as fast as it can
# read it (the VM tests' power cuts, tests/vm_x86_64/power/). Each snapshot is one read
# transaction, so its counters and its pending rows are one committed state: lines
# `C name value` (the counters table) and `P MAC SECONDS PACKET` (each pending row; a
# packet kept as its bytes, or as text by an older schema, written as hex digits).
# It is renamed into place whole, so the file always holds the last complete snapshot,
# and the 9p share hands each write to the host at once: it outlives a power cut.
# A reader in WAL mode sees a transaction only once its commit has been written (and,
# with synchronous=FULL, synced): what it saw is what the daemon committed.
# Usage: witness.sh OUT [once]   (runs as the service user until killed, or once)
out=$1
db=/var/lib/tapegate/outbox.db
# Beside a running daemon, read only; once (before it starts), a connection that may
# recover the WAL a cut left.
ro=-readonly
[ "${2:-}" != once ] || ro=
while :; do
  if [ -e "$db" ] && sqlite3 $ro -bail -batch "$db" > "$out.tmp" 2>/dev/null <<'SQL'
.timeout 2000
BEGIN;
SELECT 'C ' || name || ' ' || value FROM counters;
SELECT printf('P %012X %d %s', mac, captured_at / 1000,
  CASE typeof(packet) WHEN 'blob' THEN hex(packet) ELSE packet END) FROM pending;
COMMIT;
SQL
  then
    mv -f "$out.tmp" "$out"
  fi
  # A breath for the daemon on the guest's one CPU.
  [ "${2:-}" != once ] || exit 0
  sleep 0.1
done
