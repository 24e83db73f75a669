"""Ratios, targets and the paper comparison, as Markdown, JSON and PNG plots.

Every figure is a ratio of two medians measured in the same run: our
default path against a peer (``speedup = peer / ours``) and against the
roofline kernel (``roofline fraction = roofline / ours``).

Example:
    >>> from scanweaver.benchmarks import report
    >>> report.fmt_ms(0.0123)
    '12.3'
"""

from __future__ import annotations

import json
from pathlib import Path

from .harness import Result, Run
from .paper import paper_rows

#: Targets on the headline shape: fraction of the roofline and speedup over the fastest general peer.
TARGET_ROOFLINE = 0.8
TARGET_SPEEDUP = 5.0


def fmt_ms(seconds: float | None) -> str:
    """Seconds as milliseconds with three significant figures."""
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 1000 else f"{ms:.0f}"


def ours(results: list[Result]) -> Result | None:
    """The default-path row (what ``selective_scan`` does with no arguments) among ``results``."""
    for r in results:
        if r.kind == "ours" and r.entry.endswith(":auto") and r.status == "ok":
            return r
    return None


def by_case(run: Run) -> dict[str, list[Result]]:
    """Results grouped by case, in the suite's case order."""
    out: dict[str, list[Result]] = {c.name: [] for c in run.cases}
    for r in run.results:
        out[r.case].append(r)
    return out


def _spread(r: Result) -> float:
    """Interquartile range over median of a result's timed calls."""
    return (r.q75_s - r.q25_s) / r.median_s if r.median_s else 0.0


def _roofline(me: Result, bound: Result | None) -> dict:
    """The roofline fraction of our default path, judged by :func:`scanweaver.runtime.roofline.busy_reason`:
    from its interleaved timing beside the roofline on its own threads (``details["roofline"]``, made by the
    harness on the host), else from the bound's separate timing (the GPU roofline); an impossible fraction
    (above :data:`~scanweaver.runtime.roofline.MAX_FRACTION`) is reported as ``None``, with ``quiet`` false."""
    from ..runtime.roofline import MAX_FRACTION, busy_reason

    pair = me.details.get("roofline")
    if pair is not None:
        return {"roofline_fraction": pair["fraction"], "quiet": pair["quiet"], "note": pair["note"]}
    if bound is None:
        return {"roofline_fraction": None, "quiet": None, "note": ""}
    raw = bound.median_s / me.median_s
    why = busy_reason({"ours": _spread(me), "roofline": _spread(bound)}, raw)
    return {"roofline_fraction": raw if raw <= MAX_FRACTION else None, "quiet": not why, "note": why}


def case_ratios(results: list[Result]) -> dict:
    """Speedups of our default path over each timed entry of one case, and its roofline fraction (with
    ``quiet`` and a ``note`` saying why it is uncertain or missing)."""
    me = ours(results)
    if me is None:
        return {}
    ratios = {"ours": me.entry, "ours_median_s": me.median_s, "speedup": {}, "roofline_fraction": None,
              "quiet": None, "note": "", "fastest_general_peer": None, "speedup_vs_fastest_general_peer": None}
    general = []
    bound = None
    for r in results:
        if r.status != "ok" or r is me:
            continue
        if r.entry in ROOFLINES:
            bound = r
        else:
            ratios["speedup"][r.entry] = r.median_s / me.median_s
        if r.kind == "peer" and r.recurrence == "time-varying":
            general.append(r)
    ratios.update(_roofline(me, bound))
    if general:
        best = min(general, key=lambda r: r.median_s)
        ratios["fastest_general_peer"] = best.entry
        ratios["speedup_vs_fastest_general_peer"] = best.median_s / me.median_s
    return ratios


#: The memory-bound yardsticks (the C kernel on the host, the CuPy kernel on the GPU).
ROOFLINES = ("roofline", "gpu-roofline")
#: GPU scoreboard targets (issue 17): speedup of the default path over the fastest GPU peer, per shape.
GPU_TARGET_SPEEDUP = {(1, 256, 1024): 2.0, (8, 1536, 4096): 1.5, (8, 1536, 65536): 1.5}


