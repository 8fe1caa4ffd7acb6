#!/bin/bash
# What a boot of the power-cut VM finds before the daemon starts again
# (tests/vm_x86_64/power/), in one trip through the agent: the state directory's files,
# what the daemon of the boot before said of a corrupt database, `PRAGMA quick_check`,
# the schema version, the witness's read of the outbox (a connection that may recover
# the WAL a cut left), and `tapegate status --json` when the outbox has this version's
# schema (SCHEMA). Each part starts with a line `== name`; no outbox: `== none`.
# Usage: boot-check.sh SCHEMA
db=/var/lib/tapegate/outbox.db
[ -e "$db" ] || { echo "== none"; exit 0; }
echo "== files"
ls -a /var/lib/tapegate
echo "== said"
# The journal is persistent: the boot before's lines that reached the disk.
journalctl --no-pager -o cat -u tapegate -b -1 2>/dev/null | grep -i 'moved aside\|corrupt'
echo "== quick_check"
runuser -u tapegate -- sqlite3 -bail "$db" 'PRAGMA quick_check;' 2>&1
echo "== user_version"
version=$(runuser -u tapegate -- sqlite3 -bail "$db" 'PRAGMA user_version;' 2>&1)
echo "$version"
echo "== snapshot"
rm -f /tmp/snap
(cd /tmp && runuser -u tapegate -- /bin/bash /share/witness.sh /tmp/snap once)
cat /tmp/snap 2>/dev/null
echo "== status"
[ "$version" != "$1" ] || tapegate status --json 2>&1
