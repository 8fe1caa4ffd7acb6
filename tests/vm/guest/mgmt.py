#!/usr/bin/env python3
"""The kernel's Bluetooth management socket from the VM tests' side (btmgmt 5.66 keeps
the advertisement monitor commands in an interactive submenu): one command, its answer
as JSON on stdout.

  mgmt.py monitors [INDEX]          Read Advertisement Monitor Features: the handles
  mgmt.py remove HANDLE [INDEX]     Remove Advertisement Monitor (0: every one)
  mgmt.py add COMPANY_HEX [INDEX]   Add Advertisement Patterns Monitor (manufacturer
                                    data starting with the company identifier)
  mgmt.py power on|off [INDEX]      Set Powered
"""
import ctypes
import json
import socket
import struct
import sys

AF_BLUETOOTH, BTPROTO_HCI, HCI_DEV_NONE, HCI_CHANNEL_CONTROL = 31, 1, 0xFFFF, 3
OP = {"monitors": 0x0051, "add": 0x0052, "remove": 0x0053, "power": 0x0005}


def open_control():
    s = socket.socket(AF_BLUETOOTH, socket.SOCK_RAW, BTPROTO_HCI)
    addr = struct.pack("<HHH", AF_BLUETOOTH, HCI_DEV_NONE, HCI_CHANNEL_CONTROL)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.bind(s.fileno(), addr, len(addr)) != 0:
        raise OSError(ctypes.get_errno(), "bind")
    return s


def call(s, opcode, index, params):
    s.send(struct.pack("<HHH", opcode, index, len(params)) + params)
    s.settimeout(5)
    while True:
        frame = s.recv(65536)
        code, idx, _ = struct.unpack_from("<HHH", frame)
        if code in (1, 2) and idx == index:
            op, status = struct.unpack_from("<HB", frame, 6)
            if op == opcode:
                return status, frame[9:]


def main(argv):
    cmd, args = argv[1], argv[2:]
    s = open_control()
    if cmd == "monitors":
        index = int(args[0]) if args else 0
        status, ret = call(s, OP[cmd], index, b"")
        handles = []
        if status == 0:
            n = struct.unpack_from("<H", ret, 11)[0]
            handles = list(struct.unpack_from("<%dH" % n, ret, 13))
        print(json.dumps({"status": status, "handles": handles}))
    elif cmd == "remove":
        index = int(args[1]) if len(args) > 1 else 0
        status, _ = call(s, OP[cmd], index, struct.pack("<H", int(args[0])))
        print(json.dumps({"status": status}))
    elif cmd == "add":
        index = int(args[1]) if len(args) > 1 else 0
        value = bytes.fromhex(args[0])[::-1]
        params = bytes([1, 0xFF, 0, len(value)]) + value.ljust(31, b"\0")
        status, ret = call(s, OP[cmd], index, params)
        handle = struct.unpack_from("<H", ret)[0] if status == 0 else None
        print(json.dumps({"status": status, "handle": handle}))
    elif cmd == "power":
        index = int(args[1]) if len(args) > 1 else 0
        status, _ = call(s, OP[cmd], index, bytes([1 if args[0] == "on" else 0]))
        print(json.dumps({"status": status}))
    else:
        raise SystemExit(__doc__)


main(sys.argv)
