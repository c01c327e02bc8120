"""The messages in tests/golden/: what each holds and how it was written.

The files were written once by rlwire 0.1.0 (wire format 1.0), the chunked case once by
the first rlwire that chunks heavy containers (format 1.0 with extension types 4 and 5),
the ZeroMQ messages once by the first rlwire that speaks ZeroMQ version 2.0, the
``msgpack-1.1-*`` cases once by the first rlwire that writes format 1.1 (lists stored as
columns, extension type 7, and ragged arrays, type 6), and ``msgpack-1.2-parts`` once by
the first rlwire that writes steps part by part (format 1.2), ``msgpack-1.3-fields`` once
by the first rlwire that writes appended fields as format 1.3, ``msgpack-1.5-fields`` once
by the first that ties them to the step's message (format 1.5), ``msgpack-1.6-parts``
once by the first that ties a part to its rank's part 0 (format 1.6), ``msgpack-1.8-ranks``
once by the first whose whole steps record how many ranks they were sent to (format 1.8),
with
``python tests/golden_cases.py [NAME...]`` (without names: the cases that have no files
yet); never rewrite them to make a test pass. A reader must keep decoding them into
exactly the objects below.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np

import rlwire
from rlwire._frame.compression import Compressor

GOLDEN = Path(__file__).parent / "golden"


def _sample(i: int) -> rlwire.TrainingSample:
    n = 300 + 100 * i
    return rlwire.TrainingSample(
        token_ids=np.arange(n, dtype=np.int64) * 7 % 50_000,
        mask=np.arange(n) % 3 != 0,
        logprobs=-np.linspace(0, 4, n, dtype=np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=np.full(n, 0.5 - i, np.float32),
        env_name=f"env-{i}",
        routed_experts=(np.arange(n * 4 * 2, dtype=np.uint8) % 5).reshape(n, 4, 2),
    )


def batch() -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=[_sample(i) for i in range(3)])


def mixed() -> dict[str, Any]:
    return {
        "fortran": np.asfortranarray(np.arange(600, dtype=">f8").reshape(20, 30)),
        "small": np.array([1.5, 2.5], dtype=np.float32),
        "blob": bytes(range(256)) * 20,
        "nested": [{"step": 1, "ok": True, "name": "x"}, None, 2.5],
    }


def metrics() -> dict[str, Any]:
    return {"step": 3, "loss": 0.25, "rewards": [1.0, 0.0, 0.5], "env": "gsm8k"}


def chunked() -> dict[str, Any]:
    """Containers heavy enough that the msgpack codec writes them as chunks (ext 4, 5)."""
    return {
        "input_ids": [i * 7 % 50_000 for i in range(70_000)],
        "logprobs": [-(i % 97) / 16 for i in range(40_000)],
        "rows": [[i, i + 1, i + 2] for i in range(12_000)],
        "by_name": {f"k{i}": i for i in range(40_000)},
        "routed_experts": bytes(range(256)) * 40,
    }


# Format 1.1: lists stored as columns (ext 7), ragged arrays (ext 6), Chunked arrays.


def columns_batch() -> rlwire.TrainingBatch:
    """A default batch whose samples are stored as columns: per-token fields as ragged
    columns (routed experts with a trailing shape, the mask inline), the env name a
    column of strings, a per-sample scalar in ``extras`` (a 0-d array each) and
    ``ref_logprobs`` present in some samples only (a column of values, not ragged)."""
    samples = [_sample(i) for i in range(4)]
    for i, sample in enumerate(samples):
        sample.extras = {"reward": np.array(0.25 * i, np.float32)}
        if i % 2:
            sample.ref_logprobs = sample.logprobs - 0.125
    samples[2].token_ids = samples[2].token_ids[:0]  # a sample of no tokens
    for name in ("mask", "logprobs", "temperatures", "advantages", "routed_experts"):
        setattr(samples[2], name, getattr(samples[2], name)[:0])
    return rlwire.TrainingBatch(samples=samples)


def _rows_of(batch: rlwire.TrainingBatch, name: str) -> list[Any]:
    return [getattr(sample, name) for sample in batch.samples]


def _ragged(rows: list[np.ndarray]) -> rlwire.Ragged:
    """The ragged column of ``rows``, in their own dtype (byte order included)."""
    return rlwire.Ragged.from_lengths(
        np.concatenate(rows, dtype=rows[0].dtype), [len(r) for r in rows]
    )


def columns_batch_as_columns() -> rlwire.TrainingBatch:
    """``columns_batch()`` received with ``as_columns=True``."""
    b = columns_batch()
    ragged = ("token_ids", "mask", "logprobs", "temperatures", "advantages", "routed_experts")
    cols: dict[str, Any] = {n: _ragged(_rows_of(b, n)) for n in ragged}
    for name in ("env_name", "ref_logprobs", "extras"):
        cols[name] = _rows_of(b, name)
    samples = rlwire.Columns({n: cols[n] for n in rlwire.TrainingSample.__struct_fields__})
    return rlwire.TrainingBatch(samples=samples)  # type: ignore[arg-type]


def packed() -> dict[str, Any]:
    """What a trainer already holds packed: Ragged arrays (out-of-band with a trailing
    shape, inline, of no rows) and a Columns sent as it is."""
    lengths = [5, 0, 400, 17]
    values = np.arange(sum(lengths) * 3, dtype=np.float32).reshape(-1, 3) / 8
    return {
        "hidden": rlwire.Ragged.from_lengths(values, lengths),
        "small": rlwire.Ragged(np.array([3, 1, 4, 1, 5], np.int16), [0, 2, 2, 5]),
        "none": rlwire.Ragged(np.zeros(0, np.int64), [0]),
        "micro_batch": rlwire.Columns(
            {
                "input_ids": rlwire.Ragged.from_lengths(
                    np.arange(2000, dtype=np.int32), [1500, 500]
                ),
                "position_ids": rlwire.Ragged(np.array([0, 1, 0], np.int64), [0, 2, 3]),
                "reward": [1.0, -0.5],
                "env": ["math", "code"],
            }
        ),
    }


def packed_as_columns() -> dict[str, Any]:
    """``packed()`` received with ``as_columns=True``: the Columns sent comes back as one,
    its list of floats as an array."""
    sent = packed()
    micro = sent["micro_batch"]
    columns = {n: micro[n] for n in micro.names}
    columns["reward"] = np.array(columns["reward"], np.float64)
    return {**sent, "micro_batch": rlwire.Columns(columns)}


def array_columns() -> dict[str, Any]:
    """A Columns whose array columns (one value a row) keep their dtype and shape: small
    (inline), large (out-of-band), in the sidecar, Fortran-order, big-endian, empty."""
    n = 700
    return {
        "batch": rlwire.Columns(
            {
                "reward": np.linspace(-1, 1, n, dtype=np.float32),
                "turns": (np.arange(n) % 7).astype(np.int8),
                "seed": np.full(n, 2**63 + 5, np.uint64),
                "done": np.arange(n) % 3 == 0,
                "hidden": np.asfortranarray(np.arange(n * 4, dtype=">f8").reshape(n, 4)),
                "logits": np.arange(n * 2, dtype=np.float16).reshape(n, 2),
                "ids": rlwire.Ragged.from_lengths(np.arange(n * 2), [2] * n),
            }
        ),
        "none": rlwire.Columns({"reward": np.zeros(0, np.float32), "x": np.zeros((0, 3))}),
    }


def array_columns_as_columns() -> dict[str, Any]:
    """``array_columns()`` received with ``as_columns=True``: as it was sent."""
    return array_columns()


def turns() -> dict[str, Any]:
    """Arrays grown turn by turn (:class:`rlwire.Chunked`), received as one array each:
    routed experts out-of-band in the sidecar, per-turn logprobs inline."""
    experts, logprobs = rlwire.Chunked(), rlwire.Chunked()
    for turn in range(6):
        n = 40 + 30 * turn
        experts.append((np.arange(n * 8, dtype=np.uint16) % (7 + turn)).reshape(n, 4, 2))
        logprobs.append(-np.linspace(0, 1, n // 10, dtype=np.float32) - turn)
    return {"routed_experts": experts, "logprobs": logprobs, "turns": 6}


class Roll(msgspec.Struct, rename="camel"):
    """A user's own sample: renamed fields (``tokenIds``), a per-sample float and str."""

    token_ids: np.ndarray
    old_logprobs: np.ndarray
    reward: float
    env_name: str


