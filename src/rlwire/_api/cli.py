"""The ``rlwire`` command: ``rlwire demo`` and ``rlwire inspect PATH [--type MODULE:NAME]``
(the message described, then its manifest; ``--part N`` or ``--json``: the manifest alone).

The benchmark suite needs a source checkout (its scripts are not installed), so it is run
there as ``python3 tasks.py bench``."""

from __future__ import annotations

import argparse
import itertools
import os
import pkgutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
import numpy as np

from rlwire._api.manifest import Manifest
from rlwire._api.receiver import open_receiver
from rlwire._api.schema import TrainingBatch
from rlwire._api.sender import open_sender
from rlwire._api.synthetic import assert_batches_equal, make_batch
from rlwire._core.errors import ConfigError, RlwireError
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


def _inspect(ns: argparse.Namespace) -> int:
    path = ns.path  # a directory or a URL (s3://..., memory://...), as open_receiver takes
    step, rank = ns.step, ns.rank
    if ns.json or ns.part is not None:  # the manifest alone: envelope and header only
        with open_receiver(path, rank=rank, record_consumed=False) as receiver:
            manifest = receiver.manifest(step, part=ns.part)
        if manifest is None:
            part = "" if ns.part is None else f" part {ns.part}"
            print(f"{path}: no step {step}{part} for rank {rank}", file=sys.stderr)
            return 1
        print(msgspec.json.encode(manifest).decode() if ns.json else _manifest_text(manifest))
        return 0
    target = _load_type(ns.type) if ns.type else Any
    try:
        with open_receiver(
            path, type=target, start_step=step, rank=rank, record_consumed=False
        ) as receiver:
            obj = receiver.poll()
    except (RecursionError, MemoryError) as exc:  # a type of the user's, say
        print(f"rlwire: {path}: cannot decode step {step} rank {rank}: {exc!r}", file=sys.stderr)
        return 2
    if obj is None:
        print(f"{path}: no step {step} for rank {rank}", file=sys.stderr)
        return 1
    print(f"step {step} rank {rank}: {_size(*_nbytes(obj, _MAX_VISITS))}{_describe(obj)}")
    with open_receiver(path, rank=rank, record_consumed=False) as receiver:
        manifest = receiver.manifest(step)
    if manifest is not None:
        print(_manifest_text(manifest))
    return 0


def _manifest_text(m: Manifest) -> str:
    """The manifest, a line for the message and one per column."""
    where = "" if m.part is None else f" part {m.part} (key {m.key!r})"
    rows = "no columns" if m.rows is None else f"{m.rows} rows"
    lines = [
        f"manifest of step {m.step} rank {m.rank}{where}: {_size(m.size)} stored, codec "
        f"{m.codec}, id {m.id.hex()}, {rows}" + (f" in {m.field!r}" if m.field else "")
    ]
    for c in m.columns:
        kind = (
            f"{c.dtype} rows [n{''.join(f', {d}' for d in c.row_shape)}]"
            if c.dtype
            else "one value a row, one array"
            if c.size
            else "values in the codec header"
        )
        sums = " ".join(f"{x:016x}" for x in c.checksums)
        lines.append(
            f"  {c.name}: {kind}, {_size(c.size)}, buffers {list(c.buffers)}"
            + (f", xxh3-64 {sums}" if sums else "")
        )
    return "\n".join(lines)


# The description is bounded whatever the message holds: this many levels, fields and
# items shown per level, and objects visited to add up sizes.
_MAX_DEPTH = 8
_MAX_FIELDS = 24
_MAX_ITEMS = 3
_MAX_VISITS = 1_000_000
_TITLE_VISITS = 20_000