def _gpu_targets(run: Run) -> list[dict]:
    out = []
    cases = by_case(run)
    for case in run.cases:
        want = GPU_TARGET_SPEEDUP.get(tuple(case.shape))
        if want is None:
            continue
        rat = case_ratios(cases[case.name])
        got = rat.get("speedup_vs_fastest_general_peer")
        out.append({"case": case.name, "target": f"speedup over the fastest GPU peer "
                    f"({rat.get('fastest_general_peer')})", "want": want, "got": got,
                    "met": None if got is None else got >= want, "quick": run.settings.quick})
    return out


def targets(run: Run) -> list[dict]:
    """The issue's targets: on the headline shape (CPU suites), per shape (the ``gpu`` suite)."""
    if run.suite == "gpu":
        return _gpu_targets(run)
    head = next((c for c in run.cases if c.headline), None)
    if head is None:
        return []
    rat = case_ratios(by_case(run)[head.name])
    out = []
    for key, want, what in (("roofline_fraction", TARGET_ROOFLINE, "fraction of the roofline"),
                            ("speedup_vs_fastest_general_peer", TARGET_SPEEDUP,
                             f"speedup over the fastest general peer ({rat.get('fastest_general_peer')})")):
        got = rat.get(key)
        out.append({"case": head.name, "target": what, "want": want, "got": got,
                    "met": None if got is None else got >= want,
                    "quick": run.settings.quick})
    return out


def _row(r: Result, me: Result | None) -> str:
    if r.status != "ok":
        return f"| {r.label} | {r.status} | - | - | - | - | - | {r.reason} |"
    spread = f"{fmt_ms(r.q25_s)}-{fmt_ms(r.q75_s)}"
    vs = "1 (ours)" if r is me else ("-" if me is None else f"{r.median_s / me.median_s:.3g}")
    if me is not None and r.entry in ROOFLINES:  # the bound's ratio is the roofline fraction: judged, never raw
        rf = _roofline(me, r)
        vs = ("n/a (busy)" if rf["roofline_fraction"] is None else
              f"{rf['roofline_fraction']:.3g}{' (busy)' if rf['quiet'] is False else ''}")
    err = "unchecked" if r.error is None else f"{r.error:.1e}"
    ran = ""
    if r.details.get("schedule"):
        cfg = " ".join(f"{k}={v}" for k, v in sorted(r.details.get("config", {}).items()))
        ran = f"; ran {r.details['backend']}/{r.details['schedule']} {cfg} ({r.details.get('config_source')})"
    return (f"| {r.label} | ok | {fmt_ms(r.median_s)} | {spread} | {r.ns_per_element:.3g} | {r.gbps:.3g} | "
            f"{vs} | err {err}, n={r.repeats}; {r.device}{ran} |")


def markdown(run: Run) -> str:
    """The whole report as Markdown: per-case tables, ratios, targets, the paper comparison, notes."""
    m = run.meta
    lines = [f"# ScanWeaver benchmarks: suite `{run.suite}`{' (quick)' if run.settings.quick else ''}", "",
             f"Machine: {m['cpu']} ({m['threads']} threads), {m['platform']}; Python {m['python']}, "
             f"NumPy {m['numpy']}, ScanWeaver {m['scanweaver']}; {m['date']}.", "",
             "Times are medians of repeated calls after one warm-up call (compilation excluded); spread is the "
             "interquartile range. Every checked entry matched the float64 oracle before it was timed. "
             "`vs ours` = entry time / our default path's time (above 1: we are faster).", ""]
    me_rows = by_case(run)
    for case in run.cases:
        rows = me_rows[case.name]
        if not rows:
            continue
        me = ours(rows)
        B, D, L = case.shape
        lines += [f"## {case.name}: (B, D, L) = ({B}, {D}, {L}), {case.dtype}{' (headline)' if case.headline else ''}",
                  "", "| entry | status | median ms | IQR ms | ns/elem | GB/s | vs ours | notes |",
                  "|---|---|---|---|---|---|---|---|"]
        ordered = sorted(rows, key=lambda r: (r.status != "ok", r.median_s or 0.0))
        lines += [_row(r, me) for r in ordered] + [""]
    lines += ratios_markdown(run) + paper_markdown(run) + notes_markdown(run)
    return "\n".join(lines) + "\n"