class Turn(msgspec.Struct, array_like=True):
    """A user's own positional sample (rows stored as arrays, layout 1)."""

    ids: np.ndarray
    score: int
    tag: str | None = None


class Rollouts(msgspec.Struct):
    renamed: list[Roll]
    positional: list[Turn]


def structs() -> Rollouts:
    return Rollouts(
        renamed=[
            Roll(
                token_ids=np.arange(100 * i, dtype=np.int64) % 977,
                old_logprobs=-np.linspace(0, 2, 100 * i).astype(np.float32),
                reward=i / 4,
                env_name=f"env-{i}",
            )
            for i in range(5)
        ],
        positional=[
            Turn(ids=np.arange(i + 1, dtype=np.uint32), score=i, tag=None if i % 2 else "t")
            for i in range(7)
        ],
    )


def dicts() -> list[dict[str, Any]]:
    """A long ``list[dict]``: its per-row ints a chunked column (ext 4 inside ext 7),
    big-endian rows, bytes out-of-band in a few rows."""
    return [
        {
            "ids": np.arange(i % 5, dtype=np.int16),
            "be": np.full(i % 3 + 1, i, dtype=">f4"),
            "n": i,
            "blob": bytes([i % 256]) * (5000 if i % 4000 == 1 else i % 3),
        }
        for i in range(9000)
    ]


