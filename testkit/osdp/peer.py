#!/usr/bin/env python3
"""A reader for the hub's OSDP tests: the PyPI `libosdp` PeripheralDevice
(an implementation no one here wrote) on a pseudo-terminal.

It opens a raw pty, prints {"port": SLAVE_PATH} and then one JSON line per
thing the hub did to it ({"cmd": "output", ...}, {"cmd": "led", ...},
{"sc": true|false}). It reads one JSON command per line on stdin:
  {"keys": [0x31, 0x32, 0x0d]}          key presses (osdp_KEYPAD)
  {"card": true}                         a card read (osdp_RAW)
  {"status": "local"|"input", "mask": N, "n": COUNT}   an unsolicited report
  {"raw": "hex"}                         bytes written to the hub as they are
  {"pause": true} / {"pause": false}     a cut wire: read nothing, send nothing
  {"quit": true}
"""

import argparse
import json
import os
import sys
import threading
import time
import tty

import osdp


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class PtyChannel(osdp.Channel):
    def __init__(self, fd):
        super().__init__()
        self.fd = fd
        self.paused = False
        self.lock = threading.Lock()

    def read(self, max_bytes):
        try:
            data = os.read(self.fd, max_bytes)
        except (BlockingIOError, OSError):
            return b""
        return b"" if self.paused else data

    def write(self, buf):
        if self.paused:
            return len(buf)
        with self.lock:
            try:
                return os.write(self.fd, bytes(buf))
            except (BlockingIOError, OSError):
                return 0

    def raw(self, data):
        with self.lock:
            os.write(self.fd, data)

    def flush(self):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", type=int, default=1)
    ap.add_argument("--key", default="none", help="hex SCBK, or none for install mode")
    ap.add_argument("--serial", type=lambda s: int(s, 0), default=0x1234ABCD)
    ap.add_argument("--vendor", type=lambda s: int(s, 0), default=0x0A0B0C)
    ap.add_argument("--inputs", type=int, default=2)
    ap.add_argument("--outputs", type=int, default=2)
    ap.add_argument("--no-sc", action="store_true", help="a reader without Secure Channel")
    ap.add_argument("--no-enforce", action="store_true", help="accept plain text")
    ap.add_argument("--nak-output", action="store_true", help="refuse osdp_OUT (NAK)")
    ap.add_argument(
        "--log-level",
        default="warning",
        choices=["emergency", "alert", "critical", "error", "warning", "notice", "info", "debug"],
        help="libosdp's own logging on stderr (the demo: emergency, so its stderr is lockhub's)",
    )
    args = ap.parse_args()

    master, slave = os.openpty()
    tty.setraw(slave)
    os.set_blocking(master, False)
    chan = PtyChannel(master)

    flags = []
    key = None if args.key == "none" else bytes.fromhex(args.key)
    # EnforceSecure needs a key; a factory reader (install mode) has none.
    if key is not None and not args.no_enforce and not args.no_sc:
        flags.append(osdp.LibFlag.EnforceSecure)
    if key is None and not args.no_sc:
        flags.append(osdp.LibFlag.InstallMode)
    caps = [
        (osdp.Capability.OutputControl, 1, args.outputs),
        (osdp.Capability.ContactStatusMonitoring, 1, args.inputs),
        (osdp.Capability.LEDControl, 1, 1),
        (osdp.Capability.AudibleControl, 1, 1),
        (osdp.Capability.CheckCharacter, 1, 0),
    ]
    if not args.no_sc:
        caps.append((osdp.Capability.CommunicationSecurity, 1, 0))
    info = osdp.PDInfo(
        args.address,
        chan,
        scbk=key,
        name="peer-%d" % args.address,
        flags=flags,
        id=osdp.PdId(1, 7, args.vendor, args.serial, 0x010203),
    )
    pd = osdp.PeripheralDevice(info, osdp.PDCapabilities(caps), log_level=getattr(osdp.LogLevel, args.log_level.capitalize()))
    if args.nak_output:
        pd.set_command_handler(
            lambda cmd: (-1, None) if cmd.get("command") == osdp.Command.Output else (0, None)
        )
    pd.start()
    emit({"port": os.ttyname(slave)})

    stop = threading.Event()

    def watch_commands():
        names = {
            osdp.Command.Output: "output",
            osdp.Command.LED: "led",
            osdp.Command.Buzzer: "buzzer",
            osdp.Command.Keyset: "keyset",
        }
        sc = None
        while not stop.is_set():
            cmd = pd.get_command(timeout=0.05)
            if cmd:
                # "t": when the command reached the reader (monotonic s), for the bench.
                out = {"cmd": names.get(cmd.get("command"), str(cmd.get("command"))), "t": time.monotonic()}
                for k, v in cmd.items():
                    if k == "command" or k == "data":
                        continue  # never echo a key
                    if isinstance(v, (int, bool, str)):
                        out[k] = v
                emit(out)
            now = pd.is_sc_active()
            if now != sc:
                sc = now
                emit({"sc": bool(now)})

    t = threading.Thread(target=watch_commands, daemon=True)
    t.start()

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        if req.get("quit"):
            break
        t = time.monotonic()
        if "keys" in req:
            pd.submit_event({"event": osdp.Event.KeyPress, "reader_no": 0, "data": bytes(req["keys"])})
        if req.get("card"):
            pd.submit_event({
                "event": osdp.Event.CardRead, "reader_no": 0, "direction": 0,
                "format": osdp.CardFormat.Wiegand, "length": 26, "data": bytes([1, 2, 3, 4]),
            })
        if "status" in req:
            kind = osdp.StatusReportType.Local if req["status"] == "local" else osdp.StatusReportType.Input
            pd.submit_event({
                "event": osdp.Event.Status, "type": kind,
                "nr_entries": req.get("n", 2),
                "report": bytes((req["mask"] >> i) & 1 for i in range(req.get("n", 2))),
            })
        if "raw" in req:
            chan.raw(bytes.fromhex(req["raw"]))
        if "pause" in req:
            chan.paused = bool(req["pause"])
        emit({"ok": True, "t": t})
    stop.set()
    pd.stop()


if __name__ == "__main__":
    main()
