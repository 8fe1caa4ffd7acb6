#!/usr/bin/env python3
"""A small stand-in for the tracking service, for the Arm VMs (tests/vm_arm.rs).

The package's binary has no mock service (it is built without the `mock` feature), and
an Arm build of the test binary with it would cost a second release build per
architecture; the VM has no network. So this serves, on the VM's loopback, the two
endpoints a gateway's delivery uses: the token (spec 5: any password grant gets a
bearer token) and the bulk decode (spec 4.4: a JSON array of items, each answered
decoded with its mac_id and a qr_code), and appends each item it received to RECORD as
one JSON line (`mac_id`, `ble_packet`, `scan_time`, `product_id`, `status`), as
`tapegate mock --record` does. The mock service's rules (faults, limits, the device
registry) are tested on x86_64 (tests/api_mock.rs, tests/vm_power.rs).
Usage: mock.py PORT RECORD
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
RECORD = open(sys.argv[2], "a", buffering=1)


class Handler(BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.endswith("/oauth/token"):
            return self.answer(200, {"access_token": "vm-token", "token_type": "Bearer",
                                     "expires_in": 3600})
        if not self.path.endswith("/external/v1/devices/decode"):
            return self.answer(404, {"message": "not found"})
        if self.headers.get("Authorization") != "Bearer vm-token":
            return self.answer(401, {"message": "Unauthorized"})
        items = json.loads(body)
        out = []
        for item in items:
            RECORD.write(json.dumps(dict(item, status=200)) + "\n")
            mac = item["mac_id"].replace(":", "").upper()
            out.append({"mac_id": item["mac_id"], "qr_code": "TT" + mac, "cts": 1,
                        "ts": int(item["scan_time"]), "bat": 90, "temp": 5.0})
        self.answer(200, out)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
