"""Fields appended to a committed step: ``await sender.add_fields(step, {...})``.

A later stage (a reference model adding ``ref_logprobs``, a critic adding ``values``)
stores new columns beside a step's samples without rewriting them. The sender checks
them against the step as stored (its row count, and each :class:`~rlwire.Ragged`'s row
lengths against the step's ``token_ids``), encodes them as one
:class:`~rlwire.Columns` and commits it as a file of its own
(:mod:`rlwire.transport._appended`). A receiver reads those files with the step
and hands the fields out with the others; one opened with ``fields=`` reads, of the
step itself, only the fields not appended, and waits for a named field that neither
the step nor its appended files hold yet.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import anyio
import msgspec
import numpy as np
from anyio import CancelScope, CapacityLimiter, to_thread

from rlwire._api.decoding import FrameDecoding
from rlwire._api.fields import FieldSelector
from rlwire._api.options import Limits
from rlwire._core.columns import Column, Columns
from rlwire._core.errors import (
    ConfigError,
    CorruptFrameError,
    DecodeError,
    FieldNotFoundError,
    RlwireError,
    SchemaError,
)
from rlwire._core.offload import drive_sliced
from rlwire._core.ragged import Ragged
from rlwire._core.slicing import run_sliced
from rlwire._frame.frame import Frame
from rlwire.codecs._registry import get_codec
from rlwire.transport._appended import (
    keeps_steps,
    read_appended,
    sink_appended,
    stage_fields,
    stored_frames,
)
from rlwire.transport._base import Sink, Source

__all__ = [
    "Appended",
    "AppendingSender",
    "FieldPending",
    "add_fields",
    "merge_appended",
    "read_with_appended",
]

#: The column the row lengths of an appended Ragged are checked against.
LENGTHS_FROM = "token_ids"


def _check_input(fields: Mapping[str, Column], rows: int | None) -> Columns:
    if not isinstance(fields, Mapping) or not fields:
        raise ConfigError(f"add_fields needs a non-empty mapping of name -> column, got {fields!r}")
    columns = Columns(fields)  # SchemaError naming the column: a kind or a length
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise ConfigError(f"rows must be a row count (int >= 0) or None, got {rows!r}")
    if rows is not None and len(columns) != rows:
        raise SchemaError(f"add_fields: the columns hold {len(columns)} rows, rows={rows}")
    return columns


def _samples(obj: Any) -> Columns | list[Any] | None:
    """The one list of samples in a decoded step (or part): itself, or its one value
    that is a list or a :class:`~rlwire.Columns`."""
    if isinstance(obj, Columns | list):
        return obj
    values = (
        obj.values()
        if isinstance(obj, dict)
        else (
            [getattr(obj, f) for f in obj.__struct_fields__]
            if isinstance(obj, msgspec.Struct)
            else []
        )
    )
    found = [v for v in values if isinstance(v, Columns | list)]
    return found[0] if len(found) == 1 else None


def _stored_rows(frames: list[Frame], decoding: FrameDecoding) -> tuple[int, np.ndarray | None]:
    """The step's row count and its rows' token counts (``None`` when it holds no
    ``token_ids`` column)."""
    count, lengths = 0, []
    for frame in frames:
        seconds = {"decompress": 0.0, "decode": 0.0}
        samples = _samples(run_sliced(decoding.decode(frame, Any, seconds, True)))
        if samples is None:
            raise ConfigError("add_fields: the step holds no list of samples to add fields to")
        count += len(samples)
        col = (
            samples[LENGTHS_FROM]
            if isinstance(samples, Columns) and LENGTHS_FROM in samples
            else None
        )
        if isinstance(col, Ragged):
            lengths.append(np.diff(col.offsets))
        elif len(samples):
            return count + sum(_count(f, decoding) for f in frames[frames.index(frame) + 1 :]), None
    return count, (np.concatenate(lengths) if lengths else np.zeros(0, np.int64))


def _count(frame: Frame, decoding: FrameDecoding) -> int:
    samples = _samples(
        run_sliced(decoding.decode(frame, Any, {"decompress": 0.0, "decode": 0.0}, True))
    )
    return 0 if samples is None else len(samples)


def _check_against(
    columns: Columns, names: list[str], count: int, lengths: np.ndarray | None
) -> None:
    """Refuse ``columns`` unless they fit the step: ``count`` rows, each Ragged's rows
    as long as ``lengths`` (the step's token counts), names not appended already."""
    if len(columns) != count:
        raise SchemaError(f"add_fields: the columns hold {len(columns)} rows, the step {count}")
    for name, column in columns.items():
        if name in names:
            raise SchemaError(f"add_fields: field {name!r} was appended to the step already")
        if isinstance(column, Ragged) and lengths is not None:
            bad = np.flatnonzero(np.diff(column.offsets) != lengths)
            if bad.size:
                row = int(bad[0])
                got = int(np.diff(column.offsets)[row])
                raise SchemaError(
                    f"add_fields: field {name!r} row {row} holds {got} values, "
                    f"its {LENGTHS_FROM} {int(lengths[row])}"
                )


def _prepare(sink: Any, step: int, rank: int, columns: Columns, limits: Limits) -> Frame:
    """Read and check the step as stored, then encode ``columns`` (in a worker thread)."""
    decoding = FrameDecoding(limits, None, writable=False, fields=frozenset({LENGTHS_FROM}))
    try:
        frames = stored_frames(
            sink, step, rank, FieldSelector(decoding, decoding.fields or frozenset())
        )
        decoding.fields = frozenset({LENGTHS_FROM})
    except FieldNotFoundError:  # no token_ids: the row count alone is checked
        decoding.fields = None
        frames = stored_frames(sink, step, rank, lambda frame: None)
    if frames is None:
        raise ConfigError(f"add_fields: step {step} is not committed (sent whole, or sealed)")
    count, lengths = _stored_rows(frames, decoding)
    # A field the step holds may be appended (TrainingSample.ref_logprobs, left None):
    # it takes the place of the step's. Twice appended, it is refused.
    appended = [
        n for f in sink_appended(sink, step, rank) for n in _decode_appended(f, decoding).names
    ]
    _check_against(columns, appended, count, lengths)
    return run_sliced(get_codec("msgpack")().encode_sliced({"fields": columns}))


def _decode_appended(frame: Frame, decoding: FrameDecoding) -> Columns:
    plain = copy.copy(decoding)
    plain.fields = None
    got = run_sliced(plain.decode(frame, Any, {"decompress": 0.0, "decode": 0.0}, True))
    columns = got.get("fields") if isinstance(got, dict) else None
    if not isinstance(columns, Columns):
        raise CorruptFrameError("a file of appended fields holds no columns")
    return columns


async def add_fields(
    sink: Sink,
    limiter: CapacityLimiter,
    limits: Limits,
    step: int,
    fields: Mapping[str, Column],
    rows: int | None,
    rank: int,
) -> None:
    """What :meth:`~rlwire.TrainingBatchSender.add_fields` does, its lock held."""
    if not keeps_steps(sink):
        raise ConfigError(
            f"add_fields needs a store that keeps steps (files, fsspec/S3); {sink!r} keeps "
            "none (a socket hands a step over and forgets it)"
        )
    columns = _check_input(fields, rows)
    try:
        frame = await to_thread.run_sync(
            _prepare, sink, step, rank, columns, limits, limiter=limiter
        )
        _, staged = await drive_sliced(stage_fields(cast(Any, sink), step, rank, frame), limiter)
        try:
            await staged.acommit(limiter)
        except BaseException:
            if not staged.visible:
                with CancelScope(shield=True):
                    await to_thread.run_sync(staged.discard, limiter=limiter)
            raise
    except RlwireError as exc:
        exc.add_context(step=step, rank=rank)
        raise


class AppendingSender:
    """The ``add_fields`` of :class:`~rlwire.TrainingBatchSender`."""

    _lock: anyio.Lock
    _sink: Sink
    _limiter: CapacityLimiter

    async def _open_locked(self) -> None:
        raise NotImplementedError

    async def add_fields(
        self,
        step: int,
        fields: Mapping[str, Column],
        *,
        rows: int | None = None,
        rank: int = 0,
    ) -> None:
        """Store ``fields`` (name -> :class:`~rlwire.Ragged`, array or list, one value
        per sample) beside ``rank``'s samples of the committed ``step``, atomically
        (docs/how-to/fields.md, "Add fields to a stored step").

        Raises:
            SchemaError: a row count differs from the step's (or ``rows``), a Ragged's
                row from the step's ``token_ids`` (names the field and the first bad
                row), or a field is in the step already.
            ConfigError: the sink keeps no steps (ZeroMQ, ``ray://``), or the step is not
                committed.
            TransportError: the store cannot be read or written.
        """
        async with self._lock:
            await self._open_locked()
            await add_fields(self._sink, self._limiter, Limits(), step, fields, rows, rank)


@dataclass
class Appended:
    """A step as read (a frame, or a sealed step's parts), with the columns appended to
    it and the fields its own read was limited to."""

    inner: Any
    columns: dict[str, Column]
    fields: frozenset[str] | None

    @property
    def nbytes(self) -> int:
        return int(self.inner.nbytes)


class FieldPending(NamedTuple):
    """A step is there and a field asked for is not (yet): why the receiver waits."""

    why: str


def read_with_appended(
    source: Source,
    step: int,
    fields: frozenset[str] | None,
    decoding: FrameDecoding,
    read: Any,
) -> tuple[int, Any] | FieldPending | None:
    """``read()`` (the receiver's read of ``step``) with the appended fields of the
    step: what it returned wrapped in :class:`Appended`, or a ``FieldPending`` while
    a field named in ``fields`` is neither in the step nor appended yet."""
    if not keeps_steps(source):
        return read()  # type: ignore[no-any-return]
    appended: dict[str, Column] = {}
    for frame in read_appended(cast(Any, source), step):
        appended.update(_decode_appended(frame, decoding).items())
    rest = fields
    select = source.select
    if fields is not None:
        rest = fields - set(appended)
        source.select = FieldSelector(decoding, rest)
    try:
        got = read()
    except FieldNotFoundError as exc:
        return FieldPending(str(exc))  # the step is there, a field is not (yet): wait
    finally:
        source.select = select
    if got is None:
        return None
    if fields is not None:
        appended = {k: v for k, v in appended.items() if k in fields}
    if not appended and rest == fields:
        return got  # type: ignore[no-any-return]
    return got[0], Appended(got[1], appended, rest)


def merge_appended(obj: Any, columns: dict[str, Column]) -> Any:
    """``obj`` (a decoded step) with ``columns`` added to its list of samples: beside
    its columns, or set on each sample (a Struct's field of that name, else its
    ``extras``; a dict's key).

    Raises:
        DecodeError: the step holds no list of samples, or one of another length, or a
            sample that cannot take the field.
    """
    samples = _samples(obj)
    if samples is None:
        raise DecodeError("the step has fields appended but holds no list of samples")
    rows = len(next(iter(columns.values())))
    # Columns of no field (fields= named appended ones only) have no row count.
    if len(samples) != rows and not (isinstance(samples, Columns) and not samples.names):
        raise DecodeError(f"fields appended for {rows} rows, the step holds {len(samples)}")
    if isinstance(samples, Columns):
        merged = Columns({**dict(samples.items()), **columns})
        return _replace(obj, samples, merged)
    for i, sample in enumerate(samples):
        for name, column in columns.items():
            value = column[i]
            if isinstance(sample, dict):
                sample[name] = value
            elif isinstance(sample, msgspec.Struct) and name in sample.__struct_fields__:
                setattr(sample, name, value)
            elif isinstance(getattr(sample, "extras", None), dict):
                sample.extras[name] = value
            else:
                raise DecodeError(
                    f"appended field {name!r}: a {type(sample).__name__} sample has no "
                    "such field and no extras; receive with as_columns=True"
                )
    return obj


def _replace(obj: Any, old: Any, new: Any) -> Any:
    if obj is old:
        return new
    if isinstance(obj, dict):
        return {k: (new if v is old else v) for k, v in obj.items()}
    for f in obj.__struct_fields__:
        if getattr(obj, f) is old:
            return msgspec.structs.replace(obj, **{f: new})
    return obj
