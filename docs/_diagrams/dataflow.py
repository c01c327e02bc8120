"""Draw the home page's picture of the data flow: docs/images/dataflow.svg.

Run it from the repository root after changing it (``python docs/_diagrams/dataflow.py``;
needs matplotlib, which the ``dev`` extra has) and commit the SVG beside the script's
change. The SVG carries its text as paths, so it looks the same in every browser, with
no font, script or network access needed to show it. ``--png PATH`` also writes a PNG,
to look at it without a browser.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

OUT = Path(__file__).resolve().parents[1] / "images" / "dataflow.svg"
W, H = 124.0, 60.0  # drawing units; the figure is 12.4 x 6.0 inches

INK = "#263238"
SOFT = "#546e7a"
PRODUCER = "#e3f2fd"
CODEC = "#ede7f6"
FRAME = "#fff8e1"
HEADER = "#ffcc80"
BUFFER = "#ffe0b2"
SIDECAR = "#ffab91"
DEST = "#e8f5e9"
RANK = "#e0f7fa"
THREADS = "#f5f5f5"


def box(ax: Axes, x: float, y: float, w: float, h: float, colour: str, **kw: object) -> None:
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0,rounding_size=1.2",
            facecolor=colour,
            edgecolor=kw.get("edge", INK),
            linewidth=kw.get("lw", 1.1),
            linestyle=kw.get("ls", "-"),
        )
    )


def text(ax: Axes, x: float, y: float, s: str, size: float = 9.5, **kw: object) -> None:
    ax.text(
        x,
        y,
        s,
        fontsize=size,
        color=kw.pop("color", INK),
        ha=kw.pop("ha", "center"),
        va=kw.pop("va", "center"),
        linespacing=1.35,
        **kw,  # type: ignore[arg-type]
    )


def arrow(ax: Axes, a: tuple[float, float], b: tuple[float, float], **kw: object) -> None:
    ax.add_patch(
        FancyArrowPatch(
            a,
            b,
            arrowstyle="-|>",
            mutation_scale=13,
            color=kw.get("color", INK),
            linewidth=kw.get("lw", 1.3),
            connectionstyle=kw.get("cs", "arc3,rad=0"),
            shrinkA=0,
            shrinkB=0,
        )
    )


def producer(ax: Axes) -> None:
    box(ax, 1, 20, 19, 22, PRODUCER)
    text(ax, 10.5, 38.5, "producer", 11, weight="bold")
    text(ax, 10.5, 34.6, "your orchestrator\n(asyncio or trio;\nor sync code)", 8.5)
    text(
        ax,
        10.5,
        25.6,
        "send(batch)\nsend_ranks([...])\nopen_step() .put(group)",
        8,
        family="monospace",
    )


def codec(ax: Axes) -> None:
    box(ax, 25, 20, 19, 22, CODEC)
    text(ax, 34.5, 38.5, "codec", 11, weight="bold")
    text(ax, 34.5, 34.2, "msgpack or JSON", 8.5)
    text(
        ax,
        34.5,
        26.5,
        "TrainingBatch, dicts,\nyour msgspec Structs\n\n"
        "checked before anything\nis visible (NaN, lengths)",
        8,
    )


def frame(ax: Axes) -> None:
    box(ax, 49, 10, 25, 40, FRAME)
    text(ax, 61.5, 47.4, "Frame", 11, weight="bold")
    text(ax, 61.5, 44.4, "a small header + the arrays' own buffers", 7.5, color=SOFT)
    # main message: header, then columns (one buffer per field, plus offsets)
    text(ax, 50.6, 41.2, "main message", 8.5, ha="left", weight="bold")
    ax.add_patch(Rectangle((50.6, 35.6), 3.6, 4, facecolor=HEADER, edgecolor=INK, lw=0.8))
    text(ax, 52.4, 37.6, "hdr", 7)
    x0 = 54.6
    for name, w in (("token_ids", 7.2), ("logprobs", 6.4), ("mask", 4.4)):
        ax.add_patch(Rectangle((x0, 35.6), w, 4, facecolor=BUFFER, edgecolor=INK, lw=0.8))
        text(ax, x0 + w / 2, 37.6, name, 7)
        x0 += w + 0.4
    text(ax, 61.5, 32.4, "columns: one buffer per field\n+ offsets (cu_seqlens)", 7.5, color=SOFT)
    # sidecar: routed experts raw
    text(ax, 50.6, 27.8, "sidecar", 8.5, ha="left", weight="bold")
    ax.add_patch(Rectangle((50.6, 22.2), 21.8, 4, facecolor=SIDECAR, edgecolor=INK, lw=0.8))
    text(ax, 61.5, 24.2, "routed_experts, raw: most of the bytes", 7.5)
    # a step: one message per rank, or parts committed one by one, then a seal
    text(ax, 50.6, 18.8, "a step, part by part", 8.5, ha="left", weight="bold")
    x0 = 50.6
    for label, w, colour in (("part", 4.6, BUFFER),) * 3 + (("seal", 4.6, HEADER),):
        ax.add_patch(Rectangle((x0, 13.2), w, 4, facecolor=colour, edgecolor=INK, lw=0.8))
        text(ax, x0 + w / 2, 15.2, label, 7)
        x0 += w + 1.13
    text(ax, 61.5, 11.4, "each part committed as it finishes", 7.5, color=SOFT)


DESTS = (
    ("directory, file://", "shared FS, NFS, tmpfs"),
    ("s3://, gs://, fsspec", "objects, no shared FS"),
    ("zmq+tcp://, zmq+ipc://", "streamed, nothing stored"),
    ("ray://NAME", "Ray's object store"),
)


def destinations(ax: Axes) -> list[float]:
    text(ax, 89.5, 55.2, "destination (the URL picks it)", 10, weight="bold")
    ys = []
    for i, (name, what) in enumerate(DESTS):
        y = 44.5 - i * 11
        box(ax, 79, y, 21, 8.6, DEST)
        text(ax, 89.5, y + 5.7, name, 8.5, family="monospace", weight="bold")
        text(ax, 89.5, y + 2.4, what, 7.5, color=SOFT)
        ys.append(y + 4.3)
    return ys


def ranks(ax: Axes) -> list[float]:
    text(ax, 114.5, 55.2, "trainer ranks", 10, weight="bold")
    ys = []
    for i, name in enumerate(("rank 0", "rank 1", "rank N")):
        y = 41 - i * 12.5
        box(ax, 106, y, 17, 9, RANK)
        text(ax, 114.5, y + 6.2, name, 9, weight="bold")
        text(ax, 114.5, y + 2.7, "receive() / aparts()", 7.5, family="monospace")
        ys.append(y + 4.5)
    text(
        ax,
        114.5,
        9.2,
        "read-only views of the\nmmap, frame or object store;\nchecksums verified",
        7.5,
        color=SOFT,
    )
    return ys


def notes(ax: Axes) -> None:
    # worker threads under the producer, codec and frame: the loop stays free
    box(ax, 1, 2.2, 73, 6.6, THREADS, edge=SOFT, ls="--", lw=0.9)
    text(
        ax,
        37.5,
        5.5,
        "encode, check, checksum and write run in worker threads, in slices of ~0.3 ms:"
        " the producer's event loop stays free",
        8.5,
        color=SOFT,
    )
    text(
        ax,
        89.5,
        4.2,
        "sidecar first, main message last:\na step (or a part) is whole or absent;\n"
        "kept until every rank consumed it",
        7.5,
        color=SOFT,
    )


def draw(png: Path | None) -> None:
    plt.rcParams["svg.fonttype"] = "path"  # text as outlines: no font needed to show it
    plt.rcParams["svg.hashsalt"] = "rlwire"  # the same SVG bytes every run
    fig = plt.figure(figsize=(W / 10, H / 10))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, W)
    ax.set_ylim(0, H)
    ax.axis("off")
    text(
        ax,
        1,
        55.2,
        "one step, from the producer to the trainer ranks",
        11,
        ha="left",
        weight="bold",
    )
    text(
        ax,
        1,
        51.6,
        "xxh3 checksum per buffer; no pickle; zero-copy views",
        8.5,
        ha="left",
        color=SOFT,
    )
    producer(ax)
    codec(ax)
    frame(ax)
    arrow(ax, (20, 31), (25, 31))
    arrow(ax, (44, 31), (49, 31))
    dest_ys = destinations(ax)
    rank_ys = ranks(ax)
    for y in dest_ys:
        arrow(ax, (74, 31), (79, y), lw=1.0)
    for y in dest_ys:
        for r in rank_ys:
            ax.plot((100, 106), (y, r), color=SOFT, lw=0.5, alpha=0.55)
    for r in rank_ys:
        arrow(ax, (104.6, r), (106, r), lw=1.0, color=SOFT)
    notes(ax)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, format="svg", metadata={"Date": None})
    if png is not None:
        fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"wrote {OUT}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--png", type=Path, help="also write a PNG here")
    draw(p.parse_args().png)


if __name__ == "__main__":
    main()