def dicts_as_columns() -> rlwire.Columns:
    """``dicts()`` received with ``as_columns=True``."""
    rows = dicts()
    return rlwire.Columns(
        {
            "ids": _ragged([r["ids"] for r in rows]),
            "be": _ragged([r["be"] for r in rows]),
            "n": np.array([r["n"] for r in rows], np.int64),  # numbers of one kind
            "blob": [r["blob"] for r in rows],
        }
    )


class A(msgspec.Struct):
    ids: np.ndarray


class B(msgspec.Struct):
    ids: np.ndarray


def fallback() -> dict[str, Any]:
    """Lists that are not all columns. ``per_field``: rows of one shape whose fields
    differ, each such field a column of values (dtype, trailing shape, presence, number
    of dimensions), beside one ragged column. The others stay lists: rows that differ in
    keys, in Struct type, or whose first row holds no array."""
    return {
        "per_field": [
            {
                "ids": np.arange(i + 1, dtype=np.int32),
                "by_dtype": np.arange(i + 1, dtype=np.int32 if i % 2 else np.int64),
                "by_shape": np.ones((i + 1, 2 + i % 2), np.float32),
                "by_presence": np.arange(i + 2, dtype=np.uint8) if i != 1 else None,
                "by_ndim": np.zeros((2, 2) if i == 2 else (2,), np.float64),
            }
            for i in range(4)
        ],
        "by_keys": [{"ids": np.arange(3)}, {"ids": np.arange(2), "more": 1}],
        "by_type": [A(ids=np.arange(2)), B(ids=np.arange(3))],
        "first_without_array": [{"x": None}, {"x": np.arange(4)}],
    }


SMALL = 1024  # compress segments from 1 KiB so the golden files stay small

