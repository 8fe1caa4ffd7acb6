#!/usr/bin/env python3
"""The air of the VM tests: one emulated controller on /dev/vhci (the kernel's hci0) and
the advertisers it hears (tapes and other devices), driven by commands.

The controller is Google Bumble's (`bumble.controller.Controller`), told apart from it
in what it reports, so that the kernel sees what a real controller would send:
- each advertiser has its own RSSI;
- `extended` lists the extended scan commands as supported, so that Linux scans with
  them (Bumble's own controller has the feature but lists only the legacy commands),
  and `legacy` takes the Extended Advertising feature away;
- reports follow the scan the host started: extended reports (an ADV_IND with the
  legacy-PDU bits, which the kernel merges with its scan response as from a real
  controller; Bumble's own sends extended reports to a legacy scan, as extended PDUs
  that the kernel does not merge) or legacy ones;
- a scan response (the advertiser's own, possibly empty) follows only in an active
  scan, after a scan request, and the scan requests are counted per advertiser;
- `wedge` makes it stop reporting while it answers every command, until the host
  resets it (HCI Reset, sent when the adapter is powered on again).
The advertisers are not controllers: each is a timer that hands its PDU to the
controller at its interval (with the 0-10 ms advDelay of the spec).

Commands, one per line on the FIFO /run/radio.fifo, each `SEQ COMMAND [ARGS]`; the
answer `SEQ ok [JSON]` or `SEQ error WHY` is appended to ACKS (the share):
  tape MAC [rssi=N] [interval=MS] [company=HEX] [counter=N] [step=N] [name=S] [short=S] [nul=1]
                       add or change an advertiser of manufacturer data (a tape by
                       default: company 0EF7, the tape's 11-byte payload whose counter
                       moves by `step` each advert (0: fixed); complete name `name` in
                       the scan response, shortened `short` in the advert, `nul=1` a
                       NUL after the complete name)
  data MAC HEX         the payload after the company identifier (the counter stops)
  off MAC | on MAC     stop / start its advertising
  fleet N [interval=MS] [rssi=N] [step=N]
                       N tapes C0:FF:EE:10:00:01 onwards
  quiet                every advertiser stops (what they did is kept for `stats`)
  clear                every advertiser gone
  wedge                stop reporting until the next HCI Reset
  unplug               close /dev/vhci: the kernel's controller is removed
  plug [legacy|extended]
                       open it again: a new controller (Extended Advertising feature or not)
  stats                per advertiser: adverts sent, reports given, scan requests, last counter,
                       the last counter reported and how many reports in a row had it
"""
import asyncio
import json
import os
import random
import sys

from bumble import hci
from bumble.controller import Controller
from bumble.transport import open_transport

FIFO = "/run/radio.fifo"
ACKS = sys.argv[1] if len(sys.argv) > 1 else "/share/radio/acks"
FEATURES = sys.argv[2] if len(sys.argv) > 2 else "extended"
ADDRESS = "F0:F1:F2:F3:F4:F5"
# Every advertiser's address is a static random one.
RANDOM = 1
# Event types of an extended report of a legacy PDU (Core 5.x, Vol 4, Part E, 7.7.65.13).
EXT_ADV_IND = 0b0010011
EXT_SCAN_RSP_TO_ADV_IND = 0b0011011


def ad(ad_type, body):
    return bytes([len(body) + 1, ad_type]) + body