def _load_type(spec: str) -> Any:
    """The type ``module:Name`` (``Name`` may be dotted) names, imported."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigError(f"--type {spec!r}: expected module:Name, e.g. myproject.types:Rollout")
    try:
        return pkgutil.resolve_name(spec)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--type {spec!r}: {exc}") from None


def _fields(obj: Any, most: int) -> dict[str, Any] | None:
    """A Struct's or dict's first ``most`` fields by name, or None for anything else."""
    if isinstance(obj, msgspec.Struct):
        names = obj.__struct_fields__[: max(most, 0)]
        return {name: getattr(obj, name) for name in names}
    if isinstance(obj, dict):
        items = itertools.islice(obj.items(), max(most, 0))
        return {str(key)[:100]: value for key, value in items}
    return None


def _nbytes(obj: Any, visits: int) -> tuple[int, int]:
    """The bytes of the arrays, bytes and strings in ``obj``, visiting at most ``visits``
    objects (without recursion: a message may nest deeper than Python's stack), and the
    visits left: negative if it stopped before the end."""
    total, stack = 0, [obj]
    while stack:
        visits -= 1
        if visits < 0:
            return total, visits
        item = stack.pop()
        if isinstance(item, np.ndarray | memoryview):
            total += int(item.nbytes)
        elif isinstance(item, bytes | bytearray | str):
            total += len(item)
        elif isinstance(item, list | tuple):
            stack.extend(item[: visits + 1])
        else:
            fields = _fields(item, visits + 1)
            if fields is not None:
                stack.extend(fields.values())
    return total, visits


def _size(nbytes: int, visits_left: int = 0) -> str:
    if nbytes < 10_000:
        text = f"{nbytes} bytes"
    else:
        text = f"{nbytes / 1e3:.1f} kB" if nbytes < 10_000_000 else f"{nbytes / 1e6:.1f} MB"
    return text if visits_left >= 0 else f"over {text}"


def _describe(obj: Any, indent: str = "") -> str:
    if isinstance(obj, np.ndarray):
        return f" ndarray {obj.dtype} {list(obj.shape)} ({obj.nbytes} bytes)"
    if isinstance(obj, memoryview | bytes | bytearray):
        return f" bytes ({memoryview(obj).nbytes})"
    inner = indent + "  "
    fields = _fields(obj, _MAX_FIELDS + 1)
    deep = len(inner) > 2 * _MAX_DEPTH
    if fields is not None:
        kind = f" {type(obj).__name__}" if isinstance(obj, msgspec.Struct) else ""
        if deep:
            return f"{kind or ' dict'} (nested too deep to show)"
        shown = list(fields.items())[:_MAX_FIELDS]
        lines = [f"{inner}{k}:{_describe(v, inner)}" for k, v in shown]
        if len(fields) > _MAX_FIELDS:
            lines.append(f"{inner}... more fields")
        return "\n".join([kind, *lines])
    if isinstance(obj, list | tuple) and obj:
        title = f" {len(obj)} items ({_size(*_nbytes(obj, _TITLE_VISITS))})"
        if deep:
            return f"{title} (nested too deep to show)"
        head = [f"{inner}[{i}]:{_describe(v, inner)}" for i, v in enumerate(obj[:_MAX_ITEMS])]
        more = [f"{inner}... {len(obj) - _MAX_ITEMS} more"] if len(obj) > _MAX_ITEMS else []
        return "\n".join([title, *head, *more, *_per_field(obj, inner)])
    text = repr(obj)
    return f" {text[:200]}..." if len(text) > 200 else f" {text}"


def _per_field(items: list[Any] | tuple[Any, ...], indent: str) -> list[str]:
    """For a list of Structs or dicts: each field's bytes over all of them."""
    totals: dict[str, int] = {}
    visits = _TITLE_VISITS
    for item in items:
        fields = _fields(item, _MAX_FIELDS + 1)
        if fields is None or len(fields) > _MAX_FIELDS:
            return []
        for name, value in fields.items():
            size, visits = _nbytes(value, visits)
            totals[name] = totals.get(name, 0) + size
            if visits < 0:
                break
        if visits < 0:
            break
    sizes = ", ".join(f"{name} {_size(n)}" for name, n in totals.items() if n)
    some = "" if visits >= 0 else " (adding up the first ones)"
    return [f"{indent}bytes per field{some}, all {len(items)}: {sizes}"] if sizes else []


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
    inspect.add_argument(
        "path", help="the directory or URL a sender writes to (s3://bucket/run, file://...)"
    )
    inspect.add_argument("--step", type=int, default=0)
    inspect.add_argument("--rank", type=int, default=0)
    inspect.add_argument("--part", type=int, help="the manifest of this part of the step")
    inspect.add_argument("--json", action="store_true", help="the manifest alone, as JSON")
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
