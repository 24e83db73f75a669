"""``scanweaver devices``: every backend, whether it can run here, and why not."""

from __future__ import annotations

import argparse
import json

from . import command


def backend_rows() -> list[dict]:
    """One row per registered backend (and per Julia device where the Julia façade exists)."""
    from ..runtime import REGISTRY

    rows = []
    for name in sorted(REGISTRY, key=lambda n: -REGISTRY[n].auto_priority):
        avail = REGISTRY[name].availability()
        details = REGISTRY[name]().details() if avail.ok else {}
        rows.append({"backend": name, "available": avail.ok, "device": avail.device, "reason": avail.reason,
                     "schedules": list(REGISTRY[name].schedules), "details": details})
    try:
        from ..julia import julia_devices
    except ImportError:
        return rows
    for dev in julia_devices():
        rows.append({"backend": f"julia:{dev['name']}", "available": dev["ok"], "device": dev.get("device", ""),
                     "reason": dev.get("reason", ""), "schedules": []})
    return rows


@command("devices", help="list every backend, available or not, and why not")
class Devices:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print a JSON list")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        rows = backend_rows()
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        for r in rows:
            state = "available" if r["available"] else "unavailable"
            detail = r["device"] if r["available"] else r["reason"]
            print(f"{r['backend']:<16} {state:<12} {detail}")
            for k, v in r.get("details", {}).items():
                print(f"{'':<29}{k}: {v}")
        return 0