class Advertiser:
    """One device advertising ADV_IND at its interval."""

    def __init__(self, radio, mac, opts):
        self.radio = radio
        self.mac = mac
        self.le_address = bytes.fromhex(mac.replace(":", ""))[::-1]
        self.company = 0x0EF7
        self.rssi = -60
        self.interval = 0.2
        self.counter = 0
        self.step = 1
        self.fixed = None
        self.name = None
        self.short = None
        self.nul = False
        self.sent = 0
        self.reported = 0
        self.scan_requests = 0
        self.last_counter = None
        self.last_reported_counter = None
        # Reports in a row of the last reported counter.
        self.reported_repeats = 0
        self.timer = None
        self.set(opts)

    def set(self, opts):
        for key, value in opts.items():
            if key == "rssi":
                self.rssi = int(value)
            elif key == "interval":
                self.interval = int(value) / 1000
            elif key == "company":
                self.company = int(value, 16)
            elif key == "counter":
                self.counter = int(value)
            elif key == "step":
                self.step = int(value)
            elif key == "name":
                self.name = value
            elif key == "short":
                self.short = value
            elif key == "nul":
                self.nul = value == "1"
            else:
                raise ValueError("unknown option " + key)

    def payload(self):
        if self.fixed is not None:
            return self.fixed
        serial = bytes.fromhex(self.mac.replace(":", ""))[3:][::-1]
        c = self.counter & 0xFFFF
        return bytes([0x49, 0x56, c & 0xFF, c >> 8, 0x3C, 0x0A, 0x64, 0x00]) + serial

    def data(self):
        body = self.company.to_bytes(2, "little") + self.payload()
        d = ad(0x01, b"\x06") + ad(0xFF, body)
        if self.short:
            d += ad(0x08, self.short.encode())
        return d

    def scan_response(self):
        if not self.name:
            return b""
        return ad(0x09, self.name.encode() + (b"\x00" if self.nul else b""))

    def start(self):
        self.stop()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(random.uniform(0, self.interval), self.fire)

    def stop(self):
        if self.timer:
            self.timer.cancel()
            self.timer = None

    def fire(self):
        self.sent += 1
        self.last_counter = self.counter if self.fixed is None else None
        self.radio.hear(self)
        if self.fixed is None:
            self.counter += self.step
        delay = self.interval + random.uniform(0, 0.01)
        self.timer = asyncio.get_running_loop().call_later(delay, self.fire)


class Scanner(Controller):
    """Bumble's controller, reporting what it hears as a real one would (see above)."""

    wedged = False
    ext_scan_type = 0
    # Whether the host scans with the extended commands (then the reports are extended).
    ext_scanning = False

    def on_hci_reset_command(self, command):
        self.wedged = False
        return super().on_hci_reset_command(command)

    def on_hci_le_set_extended_scan_parameters_command(self, command):
        self.ext_scan_type = command.scan_types[0] if command.scan_types else 0
        return super().on_hci_le_set_extended_scan_parameters_command(command)

    def on_hci_le_set_extended_scan_enable_command(self, command):
        self.ext_scanning = True
        return super().on_hci_le_set_extended_scan_enable_command(command)

    def on_hci_le_set_scan_enable_command(self, command):
        self.ext_scanning = False
        return super().on_hci_le_set_scan_enable_command(command)

    def active(self):
        return (self.ext_scan_type if self.ext_scanning else self.le_scan_type) == 1

    def on_advertising_pdu(self, pdu):
        # Nothing on the link reaches this controller but the advertisers' PDUs below.
        pass

    def hear(self, adv):
        if not self.le_scan_enable or self.wedged or not self.host:
            return
        if adv.last_reported_counter == adv.last_counter:
            adv.reported_repeats += 1
        else:
            adv.reported_repeats = 1
        adv.last_reported_counter = adv.last_counter
        adv.reported += 1
        self.report(adv, False, adv.data())
        if self.active():
            adv.scan_requests += 1
            adv.reported += 1
            self.report(adv, True, adv.scan_response())

    def report(self, adv, scan_rsp, data):
        # The event written out here rather than with Bumble's event classes: a hundred
        # tapes a second are too many for those under TCG.
        rssi = adv.rssi & 0xFF
        if self.ext_scanning:
            kind = EXT_SCAN_RSP_TO_ADV_IND if scan_rsp else EXT_ADV_IND
            params = (
                bytes([0x0D, 1]) + kind.to_bytes(2, "little") + bytes([RANDOM]) + adv.le_address
                + bytes([1, 0, 0xFF, 0x7F, rssi, 0, 0, 0]) + bytes(6)
                + bytes([len(data)]) + data
            )
        else:
            kind = 0x04 if scan_rsp else 0x00
            params = (
                bytes([0x02, 1, kind, RANDOM]) + adv.le_address + bytes([len(data)]) + data
                + bytes([rssi])
            )
        packet = bytes([0x04, 0x3E, len(params)]) + params
        asyncio.get_running_loop().call_soon(self.host.on_packet, packet)