#: name -> (the object, open_sender options, the type to receive as)
CASES: dict[str, tuple[Callable[[], Any], dict[str, Any], Any]] = {
    "msgpack-plain": (batch, {}, rlwire.TrainingBatch),
    "msgpack-sidecar-zstd": (
        batch,
        {"sidecar": ("routed_experts",), "compression": Compressor("zstd", 3, SMALL)},
        rlwire.TrainingBatch,
    ),
    "msgpack-lz4": (mixed, {"compression": Compressor("lz4", 0, SMALL)}, Any),
    "msgpack-no-checksum": (mixed, {"checksum": False, "sidecar": "fortran"}, Any),
    "json": (metrics, {"codec": "json"}, Any),
    "msgpack-chunked": (
        chunked,
        {"sidecar": ("routed_experts",), "compression": Compressor("zstd", 3, SMALL)},
        Any,
    ),
    "msgpack-1.1-batch": (columns_batch, {}, rlwire.TrainingBatch),
    "msgpack-1.1-batch-sidecar-zstd": (
        columns_batch,
        {"sidecar": ("routed_experts",), "compression": Compressor("zstd", 3, SMALL)},
        rlwire.TrainingBatch,
    ),
    "msgpack-1.1-packed": (packed, {"compression": Compressor("lz4", 0, SMALL)}, Any),
    "msgpack-1.1-chunked-turns": (turns, {"sidecar": ("routed_experts",)}, Any),
    "msgpack-1.1-structs": (structs, {}, Rollouts),
    "msgpack-1.1-dicts": (dicts, {"compression": Compressor("zstd", 3, SMALL)}, Any),
    "msgpack-1.1-fallback": (fallback, {}, Any),
    "msgpack-1.4-array-columns": (array_columns, {"sidecar": ("logits",)}, Any),
}

#: name -> what the case's message decodes to with ``as_columns=True`` (same type)
AS_COLUMNS: dict[str, Callable[[], Any]] = {
    "msgpack-1.1-batch": columns_batch_as_columns,
    "msgpack-1.1-batch-sidecar-zstd": columns_batch_as_columns,
    "msgpack-1.1-packed": packed_as_columns,
    "msgpack-1.1-dicts": dicts_as_columns,
    "msgpack-1.4-array-columns": array_columns_as_columns,
}


#: ZeroMQ packets are never stored: this file holds what a sender sent a receiver for
#: one message (``batch()``, routed experts as sidecar, lz4, cut into data packets of
#: 2 KiB), as a msgpack list of packets, each a list of ZeroMQ frames; the ZeroMQ version is
#: in its name.
ZMQ_GOLDEN = GOLDEN / "zmq-2.0.msgpack"
ZMQ_OPTIONS: dict[str, Any] = {
    "sidecar": ("routed_experts",),
    "compression": Compressor("lz4", 0, SMALL),
    "storage_options": {"message_bytes": 2 << 10},
}


def _write_zmq() -> None:
    """Send ``batch()`` to a raw DEALER socket and keep the messages it gets."""
    import tempfile

    import msgspec
    from helpers import capture_zmq_message

    got = capture_zmq_message(tempfile.mkdtemp(), batch(), **ZMQ_OPTIONS)
    ZMQ_GOLDEN.write_bytes(msgspec.msgpack.encode(got))


#: A step filled part by part (format 1.2): name -> (key, rank, samples) of each part
#: in put order, and the open_sender options. Written once by the first rlwire that
#: writes parts and seals.
PARTS_CASES: dict[
    str, tuple[list[tuple[str | int, int, list[rlwire.TrainingSample]]], dict[str, Any]]
] = {
    "msgpack-1.2-parts": (
        [("g0", 0, [_sample(0), _sample(1)]), ("g1", 1, [_sample(2)]), (7, 0, [_sample(3)])],
        {"sidecar": ("routed_experts",), "compression": Compressor("lz4", 0, SMALL)},
    ),
}
#: The same parts, written by the first rlwire whose later parts name the part 0 they
#: follow (format 1.6).
PARTS_CASES["msgpack-1.6-parts"] = PARTS_CASES["msgpack-1.2-parts"]


async def _write_parts(name: str) -> None:
    parts, options = PARTS_CASES[name]
    path = GOLDEN / name
    shutil.rmtree(path, ignore_errors=True)
    async with rlwire.open_sender(path, **options) as sender:
        async with sender.open_step(ranks=2) as writer:
            for key, rank, samples in parts:
                await writer.put(samples, key=key, rank=rank)


