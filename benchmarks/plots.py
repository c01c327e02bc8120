"""Charts of a benchmark run (``python3 tasks.py bench --plot DIR``): how each cost grows
with the step size.

One PNG per measure (time, worst event-loop stall, peak extra memory), one panel per
operation kind (sends, receives), one line per sink and event loop, the step size in GB
on a logarithmic axis, and the command that made the run under each chart.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from ratio import TARGET_PEAK_MB, TARGET_STALL_MS, Ratio  # beside this file

#: (file name, title, the Ratio attribute plotted, its unit, target line or None)
MEASURES = (
    ("time.png", "rlwire's time per operation", "rlwire_ms", "ms", None),
    (
        "stall.png",
        "worst event-loop stall during the operation",
        "worst_stall_ms",
        "ms",
        TARGET_STALL_MS,
    ),
    ("memory.png", "peak extra memory during the operation", "peak_mb", "MB", TARGET_PEAK_MB),
)


def _panel(operation: str) -> str:
    return "receives" if operation.startswith(("receive", "areceive")) else "sends"


def _shown(command: str) -> str:
    """``command`` with each absolute path cut to its file name: a chart names no machine."""
    return " ".join(Path(a).name if a.startswith("/") else a for a in command.split())


def plot_all(rows: list[Ratio], directory: Path, command: str) -> list[Path]:
    """Draw every measure of ``rows`` into ``directory``; return the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, attribute, unit, target in MEASURES:
        lines: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for r in rows:
            value = getattr(r, attribute)
            if value is not None:
                label = f"{r.sink} {r.operation} ({r.backend})"
                lines[_panel(r.operation)][label].append((r.size_gb, value))
        panels = sorted(lines, key=lambda p: p != "sends")  # sends first
        fig, axes = plt.subplots(
            1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False, sharey=False
        )
        for ax, panel in zip(axes[0], panels, strict=True):
            # One colour per row, solid under asyncio and dashed under trio.
            names = sorted({label.rsplit(" (", 1)[0] for label in lines[panel]})
            colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
            for label, points in sorted(lines[panel].items()):
                xs, ys = zip(*sorted(points), strict=True)
                style: dict[str, Any] = {"linestyle": "--"} if "(trio)" in label else {}
                colour = colours[label.rsplit(" (", 1)[0]]
                ax.plot(xs, ys, marker="o", label=label, color=colour, **style)
            if target is not None and not (unit == "MB" and panel == "receives"):
                ax.axhline(target, color="grey", linewidth=1, linestyle=":", label="target")
            ax.set_xscale("log")
            if attribute == "rlwire_ms":
                ax.set_yscale("log")
            else:  # stalls and memory may be 0
                ax.set_yscale("symlog", linthresh=1.0)
                ax.set_ylim(bottom=0)
            ax.set_xlabel("step size, GB")
            ax.set_ylabel(unit)
            ax.set_title(panel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(title)
        fig.text(0.01, 0.01, _shown(command), fontsize=7, family="monospace")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        path = directory / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