class Radio:
    def __init__(self):
        self.transport = None
        self.scanner = None
        self.advertisers = {}

    async def plug(self, features):
        self.transport = await open_transport("vhci")
        self.scanner = Scanner(
            "hci0",
            host_source=self.transport.source,
            host_sink=self.transport.sink,
            public_address=ADDRESS,
        )
        # Bumble's controller has the Extended Advertising feature but does not list
        # the extended scan commands as supported (so Linux scans with the legacy
        # ones): `extended` lists them, `legacy` takes the feature away.
        commands = set(self.scanner.supported_commands)
        if features == "legacy":
            self.scanner.le_features = self.scanner.le_features & ~(
                hci.LeFeatureMask.LE_EXTENDED_ADVERTISING
                | hci.LeFeatureMask.LE_PERIODIC_ADVERTISING
            )
        elif features == "extended":
            commands |= {
                hci.HCI_LE_SET_EXTENDED_SCAN_PARAMETERS_COMMAND,
                hci.HCI_LE_SET_EXTENDED_SCAN_ENABLE_COMMAND,
            }
        else:
            raise ValueError("features: legacy or extended")
        self.scanner.supported_commands = commands

    async def unplug(self):
        if self.transport:
            await self.transport.close()
        self.transport = None
        self.scanner = None

    def hear(self, adv):
        if self.scanner:
            self.scanner.hear(adv)

    def tape(self, mac, opts, start=True):
        adv = self.advertisers.get(mac)
        if adv is None:
            adv = self.advertisers[mac] = Advertiser(self, mac, opts)
        else:
            adv.set(opts)
        if start:
            adv.start()
        return adv

    async def command(self, words):
        cmd, args = words[0], words[1:]
        opts = dict(a.split("=", 1) for a in args if "=" in a)
        plain = [a for a in args if "=" not in a]
        if cmd == "tape":
            self.tape(plain[0].upper(), opts)
        elif cmd == "data":
            adv = self.advertisers[plain[0].upper()]
            adv.fixed = bytes.fromhex(plain[1])
        elif cmd == "off":
            self.advertisers[plain[0].upper()].stop()
        elif cmd == "on":
            self.advertisers[plain[0].upper()].start()
        elif cmd == "fleet":
            for i in range(1, int(plain[0]) + 1):
                self.tape("C0:FF:EE:10:%02X:%02X" % (i >> 8, i & 0xFF), opts)
        elif cmd == "quiet":
            for adv in self.advertisers.values():
                adv.stop()
        elif cmd == "clear":
            for adv in self.advertisers.values():
                adv.stop()
            self.advertisers.clear()
        elif cmd == "wedge":
            self.scanner.wedged = True
        elif cmd == "unplug":
            await self.unplug()
        elif cmd == "plug":
            await self.plug(plain[0] if plain else FEATURES)
        elif cmd == "stats":
            return {
                mac: {
                    "sent": a.sent,
                    "reported": a.reported,
                    "scan_requests": a.scan_requests,
                    "last_counter": a.last_counter,
                    "last_reported_counter": a.last_reported_counter,
                    "reported_repeats": a.reported_repeats,
                }
                for mac, a in self.advertisers.items()
            }
        else:
            raise ValueError("unknown command " + cmd)
        return None


def answer(text):
    with open(ACKS, "a") as f:
        f.write(text + "\n")


async def main():
    radio = Radio()
    os.makedirs(os.path.dirname(ACKS), exist_ok=True)
    if not os.path.exists(FIFO):
        os.mkfifo(FIFO)
    fd = os.open(FIFO, os.O_RDWR | os.O_NONBLOCK)
    await radio.plug(FEATURES)
    lines = asyncio.Queue()
    buf = bytearray()

    def readable():
        buf.extend(os.read(fd, 65536))
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            lines.put_nowait(line.decode().split())

    asyncio.get_running_loop().add_reader(fd, readable)
    answer("0 ok")
    while True:
        words = await lines.get()
        if len(words) < 2:
            continue
        seq = words[0]
        try:
            result = await radio.command(words[1:])
            answer(seq + " ok" + ("" if result is None else " " + json.dumps(result)))
        except Exception as e:  # the host reads why, and the radio goes on
            answer("%s error %s: %s" % (seq, type(e).__name__, e))


asyncio.run(main())
