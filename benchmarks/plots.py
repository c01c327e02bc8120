"""Charts of a benchmark run (``python3 tasks.py bench --plot DIR``): how each cost grows
with the step size, beside what a reader would compare it with.

One PNG per measure (time, worst event-loop stall, peak extra memory), one panel per
row of the suite (a sink and an operation), the step size in GB on a logarithmic axis.
Each panel draws rlwire beside its baselines, solid under asyncio and dashed under trio:

* the row's baseline (the floor: ``os.write`` of the same bytes, reading them once, raw
  pyzmq, s3fs, the frameworks' raw-sidecar writer, a msgspec decode);
* the alternatives a reader would otherwise use, where the run measured them: msgspec
  encode + write on the event loop and in a worker thread (``bench_send.py``'s (a) and
  (b), ``bench_user_types.py``'s (a));
* on the stall chart, the idle loop: the loop's worst gap with nothing running, in the
  same run (``bench_user_types.py`` measures it before and after its rounds), or the
  run's summary of it where its samples were not kept;
* the target (1.1 x the floor, 2 ms of stall, 64 MB), as a dotted line.

The baselines' times come from the ratios; their stalls and memory, and the
alternatives, from the run's samples (``results["runs"]``), which ``--json`` keeps.
Points measured in other runs may be given as ``results["references"]`` (each with its
panel, label, size, value and the command that made it): they are drawn as hollow
markers, named "other run". The command that made the run is under each chart.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator
from ratio import TARGET_PEAK_MB, TARGET_STALL_MS, Ratio  # beside this file

#: (file name, title, measure, unit)
MEASURES = (
    ("time.png", "time per operation, rlwire beside its baselines (lower is better)", "ms", "ms"),
    ("stall.png", "worst event-loop stall during the operation (lower is better)", "stall", "ms"),
    ("memory.png", "peak extra memory during the operation (lower is better)", "peak", "MB"),
)
MEASURE_UNITS = {measure: unit for _, _, measure, unit in MEASURES}

#: The panels, in order: (sink, operation) -> title. Rows of other sinks (the fixed
#: shapes of ``columns-*``) are one size each and stay in the tables.
PANELS = {
    ("file", "send"): "file: send 256 large samples",
    ("file", "receive (verified)"): "file: receive, checksums verified",
    ("file-small", "send"): "file: send 8,000 small samples",
    ("file-small", "receive (verified)"): "file: receive 8,000 small samples",
    ("zmq-tcp", "send to receiver"): "ZeroMQ tcp: send to another process",
    ("zmq-ipc", "send to receiver"): "ZeroMQ ipc: send to another process",
    ("s3", "send to receiver"): "S3 (moto): send",
    ("user-types", "send_ranks"): "your Structs: send_ranks, 8 ranks",
    ("user-types", "areceive"): "your Structs: areceive",
}

#: What each baseline row is, in a reader's words.
BASELINE_LABELS = {
    "floor (c)": "floor: os.write of the same bytes",
    "read once": "floor: read the same bytes once",
    "raw pyzmq": "raw pyzmq, same buffers",
    "s3fs direct": "s3fs putting the same bytes",
    "msgspec decode": "msgspec decode from memory",
    "(b) raw-sidecar writer": "frameworks' raw-sidecar writer",
}

#: Alternatives a reader would use instead, by sink and operation: (run's row name or
#: prefix, label).
ON_LOOP, IN_THREAD = "#d84315", "#f9a825"
ALTERNATIVES = {
    ("file", "send"): (
        ("baseline (a)", "msgspec encode + write on the loop", ON_LOOP),
        ("baseline (b)", "msgspec encode + write in a thread", IN_THREAD),
    ),
    ("file-small", "send"): (
        ("baseline (a)", "msgspec encode + write on the loop", ON_LOOP),
        ("baseline (b)", "msgspec encode + write in a thread", IN_THREAD),
    ),
    ("user-types", "send_ranks"): (("(a)", "msgspec encode + write in a thread", IN_THREAD),),
}

RLWIRE = "#1565c0"
BASELINE = "#616161"
ALTERNATIVE = (ON_LOOP, IN_THREAD)
IDLE = "#90a4ae"
TARGET = "#2e7d32"


@dataclass
class Series:
    """One line of a panel: values by event loop, each a list of (GB, value)."""

    label: str
    colour: str
    points: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, backend: str, size: float, value: float | None) -> None:
        if value is not None:
            self.points[backend].append((size, value))


def _shown(command: str) -> str:
    """``command`` with each absolute path cut to its file name: a chart names no machine."""
    return " ".join(Path(a).name if a.startswith("/") else a for a in command.split())


def _measures(samples: Iterable[dict[str, Any]]) -> dict[str, float | None]:
    """A row's figures as the suite reports rlwire's: median ms, worst stall, peak MB."""
    rows = list(samples)
    secs = [s["seconds"] for s in rows if s.get("seconds") is not None]
    stalls = [s["stall_max"] for s in rows if s.get("stall_max") is not None]
    peaks = [s["peak"] for s in rows if s.get("peak") is not None]
    return {
        "ms": statistics.median(secs) * 1e3 if secs else None,
        "stall": max(stalls) * 1e3 if stalls else None,
        "peak": max(peaks) / 1e6 if peaks else None,
    }


def _rows_of(run: dict[str, Any]) -> dict[str, dict[str, dict[str, float | None]]]:
    """The figures of every row of one job, by event loop and row name."""
    result = run.get("result") or {}
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    if "backends" in result:  # bench_user_types.py: rows of sample dicts, per loop
        for backend, data in result["backends"].items():
            out[backend] = {name: _measures(row["samples"]) for name, row in data["rows"].items()}
    elif "rows" in result:  # bench_send.py and bench_sinks.py: lists per measure
        out[run["backend"]] = {
            name: _measures(
                dict(zip(row, values, strict=True)) for values in zip(*row.values(), strict=True)
            )
            for name, row in result["rows"].items()
        }
    return out


def _idle(run: dict[str, Any]) -> dict[str, float]:
    """The idle loop's worst gap (ms) per event loop, where the job measured it."""
    out = {}
    for backend, data in ((run.get("result") or {}).get("backends") or {}).items():
        gaps = [
            w["stall_max"] * 1e3
            for w in (data.get("idle_before"), data.get("idle_after"))
            if w and w.get("stall_max") is not None
        ]
        if gaps:
            out[backend] = max(gaps)
    return out


