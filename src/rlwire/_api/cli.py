"""The ``rlwire`` command: ``rlwire demo`` and ``rlwire inspect PATH [--type MODULE:NAME]``
(the message described, then its manifest; ``--part N`` or ``--json``: the manifest alone).

The benchmark suite needs a source checkout (its scripts are not installed), so it is run
there as ``python3 tasks.py bench``."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import anyio

from rlwire._api.inspection import inspect
from rlwire._api.receiver import open_receiver
from rlwire._api.schema import TrainingBatch
from rlwire._api.sender import open_sender
from rlwire._api.synthetic import assert_batches_equal, make_batch
from rlwire._core.errors import RlwireError
from rlwire._core.lag import LagMonitor, percentile

__all__ = ["main"]

_ARRAYS = ("token_ids", "mask", "logprobs", "temperatures", "advantages", "routed_experts")


def _step_batch(step: int, ns: argparse.Namespace) -> TrainingBatch:
    """The demo's batch for ``step``: the producer and the trainer make the same bits."""
    return make_batch(ns.samples, ns.tokens, seed=step * ns.samples, layers=ns.layers, topk=ns.topk)


def _batch_args(ns: argparse.Namespace) -> dict[str, int]:
    return {"samples": ns.samples, "tokens": ns.tokens, "layers": ns.layers, "topk": ns.topk}


def _trainer(ns: argparse.Namespace) -> int:
    """The demo's trainer process: receive every step, check it bit-exact, report."""
    with open_receiver(ns.dir) as receiver:
        for step in range(ns.steps):
            batch = receiver.receive(timeout=ns.timeout)
            try:
                assert_batches_equal(batch, _step_batch(step, ns))
                ok = True
            except AssertionError:
                ok = False
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
        "rlwire._api.cli",
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
                batch = await anyio.to_thread.run_sync(_step_batch, step, ns)
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


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``least`` (else a usage error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value}: at least {least}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlwire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def batch_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--samples", type=_count(0), default=64, help="samples per step")
        p.add_argument("--tokens", type=_count(0), default=4096, help="tokens per sample (at most)")
        p.add_argument("--layers", type=_count(0), default=24, help="MoE layers")
        p.add_argument("--topk", type=_count(0), default=8, help="experts per token")

    demo = sub.add_parser("demo", help="send synthetic batches to a trainer process")
    demo.add_argument("--steps", type=_count(1), default=40, help="steps to send (from 1)")
    demo.add_argument("--dir", help="directory to use (default: a new temporary one)")
    batch_options(demo)
    trainer = sub.add_parser("_trainer")  # the demo's other process
    trainer.add_argument("--dir", required=True)
    trainer.add_argument("--steps", type=int, required=True)
    trainer.add_argument("--timeout", type=float, default=60)
    batch_options(trainer)
    inspect = sub.add_parser("inspect", help="describe one stored message")
    inspect.add_argument(
        "path",
        help="the directory or URL a sender writes to (s3://bucket/run, file://...), or "
        "one of its step files (step-00000003.rank-0001.rlw), or its fence (fence.rlw)",
    )
    inspect.add_argument("--step", type=int, help="the step (default 0, or the file's)")
    inspect.add_argument("--rank", type=int, help="the rank (default 0, or the file's)")
    inspect.add_argument("--part", type=int, help="the manifest of this part of the step")
    inspect.add_argument(
        "--json",
        action="store_true",
        help="the manifest alone, as JSON (a step filled part by part: a list of its "
        "parts'), its XXH3-64 checksums as strings of 16 hex digits",
    )
    inspect.add_argument(
        "--type",
        metavar="MODULE:NAME",
        help="decode into this type (e.g. myproject.types:Rollout): field names for "
        "array_like Structs, which the message stores as lists",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlwire`` command."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["bench"]:  # the command of earlier versions
        print(
            "rlwire: the benchmark suite moved out of the installed command: run "
            "`python3 tasks.py bench` in a source checkout",
            file=sys.stderr,
        )
        return 2
    ns = _parser().parse_args(args)
    try:
        if ns.command == "_trainer":
            return _trainer(ns)
        if ns.command == "inspect":
            return inspect(ns)
        if ns.dir:
            return anyio.run(_demo, ns, ns.dir)
        with tempfile.TemporaryDirectory(prefix="rlwire-demo-") as directory:
            return anyio.run(_demo, ns, directory)
    except RlwireError as exc:
        print(f"rlwire: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # its reader went (rlwire inspect ... | head): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
