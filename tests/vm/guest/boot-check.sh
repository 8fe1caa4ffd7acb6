#!/bin/bash
# What a boot of the power-cut VM finds before the daemon starts again
# (tests/vm_x86_64/power/), in one trip through the agent: the state directory's files,
# `PRAGMA quick_check` and the schema version, the witness's read of the outbox (a
# connection that may recover the WAL a cut left), and `tapegate status --json` when
# the outbox has this version's schema (SCHEMA). Each part starts with a line
# `== name`; no outbox: `== none`. As the service user, by setpriv (runuser's PAM
# session costs a second or two under TCG).
# Usage: boot-check.sh SCHEMA
db=/var/lib/tapegate/outbox.db
[ -e "$db" ] || { echo "== none"; exit 0; }
as_tapegate() { setpriv --reuid=tapegate --regid=tapegate --clear-groups "$@"; }
echo "== files"
ls -a /var/lib/tapegate
echo "== quick_check"
checked=$(as_tapegate sqlite3 -bail "$db" 'PRAGMA quick_check;' 'PRAGMA user_version;' 2>&1)
echo "$checked" | head -n -1
echo "== user_version"
version=$(echo "$checked" | tail -1)
echo "$version"
echo "== snapshot"
rm -f /tmp/snap
(cd /tmp && as_tapegate /bin/bash /share/witness.sh /tmp/snap once)
cat /tmp/snap 2>/dev/null
echo "== status"
[ "$version" != "$1" ] || tapegate status --json 2>&1