def series(rows: list[Ratio], results: dict[str, Any] | None) -> dict[str, dict[tuple, list]]:
    """Every panel's lines, by measure: ``{measure: {(sink, operation): [Series]}}``."""
    runs = (results or {}).get("runs") or []
    figures = {(r["sink"], r["size_gb"]): _rows_of(r) for r in runs}
    out: dict[str, dict[tuple, list[Series]]] = {m: {} for _, _, m, _ in MEASURES}
    for key in PANELS:
        mine = [r for r in rows if (r.sink, r.operation) == key]
        if not mine:
            continue
        for measure in out:
            rl = Series("rlwire", RLWIRE)
            base = Series(BASELINE_LABELS.get(mine[0].baseline, mine[0].baseline), BASELINE)
            alts = [Series(label, colour) for _, label, colour in ALTERNATIVES.get(key, ())]
            for r in mine:
                own = {"ms": r.rlwire_ms, "stall": r.worst_stall_ms, "peak": r.peak_mb}
                rl.add(r.backend, r.size_gb, own[measure])
                found = figures.get((r.sink, r.size_gb), {}).get(r.backend, {})
                theirs = found.get(r.baseline, {})
                base.add(
                    r.backend, r.size_gb, r.baseline_ms if measure == "ms" else theirs.get(measure)
                )
                for (name, _, _), alt in zip(ALTERNATIVES.get(key, ()), alts, strict=True):
                    row = next((v for n, v in found.items() if n.startswith(name)), {})
                    alt.add(r.backend, r.size_gb, row.get(measure))
            out[measure][key] = [s for s in (rl, base, *alts) if s.points]
    return out


