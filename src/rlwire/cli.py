"""The ``rlwire`` command: ``rlwire demo`` and ``rlwire inspect PATH``."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from ._aio import LagMonitor, percentile
from .errors import RlwireError
from .receiver import open_receiver
from .schema import TrainingBatch, TrainingSample
from .sender import open_sender

__all__ = ["main", "make_batch"]

_ARRAYS = ("token_ids", "mask", "logprobs", "temperatures", "advantages", "routed_experts")


def make_batch(
    step: int, *, samples: int, tokens: int, layers: int, topk: int, seed: int = 0
) -> TrainingBatch:
    """A deterministic synthetic batch for ``step``: the same arguments give the same bits.

    Example:
        >>> b = make_batch(0, samples=2, tokens=16, layers=4, topk=2)
        >>> b.samples[0].routed_experts.shape[1:]  # [seq_len, layers, topk], ragged seq_len
        (4, 2)
    """
    rng = np.random.default_rng([seed, step])
    out = []
    for i in range(samples):
        n = tokens - int(rng.integers(0, max(1, tokens // 8)))  # ragged, like real rollouts
        mask = np.ones(n, dtype=bool)
        mask[: n // 4] = False  # the prompt is not trained on
        out.append(
            TrainingSample(
                token_ids=rng.integers(0, 151_936, n, dtype=np.int32),
                mask=mask,
                logprobs=-rng.exponential(1.0, n).astype(np.float32),
                temperatures=np.full(n, 1.0, dtype=np.float32),
                advantages=np.full(n, rng.standard_normal(), dtype=np.float32),
                env_name=f"env-{i % 3}",
                routed_experts=rng.integers(0, 256, (n, layers, topk), dtype=np.uint8),
            )
        )
    return TrainingBatch(samples=out)


def _same(a: TrainingBatch, b: TrainingBatch) -> bool:
    if len(a.samples) != len(b.samples):
        return False
    for x, y in zip(a.samples, b.samples, strict=True):
        for name in _ARRAYS:
            u, v = getattr(x, name), getattr(y, name)
            if u.dtype != v.dtype or u.shape != v.shape or u.tobytes() != v.tobytes():
                return False
        if x.env_name != y.env_name:
            return False
    return True


def _batch_args(ns: argparse.Namespace) -> dict[str, int]:
    return {"samples": ns.samples, "tokens": ns.tokens, "layers": ns.layers, "topk": ns.topk}


def _trainer(ns: argparse.Namespace) -> int:
    """The demo's trainer process: receive every step, check it bit-exact, report."""
    with open_receiver(ns.dir) as receiver:
        for step in range(ns.steps):
            batch = receiver.receive(timeout=ns.timeout)
            expected = make_batch(step, **_batch_args(ns))
            ok = _same(batch, expected)
            print(f"{'ok' if ok else 'MISMATCH'} {step}", flush=True)
            if not ok:
                return 1
    return 0


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = width * done // max(1, total)
    return "[" + "#" * filled + "." * (width - filled) + "]"


