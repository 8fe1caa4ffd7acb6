#!/usr/bin/env python3
"""The VM tests' agent, run in the guest by systemd (vm-agent.service) from the 9p share.

The host drops shell scripts into DIR (the share): `N.sh`, renamed into place whole. Each
runs at once, on a thread of its own, as root under bash; its stdout and stderr go to
`N.out` and `N.err`, and its exit status is written to `N.rc` last (renamed into place),
so that the host, which reads the share directly, knows the other two are complete.
`ready` holds this boot's id once the agent runs. The VM has no network: this and the
share are the only way in.
"""
import os
import subprocess
import sys
import threading
import time

DIR = sys.argv[1] if len(sys.argv) > 1 else "/share/agent"
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "SYSTEMD_PAGER": "",
    "SYSTEMD_COLORS": "0",
}


def put(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def run(name):
    base = os.path.join(DIR, name[:-3])
    with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
        try:
            rc = subprocess.call(
                ["/bin/bash", os.path.join(DIR, name)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=ENV, cwd="/root",
            )
        except OSError as e:
            err.write(str(e).encode())
            rc = 126
    put(base + ".rc", "%d\n" % rc)


def main():
    os.makedirs(DIR, exist_ok=True)
    with open("/proc/sys/kernel/random/boot_id") as f:
        put(os.path.join(DIR, "ready"), f.read())
    started = set()
    while True:
        try:
            names = os.listdir(DIR)
        except OSError:
            names = []
        for name in sorted(names):
            if name.endswith(".sh") and name not in started:
                if name[:-3] + ".rc" in names:
                    started.add(name)
                    continue
                started.add(name)
                threading.Thread(target=run, args=(name,), daemon=True).start()
        time.sleep(0.1)


main()