def _idle_points(results: dict[str, Any] | None) -> dict[str, list[tuple[float, float]]]:
    """The idle loop's worst gaps (ms) per event loop and step size, from the run's
    samples. Without them, the run's summary ``results["idle_loop_ms"]`` (``{"median":
    .., "max": .., "windows": ..}``) is drawn as a band instead."""
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for run in (results or {}).get("runs") or []:
        for backend, gap in _idle(run).items():
            points[backend].append((run["size_gb"], gap))
    return points


def _style(backend: str) -> dict[str, Any]:
    return {"linestyle": "--"} if backend == "trio" else {}


def _draw(ax: Axes, lines: list[Series]) -> None:
    for s in lines:
        for backend, points in sorted(s.points.items()):
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker="o", markersize=3.5, color=s.colour, **_style(backend))


def _target(ax: Axes, measure: str, key: tuple[str, str], rows: list[Ratio]) -> str | None:
    """Draw the row's target; return its label, or None where it has none."""
    if measure == "stall":
        ax.axhline(TARGET_STALL_MS, color=TARGET, linewidth=1, linestyle=":")
        return f"target: {TARGET_STALL_MS:g} ms"
    if measure == "peak":
        if "send" not in key[1]:
            return None  # receives map the files they read
        ax.axhline(TARGET_PEAK_MB, color=TARGET, linewidth=1, linestyle=":")
        return f"target: {TARGET_PEAK_MB:g} MB"
    mine = sorted(
        (r for r in rows if (r.sink, r.operation) == key and r.backend == "asyncio"),
        key=lambda r: r.size_gb,
    )
    if not mine:
        return None
    # A time target is a ratio to the baseline: draw it as the time it allows.
    allowed = [
        r.baseline_ms / r.target if r.higher_is_better else r.baseline_ms * r.target for r in mine
    ]
    ax.plot([r.size_gb for r in mine], allowed, color=TARGET, linewidth=1, linestyle=":")
    sign = "≥" if mine[0].higher_is_better else "≤"
    return f"target: {sign} {mine[0].target:g}x the baseline"


def _references(results: dict[str, Any] | None, measure: str, key: tuple[str, str]) -> list[dict]:
    return [
        ref
        for ref in (results or {}).get("references") or []
        if ref["measure"] == measure and tuple(ref["panel"]) == key
    ]


def _source(ref: dict[str, Any]) -> str:
    """A reference's script, for the legend (its whole command is in the JSON)."""
    script = next((w for w in ref["command"].split() if w.endswith(".py")), ref["command"])
    return Path(script).name