def _values(samples: list[rlwire.TrainingSample], scale: float) -> rlwire.Ragged:
    """A per-token column of ``samples`` (one float32 per token), e.g. reference logprobs."""
    return _ragged([s.logprobs * np.float32(scale) - np.float32(0.125) for s in samples])


#: Fields appended to committed steps (format 1.3, then 1.5: the same calls), and the
#: steps they are appended to:
#: step 0 sent whole to two ranks (rank 0 samples 0-1, rank 1 sample 2), step 1 filled
#: part by part (rank 0 parts "a" = sample 0 and "b" = samples 1-2, rank 1 part "c" =
#: sample 3), both with routed experts in the sidecar. Each entry of APPENDED is one
#: ``add_fields(step, fields, rank=rank)`` call, in order.
FIELDS_CASES = ("msgpack-1.3-fields", "msgpack-1.5-fields")
STEP0 = ([0, 1], [2])
STEP1 = [("a", 0, [0]), ("b", 0, [1, 2]), ("c", 1, [3])]


def appended() -> list[tuple[int, int, dict[str, Any]]]:
    s = [_sample(i) for i in range(4)]
    return [
        (0, 0, {"ref_logprobs": _values(s[:2], 1.0)}),
        (
            0,
            0,
            {
                "values": _values(s[:2], -2.0),
                "score": np.array([0.5, -1.0]),
                "judge": ["ok", "bad"],
            },
        ),
        (0, 1, {"ref_logprobs": _values(s[2:3], 1.0)}),
        (1, 0, {"ref_logprobs": _values(s[:3], 0.5)}),
    ]


def fields_batch(rows: list[int]) -> rlwire.TrainingBatch:
    """The batch of samples ``rows`` (:func:`_sample`), as sent: no field appended."""
    return rlwire.TrainingBatch(samples=[_sample(i) for i in rows])


async def _write_fields(name: str) -> None:
    path = GOLDEN / name
    shutil.rmtree(path, ignore_errors=True)
    async with rlwire.open_sender(path, sidecar=("routed_experts",)) as sender:
        await sender.send_ranks([fields_batch(rows) for rows in STEP0])
        async with sender.open_step(ranks=2) as writer:
            for key, rank, rows in STEP1:
                await writer.put([_sample(i) for i in rows], key=key, rank=rank)
        for step, rank, fields in appended():
            await sender.add_fields(step, fields, rank=rank)


#: Steps sent whole that record how many ranks they were sent to (format 1.8): step 0
#: to two ranks (rank 0 samples 0-1, rank 1 sample 2), step 1 to rank 0 alone (sample 3).
RANKS_CASE = "msgpack-1.8-ranks"
RANKS_STEPS = ([[0, 1], [2]], [[3]])


async def _write_ranks() -> None:
    path = GOLDEN / RANKS_CASE
    shutil.rmtree(path, ignore_errors=True)
    async with rlwire.open_sender(path, sidecar=("routed_experts",)) as sender:
        for step in RANKS_STEPS:
            await sender.send_ranks([fields_batch(rows) for rows in step])


async def _write(name: str) -> None:
    make, options, _ = CASES[name]
    path = GOLDEN / name
    shutil.rmtree(path, ignore_errors=True)
    async with rlwire.open_sender(path, **options) as sender:
        await sender.send(make())


if __name__ == "__main__":
    # Without names, only the cases that have no files yet: the others stay as written.
    every = [*CASES, *PARTS_CASES, *FIELDS_CASES, RANKS_CASE, ZMQ_GOLDEN.name]
    missing = [c for c in every if not (GOLDEN / c).exists()]
    for case in sys.argv[1:] or missing:
        if case == ZMQ_GOLDEN.name:
            _write_zmq()
        elif case == RANKS_CASE:
            anyio.run(_write_ranks)
        elif case in FIELDS_CASES:
            anyio.run(_write_fields, case)
        elif case in PARTS_CASES:
            anyio.run(_write_parts, case)
        else:
            anyio.run(_write, case)
        print("wrote", GOLDEN / case)