def ratios_markdown(run: Run) -> list[str]:
    """The ratio table: per case, our roofline fraction and speedups."""
    lines = ["## Ratios (same run)", "",
             "Roofline fraction = roofline time / our time, both interleaved on our thread count (1 = as fast as "
             "an elementwise kernel moving the same bytes); `busy` = the machine was busy while they ran.", "",
             "| case | ours (ms) | roofline fraction | fastest general peer | speedup over it |",
             "|---|---|---|---|---|"]
    busy = []
    for name, rows in by_case(run).items():
        rat = case_ratios(rows)
        if not rat:
            continue
        rf = rat["roofline_fraction"]
        sp = rat["speedup_vs_fastest_general_peer"]
        shown = "-" if rf is None else f"{rf:.2f}"
        if rat["quiet"] is False:
            shown = f"{shown} (busy)" if rf is not None else "n/a (busy)"
            busy.append(f"- {name}: {rat['note']}")
        lines.append(f"| {name} | {fmt_ms(rat['ours_median_s'])} | {shown} | "
                     f"{rat['fastest_general_peer'] or '-'} | {'-' if sp is None else f'{sp:.1f}x'} |")
    lines.append("")
    if busy:
        lines += ["Uncertain figures (run again on a quiet machine):", "", *busy, ""]
    tg = targets(run)
    if tg:
        lines += ["## Targets (headline shape)", ""]
        for t in tg:
            state = "not measured" if t["met"] is None else ("met" if t["met"] else "MISSED")
            got = "-" if t["got"] is None else f"{t['got']:.2f}"
            short = f" (short by {t['want'] - t['got']:.2f})" if t["met"] is False else ""
            lines.append(f"- {t['target']} on {t['case']}: {got}, target {t['want']:g}: {state}{short}"
                         f"{' (quick mode: tiny shapes, not meaningful)' if t['quick'] else ''}")
        lines.append("")
    return lines


def paper_markdown(run: Run) -> list[str]:
    """Our L = 1024 row beside the paper's figures, each with its hardware."""
    rows = paper_rows(run)
    if not rows:
        return []
    lines = ["## Paper comparison at L = 1024", "",
             "| entry | paper (ms) | paper hardware | here (ms) | here hardware |", "|---|---|---|---|---|"]
    for p in rows:
        here = "-" if p["here_s"] is None else fmt_ms(p["here_s"])
        paper = "-" if p["paper_ms"] is None else f"{p['paper_ms']:g}"
        lines.append(f"| {p['entry']} | {paper} | {p['paper_hardware']} | {here} | {p['here_device']} |")
    return lines + [""]


def notes_markdown(run: Run) -> list[str]:
    """Caveats of the entries that appear in this run."""
    from .peers import entries

    seen = {r.entry for r in run.results}
    notes = sorted({p.note for p in entries() if p.name in seen and p.note})
    return (["## Notes", ""] + [f"- {n}" for n in notes] + [""]) if notes else []


def to_json(run: Run) -> dict:
    """The JSON record: meta, settings, every result, ratios per case, targets, paper comparison; ``quiet`` is
    false when any case's roofline comparison says the machine was busy."""
    ratios = {name: case_ratios(rows) for name, rows in by_case(run).items()}
    return {
        "meta": run.meta,
        "settings": run.settings.__dict__,
        "cases": [{"name": c.name, "shape": list(c.shape), "dtype": c.dtype, "group": c.group,
                   "headline": c.headline} for c in run.cases],
        "results": [r.to_dict() for r in run.results],
        "ratios": ratios,
        "quiet": not any(r.get("quiet") is False for r in ratios.values()),
        "targets": targets(run),
        "paper": paper_rows(run),
    }


def write(run: Run, out: Path, plots: bool = True) -> list[str]:
    """Writes ``<suite>.json``, ``<suite>.md`` and the PNG plots to ``out``; returns messages."""
    from .plots import write_plots

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{run.suite}.json").write_text(json.dumps(to_json(run), indent=2, default=str))
    (out / f"{run.suite}.md").write_text(markdown(run))
    msgs = [f"wrote {out / f'{run.suite}.json'}", f"wrote {out / f'{run.suite}.md'}"]
    if plots:
        msgs += write_plots(run, out)
    return msgs
