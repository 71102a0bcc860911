#!/usr/bin/env python3
"""A fleet operator's view: one line per hub from the retained status
messages (docs/protocol/mqtt.md 'Status'), unhealthy hubs flagged.

Needs only Python 3 and mosquitto_sub (Debian: mosquitto-clients). It
subscribes to PREFIX/+/+/status with the credentials you give it (an
identity of its own with read on the status topics, `fleet-status` in
packaging/mosquitto/lockhub.acl: not the cloud's, which it would drop),
reads the retained messages, and prints the table once (or keeps printing
changes with --follow). Its own flags are --help, --follow, --stale-after
and --prefix; every other flag goes to mosquitto_sub (-h is its host).

  docs/fleet-status.py -h broker.example.net -p 8883 --cafile ca.pem \\
      -u fleet-status -P "$PASS"            # any further flags go to mosquitto_sub
  docs/fleet-status.py -p 1883 --follow

A hub is flagged when it is offline, its status is older than
--stale-after seconds (the hub republishes every 60 s), its broker link or
a serial link is not up, its clock is untrusted, any alert is open, its
outbox holds rows older than 10 minutes, or less than 5 % of its disk
(below 100 MiB) is free. Nothing here shows keys, guests or PINs: the status
carries counts and states only.
"""

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timezone

PREFIX = "lockhub/v1"
STALE_AFTER_S = 180  # --stale-after
OUTBOX_OLD_S = 600
DISK_LOW_BYTES = 100 * 1024 * 1024


def problems(status, now, stale_after=STALE_AFTER_S):
    """What is wrong with one hub's status, as short words (empty: healthy)."""
    out = []
    if status.get("state") != "online":
        out.append("OFFLINE")
    try:
        at = datetime.fromisoformat(status["at"].replace("Z", "+00:00"))
        age = (now - at).total_seconds()
        if status.get("state") == "online" and age > stale_after:
            out.append(f"silent {int(age)}s")
    except (KeyError, ValueError):
        out.append("no time")
    h = status.get("health")
    if h is None:
        if status.get("state") == "online":
            out.append("no health (old lockhub?)")
        return out
    for name, state in sorted(h.get("links", {}).items()):
        if state != "up":
            out.append(f"{name} {state}")
    if not h.get("clock_trusted", True):
        out.append("clock untrusted")
    for cond, n in sorted(h.get("alerts", {}).items()):
        out.append(f"{cond}" + (f" x{n}" if n > 1 else ""))
    age = h.get("outbox_oldest_age_s")
    if age is not None and age > OUTBOX_OLD_S:
        out.append(f"outbox {h.get('outbox_depth')} rows, oldest {age}s")
    free = h.get("disk_free_bytes")
    if free is not None and free < DISK_LOW_BYTES:
        out.append(f"disk {free // (1024 * 1024)} MiB free")
    return out


def line(topic, status, now, stale_after=STALE_AFTER_S):
    parts = topic.split("/")
    site, hub = parts[-3], parts[-2]
    h = status.get("health") or {}
    bad = problems(status, now, stale_after)
    up = h.get("uptime_s")
    return "{flag} {site:.8}/{hub:<20} {state:<7} v{ver:<8} up {up:>7} w {w:>6}/{head:<6} outbox {ob:>5} {what}".format(
        flag="!!" if bad else "ok",
        site=site,
        hub=hub,
        state=status.get("state", "?"),
        ver=status.get("version", "?"),
        up="-" if up is None else f"{up // 3600}h{up % 3600 // 60:02d}m",
        w=h.get("watermark", "-"),
        head=h.get("head_seq", "-"),
        ob=h.get("outbox_depth", "-"),
        what=", ".join(bad),
    )


def parse(argv):
    """(our options, the flags for mosquitto_sub). -h is mosquitto_sub's
    host, so help is --help only."""
    ap = argparse.ArgumentParser(
        prog="fleet-status.py",
        description="One line per lockhub hub from its retained status; unhealthy hubs first, flagged !!. Exit 1 when any hub is flagged.",
        epilog="Every other flag goes to mosquitto_sub, e.g. -h HOST -p PORT --cafile FILE -u USER -P PASS.",
        add_help=False,
        allow_abbrev=False,
    )
    ap.add_argument("--help", action="help", help="show this help and exit")
    ap.add_argument("--follow", action="store_true", help="keep printing one line per status as it changes")
    ap.add_argument("--stale-after", type=int, default=STALE_AFTER_S, metavar="SECONDS",
                    help=f"flag an online hub whose status is older than this (default {STALE_AFTER_S}; hubs republish every 60 s)")
    ap.add_argument("--prefix", default=PREFIX, help=f"the hubs' mqtt.topic_prefix (default {PREFIX})")
    return ap.parse_known_args(argv)


def main(argv):
    opts, args = parse(argv)
    follow = opts.follow
    cmd = ["mosquitto_sub", "-v", "-t", f"{opts.prefix}/+/+/status"] + args
    if not follow:
        # Retained messages arrive at once; stop when they stop.
        cmd += ["-W", "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    hubs = {}
    try:
        for raw in proc.stdout:
            topic, _, payload = raw.rstrip("\n").partition(" ")
            try:
                hubs[topic] = json.loads(payload)
            except ValueError:
                continue
            if follow:
                print(line(topic, hubs[topic], datetime.now(timezone.utc), opts.stale_after), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        proc.terminate()
    if not follow:
        now = datetime.now(timezone.utc)
        rows = [line(t, s, now, opts.stale_after) for t, s in sorted(hubs.items())]
        for r in sorted(rows, key=lambda r: not r.startswith("!!")):
            print(r)
        bad = sum(r.startswith("!!") for r in rows)
        print(f"{len(rows)} hubs, {bad} unhealthy", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