async def _demo(ns: argparse.Namespace, directory: str) -> int:
    verified: list[int] = []
    trainer_cmd = [
        sys.executable,
        "-m",
        "rlwire.cli",
        "_trainer",
        "--dir",
        directory,
        "--steps",
        str(ns.steps),
        "--timeout",
        "60",
        *(f"--{k}={v}" for k, v in _batch_args(ns).items()),
    ]
    print(
        f"rlwire demo: {ns.steps} steps of {ns.samples} samples x ~{ns.tokens} tokens, "
        f"routed_experts [tokens, {ns.layers}, {ns.topk}] uint8, sidecar on"
    )
    print(f"  producer: this process (anyio); trainer: another process; files in {directory}")
    # Open the destination first: a directory holding steps fails here, before any trainer.
    async with (
        open_sender(directory, sidecar=("routed_experts",)) as sender,
        await anyio.open_process(trainer_cmd, stderr=None) as trainer,
    ):

        async def read_trainer() -> None:
            assert trainer.stdout is not None
            buffered = b""
            async for chunk in trainer.stdout:
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    status, step = line.decode().split()
                    if status == "ok":
                        verified.append(int(step))

        all_lags: list[float] = []
        total_bytes = 0
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_trainer)
            for step in range(ns.steps):
                batch = await anyio.to_thread.run_sync(
                    functools.partial(make_batch, step, **_batch_args(ns))
                )
                nbytes = sum(getattr(s, f).nbytes for s in batch.samples for f in _ARRAYS)
                async with LagMonitor() as lag:
                    t0 = time.perf_counter()
                    await sender.send(batch)
                    elapsed = time.perf_counter() - t0
                all_lags.extend(lag.lags)
                total_bytes += nbytes
                print(
                    f"{_bar(step + 1, ns.steps)} step {step + 1:>3}/{ns.steps} "
                    f"{nbytes / 1e6:7.1f} MB in {elapsed * 1e3:6.1f} ms "
                    f"{nbytes / 1e6 / elapsed:7.0f} MB/s | loop lag max "
                    f"{lag.max * 1e3:5.2f} ms p99 {lag.percentile(99) * 1e3:5.2f} ms | "
                    f"trainer verified {len(verified)}",
                    flush=True,
                )
            code = await trainer.wait()
            tg.cancel_scope.cancel()
    worst, p99 = max(all_lags, default=0.0), percentile(all_lags, 99)
    print(
        f"sent {total_bytes / 1e9:.2f} GB in {time.perf_counter() - start:.1f} s; loop lag "
        f"during sends: max {worst * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"
    )
    print(
        f"  (the trainer process shares this machine's {os.cpu_count()} cores with the producer; "
        "docs/benchmarks.md measures lag without it)"
    )
    if code != 0 or len(verified) != ns.steps:
        print(
            f"FAILED: the trainer verified {len(verified)} of {ns.steps} steps (exit code {code})",
            file=sys.stderr,
        )
        return 1
    print(f"trainer verified all {ns.steps} steps bit-exact")
    return 0


def _inspect(ns: argparse.Namespace) -> int:
    path = Path(ns.path)
    step, rank = ns.step, ns.rank
    with open_receiver(path, type=Any, start_step=step, rank=rank) as receiver:
        obj = receiver.poll()
    if obj is None:
        print(f"{path}: no step {step} for rank {rank}", file=sys.stderr)
        return 1
    print(_describe(obj))
    return 0


def _describe(obj: Any, indent: str = "") -> str:
    if isinstance(obj, np.ndarray):
        return f"ndarray {obj.dtype} {list(obj.shape)} ({obj.nbytes} bytes)"
    if isinstance(obj, memoryview):
        return f"bytes ({obj.nbytes})"
    if isinstance(obj, dict):
        inner = indent + "  "
        return "\n".join([""] + [f"{inner}{k}: {_describe(v, inner)}" for k, v in obj.items()])
    if isinstance(obj, list) and obj:
        inner = indent + "  "
        head = [f"{inner}[{i}]: {_describe(v, inner)}" for i, v in enumerate(obj[:3])]
        more = [f"{inner}... {len(obj) - 3} more"] if len(obj) > 3 else []
        return "\n".join(["", *head, *more])
    return repr(obj)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlwire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def batch_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--samples", type=int, default=64, help="samples per step")
        p.add_argument("--tokens", type=int, default=4096, help="tokens per sample (at most)")
        p.add_argument("--layers", type=int, default=24, help="MoE layers")
        p.add_argument("--topk", type=int, default=8, help="experts per token")

    demo = sub.add_parser("demo", help="send synthetic batches to a trainer process")
    demo.add_argument("--steps", type=int, default=40)
    demo.add_argument("--dir", help="directory to use (default: a new temporary one)")
    batch_options(demo)
    trainer = sub.add_parser("_trainer")  # the demo's other process
    trainer.add_argument("--dir", required=True)
    trainer.add_argument("--steps", type=int, required=True)
    trainer.add_argument("--timeout", type=float, default=60)
    batch_options(trainer)
    inspect = sub.add_parser("inspect", help="describe one stored message")
    inspect.add_argument("path", help="the directory a sender writes to")
    inspect.add_argument("--step", type=int, default=0)
    inspect.add_argument("--rank", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlwire`` command."""
    ns = _parser().parse_args(argv)
    try:
        if ns.command == "_trainer":
            return _trainer(ns)
        if ns.command == "inspect":
            return _inspect(ns)
        if ns.dir:
            return anyio.run(_demo, ns, ns.dir)
        with tempfile.TemporaryDirectory(prefix="rlwire-demo-") as directory:
            return anyio.run(_demo, ns, directory)
    except RlwireError as exc:
        print(f"rlwire: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
