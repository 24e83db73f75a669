"""``scanweaver devices``: every backend, whether it can run here, and why not."""

from __future__ import annotations

import argparse
import json

from . import command


def backend_rows() -> list[dict]:
    """One row per registered backend; the julia row lists its KernelAbstractions devices under ``devices``."""
    from ..runtime import REGISTRY

    rows = []
    for name in sorted(REGISTRY, key=lambda n: -REGISTRY[n].auto_priority):
        avail = REGISTRY[name].availability()
        details = REGISTRY[name]().details() if avail.ok else {}
        rows.append({"backend": name, "available": avail.ok, "device": avail.device, "reason": avail.reason,
                     "schedules": list(REGISTRY[name].schedules), "details": details})
    julia = next((r for r in rows if r["backend"] == "julia"), None)
    if julia is not None:
        from ..julia import julia_devices

        julia["devices"] = [{"name": d["name"], "available": d["ok"], "reason": d.get("reason", "")}
                            for d in julia_devices()]
    return rows


def _julia_lines(row: dict) -> list[str]:
    """The julia row's devices: one line when none can be checked (Julia missing), else one per device."""
    devs = row.get("devices", [])
    if not devs:
        return []
    pad = " " * 29
    if not row["available"]:
        return [f"{pad}devices: {', '.join(d['name'] for d in devs)} (none until Julia starts)"]
    return [f"{pad}device {d['name']:<7} {'available' if d['available'] else 'unavailable'}: {d['reason']}"
            for d in devs]


@command("devices", help="list every backend, available or not, and why not")
class Devices:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print a JSON list (julia's devices under 'devices')")

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
            for line in _julia_lines(r):
                print(line)
        return 0