def _panel(
    ax: Axes,
    key: tuple[str, str],
    measure: str,
    context: tuple[list[Ratio], dict[str, Any] | None, dict[str, list[tuple[float, float]]]],
    legend: dict[str, Any],
) -> None:
    """One panel: rlwire and its baselines, the idle loop, the target and the points of
    other runs, named in the panel's own legend; what every panel shares goes to
    ``legend``, the figure's."""
    rows, results, idle = context
    lines = series(rows, results)[measure][key]
    _draw(ax, lines)
    own: dict[str, Any] = {
        s.label: Line2D([], [], color=s.colour, marker="o", ms=3.5) for s in lines
    }
    summary = (results or {}).get("idle_loop_ms")
    if measure == "stall" and idle:
        for backend, points in sorted(idle.items()):
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, color=IDLE, marker="s", ms=3, **_style(backend))
        own["idle loop"] = Line2D([], [], color=IDLE, marker="s", ms=3)
        legend.setdefault(
            "idle loop: its worst gap over 0.5 s with nothing running, same run",
            Line2D([], [], color=IDLE, marker="s", ms=3),
        )
    elif measure == "stall" and summary:
        ax.axhspan(summary["median"], summary["max"], color=IDLE, alpha=0.35, lw=0)
        own["idle loop"] = Rectangle((0, 0), 1, 1, color=IDLE, alpha=0.35)
        legend.setdefault(
            f"idle loop: its worst gap per 0.5 s window with nothing running, median "
            f"{summary['median']:g} to max {summary['max']:g} ms ({summary['windows']} "
            "windows of this run)",
            Rectangle((0, 0), 1, 1, color=IDLE, alpha=0.35),
        )
    label = _target(ax, measure, key, rows)
    if label:
        own[label] = Line2D([], [], color=TARGET, linestyle=":")
    for ref in _references(results, measure, key):
        colour = ref.get("colour", ALTERNATIVE[0])
        marker = {"marker": "D", "mfc": "none", "color": colour, "linestyle": "none"}
        ax.plot([ref["size_gb"]], [ref["value"]], ms=6, **marker)
        own[f"{ref['label']} ({_source(ref)})"] = Line2D([], [], **marker)
        legend.setdefault(
            "hollow diamond: the same measure in another run (its script in brackets)",
            Line2D([], [], marker="D", mfc="none", color="black", linestyle="none"),
        )
    # Below the panel, where it hides no point.
    ax.legend(
        own.values(),
        own.keys(),
        fontsize=9,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=1 if max(map(len, own)) > 28 else 2,
        frameon=False,
    )
    sizes = sorted({x for s in lines for pts in s.points.values() for x, _ in pts})
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{x:g}" for x in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    top = max(
        [v for s in lines for pts in s.points.values() for _, v in pts]
        + [ref["value"] for ref in _references(results, measure, key)]
        + [TARGET_PEAK_MB if measure == "peak" else TARGET_STALL_MS]
    )
    if measure == "peak":  # memory may be 0
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(0, top * 3)
    else:
        ax.set_yscale("log")
        ax.set_ylim(top=top * 2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    lo, hi = ax.get_ylim()
    if measure != "peak" and hi / max(lo, 1e-9) < 30:  # under one decade or so: label 2, 3, 5
        ax.yaxis.set_minor_formatter(
            FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "235" else "")
        )
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("step size, GB", fontsize=9)
    ax.set_ylabel(MEASURE_UNITS[measure], fontsize=9)
    ax.tick_params(labelsize=8.5)
    mapped = measure == "peak" and key[1].startswith(("receive", "areceive"))
    ax.set_title(PANELS[key] + (" (pages mapped)" if mapped else ""), fontsize=11)
    ax.grid(True, which="both", alpha=0.3)


def plot_all(
    rows: list[Ratio], directory: Path, command: str, results: dict[str, Any] | None = None
) -> list[Path]:
    """Draw every measure of ``rows`` (and of ``results``, the run's JSON, for the
    baselines' stalls and memory and the idle loop) into ``directory``; return the files
    written."""
    directory.mkdir(parents=True, exist_ok=True)
    drawn = series(rows, results)
    idle = _idle_points(results)
    written = []
    for name, title, measure, _ in MEASURES:
        panels = [k for k in PANELS if k in drawn[measure]]
        if not panels:
            continue
        cols = min(2, len(panels))  # two panels a row: legible at the width of a page
        fig, axes = plt.subplots(
            -(-len(panels) // cols),
            cols,
            figsize=(5.2 * cols, 5.0 * -(-len(panels) // cols) + 1.5),
            squeeze=False,
        )
        legend: dict[str, Any] = {}
        for ax, key in zip(axes.flat, panels, strict=False):
            _panel(ax, key, measure, (rows, results, idle), legend)
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
        legend = {
            "solid: asyncio": Line2D([], [], color="black"),
            "dashed: trio": Line2D([], [], color="black", linestyle="--"),
            **legend,
        }
        drawn_legend = fig.legend(
            legend.values(),
            legend.keys(),
            loc="lower center",
            bbox_to_anchor=(0.5, 0.03),
            ncol=1,
            fontsize=9,
            frameon=False,
        )
        fig.suptitle(title, fontsize=14)
        fig.text(0.01, 0.005, _shown(command), fontsize=7, family="monospace", va="bottom")
        fig.canvas.draw()  # to measure the legend: the panels go above it
        box = drawn_legend.get_window_extent().transformed(fig.transFigure.inverted())
        fig.tight_layout(rect=(0, box.y1 + 0.005, 1, 1 - 0.45 / fig.get_figheight()))
        path = directory / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
