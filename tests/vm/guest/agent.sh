#!/bin/bash
# The VM tests' agent, run in the guest by systemd (vm-agent.service) from the 9p share.
#
# The host drops shell scripts into DIR (the share): `N.sh`, renamed into place whole.
# Each runs at once, in the background, as root under bash; its stdout and stderr go to
# `N.out` and `N.err`, and its exit status is written to `N.rc` last (renamed into
# place), so that the host, which reads the share directly, knows the other two are
# complete. `ready` holds this boot's id once the agent runs. The VM has no network:
# this and the share are the only way in.
#
# Bash alone, started early in the boot (before sysinit.target): a Python agent took
# half a minute of a TCG boot to start on a loaded machine.
set -u
DIR=${1:-/share/agent}
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LANG=C.UTF-8
HOME=/root

put() {
  printf '%s' "$2" > "$1.tmp" && mv -f "$1.tmp" "$1"
}

mkdir -p "$DIR"
# A pause without a process per turn: a read with a timeout on a FIFO nobody writes.
mkfifo -m 600 /run/vm-agent.pause 2>/dev/null
exec 9<> /run/vm-agent.pause
put "$DIR/ready" "$(cat /proc/sys/kernel/random/boot_id)"
declare -A started
shopt -s nullglob
while :; do
  for script in "$DIR"/*.sh; do
    name=${script##*/}
    [ -z "${started[$name]:-}" ] || continue
    started[$name]=1
    base=${script%.sh}
    [ -e "$base.rc" ] && continue
    (
      cd /root || exit 126
      # A clean environment: none of the agent's own service's (JOURNAL_STREAM would
      # send a command's log to the journal instead of its stderr).
      env -i PATH="$PATH" LANG="$LANG" HOME="$HOME" SYSTEMD_PAGER= SYSTEMD_COLORS=0 \
        bash "$script" < /dev/null > "$base.out" 2> "$base.err" 9<&-
      put "$base.rc" "$?
"
    ) &
  done
  read -r -t 0.1 -u 9 _ || true
done
