"""PNG plots (matplotlib, optional and imported lazily): latency against L, and peers per shape."""

from __future__ import annotations

from pathlib import Path

from .harness import Result, Run

#: Colours by kind, so our rows stand out, and what each means in the bar charts' legend.
COLOURS = {"ours": "tab:blue", "peer": "tab:orange", "bound": "tab:gray"}
KIND_LABELS = {"ours": "ScanWeaver", "peer": "peer library", "bound": "roofline (memory bound)"}
OTHER_COLOUR = "tab:green"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(run: Run, out: Path) -> list[str]:
    """Writes ``<suite>_latency.png`` (sweep) and ``<suite>_<shape>.png`` per fixed shape; returns messages."""
    try:
        plt = _pyplot()
    except ImportError:
        return ["matplotlib is not installed: no PNG plots (pip install 'scanweaver[plot]')"]
    msgs = []
    sweep = [r for r in run.results if r.group == "sweep" and r.status == "ok"]
    if sweep:
        path = out / f"{run.suite}_latency.png"
        _latency(plt, sweep, path, run)
        msgs.append(f"wrote {path}")
    for case in run.cases:
        rows = [r for r in run.results if r.case == case.name and r.status == "ok" and case.group == "shape"]
        if rows:
            path = out / f"{run.suite}_{case.name}.png"
            _save(plt, bar_figure(plt, rows, run), path)
            msgs.append(f"wrote {path}")
    return msgs


def _latency(plt, rows: list[Result], path: Path, run: Run) -> None:
    fig, ax = plt.subplots(figsize=(8, 5.5))
    palette = plt.get_cmap("tab20").colors
    for i, label in enumerate(dict.fromkeys(r.label for r in rows)):
        pts = sorted((r.shape[2], r) for r in rows if r.label == label)
        if len(pts) < 2 and len({r.shape[2] for r in rows}) > 1:
            continue
        L = [p[0] for p in pts]
        kind = pts[0][1].kind
        ax.errorbar(L, [p[1].median_s * 1e3 for p in pts],
                    yerr=[[max(p[1].median_s - p[1].q25_s, 0) * 1e3 for p in pts],
                          [max(p[1].q75_s - p[1].median_s, 0) * 1e3 for p in pts]],
                    marker="o", ms=3, capsize=2, label=label, lw=2.2 if kind == "ours" else 1.2,
                    color=palette[i % len(palette)],
                    ls="--" if kind == "bound" else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    B, D = rows[0].shape[:2]
    ax.set_xlabel(f"sequence length L  (B={B}, D={D}, {rows[0].dtype})")
    ax.set_ylabel("latency per call, ms (median, IQR bars)")
    ax.set_title(f"Selective scan latency against L on {run.meta['cpu']} ({run.meta['threads']} threads)",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _save(plt, fig, path: Path) -> None:
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bar_figure(plt, rows: list[Result], run: Run):
    """Horizontal bars of ns per element for one shape, coloured by kind, with a legend of the colours."""
    rows = sorted(rows, key=lambda r: r.ns_per_element, reverse=True)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.6))
    ax.barh([r.label for r in rows], [r.ns_per_element for r in rows],
            xerr=[[(r.median_s - r.q25_s) / r.elements * 1e9 for r in rows],
                  [(r.q75_s - r.median_s) / r.elements * 1e9 for r in rows]],
            color=[COLOURS.get(r.kind, OTHER_COLOUR) for r in rows])
    kinds = list(dict.fromkeys(r.kind for r in rows))
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLOURS.get(k, OTHER_COLOUR)) for k in kinds],
              labels=[KIND_LABELS.get(k, k) for k in kinds], fontsize=7,
              loc="upper right")  # the fastest (shortest) bars are at the top
    ax.set_xscale("log")
    ax.set_xlabel("ns per element (median; lower is faster)")
    ax.set_title(f"(B, D, L) = {tuple(rows[0].shape)}, {rows[0].dtype}, on {run.meta['cpu']}", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    return fig
