"""The default schema: :class:`TrainingSample` and :class:`TrainingBatch`.

These are plain msgspec Structs holding numpy arrays. Any other msgspec Struct, dict or
list tree works with rlwire too; these add validation that catches the silent
corruptions RL frameworks have met (NaN logprobs, misaligned routed experts, ...).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from rlwire._api.release import on_drop
from rlwire._checks.columns import all_finite
from rlwire._core.chunked import Chunked, chunks_problem
from rlwire._core.columns import Columns
from rlwire._core.errors import DecodeError, SchemaError
from rlwire._core.ragged import Ragged

__all__ = [
    "TrainingBatch",
    "TrainingSample",
    "check_columns_held",
    "check_object",
]

_PER_TOKEN_FLOATS = ("logprobs", "temperatures", "advantages")
_MUST_BE_FINITE = ("logprobs", "advantages", "ref_logprobs", "temperatures")
#: As the non-finite message lists them (it listed three: ref_logprobs was left out).
_FINITE_LISTED = f"{', '.join(_MUST_BE_FINITE[:-1])} and {_MUST_BE_FINITE[-1]}"
_EXPERT_DTYPES = (np.uint8, np.uint16)
#: The per-token fields, which a Columns holds as Ragged, or as a list where their rows
#: differ in kind.
_LISTED = ("token_ids", "mask", *_PER_TOKEN_FLOATS, "ref_logprobs", "routed_experts")


class TrainingSample(msgspec.Struct, kw_only=True, gc=False):
    """One trainable sequence.

    Per-token fields are 1-D arrays of one common length ``seq_len``.

    Attributes:
        token_ids: integer token ids.
        mask: bool, ``True`` where the token is trained on.
        logprobs: float log-probabilities from the rollout policy (finite).
        temperatures: float sampling temperature per token (finite).
        advantages: float advantage per token (finite).
        env_name: the environment that produced the sample.
        ref_logprobs: optional float log-probabilities from a reference policy (finite).
        routed_experts: optional ``uint8``/``uint16`` array ``[seq_len, layers, topk]``
            of MoE expert ids chosen at rollout time (router replay).
        extras: any other arrays, by name.

    Example:
        >>> import numpy as np
        >>> s = TrainingSample(token_ids=np.arange(4), mask=np.ones(4, bool),
        ...     logprobs=np.zeros(4, np.float32), temperatures=np.ones(4, np.float32),
        ...     advantages=np.zeros(4, np.float32), env_name="gsm8k")
        >>> s.validate()
    """

    token_ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    temperatures: np.ndarray
    advantages: np.ndarray
    env_name: str
    ref_logprobs: np.ndarray | None = None
    routed_experts: np.ndarray | None = None
    extras: dict[str, np.ndarray] = msgspec.field(default_factory=dict)

    @property
    def seq_len(self) -> int:
        """Number of tokens in the sample."""
        return len(self.token_ids)

    def validate(self, where: str = "sample") -> None:
        """Check types, lengths and finiteness.

        Args:
            where: how error messages name this sample, e.g. ``"samples[3]"``.

        Raises:
            SchemaError: naming the sample and field, e.g.
                ``samples[3].logprobs: 1 non-finite value (NaN or Inf; first at token
                17); ...``.
        """
        n = _token_count(self, where)
        _check_per_token(self, where, n)
        if self.routed_experts is not None:
            _check_routed_experts(self, where, n)
        if not isinstance(self.env_name, str):
            raise SchemaError(f"{where}.env_name: must be str, got {type(self.env_name).__name__}")
        _check_extras(self.extras, where)


_SAMPLE = {TrainingSample}
#: The fields a TrainingSample has no default for: a Columns of samples holds each.
_REQUIRED = tuple(f.name for f in msgspec.structs.fields(TrainingSample) if f.required)
_STR = {str}
_DICT = {dict}


class TrainingBatch(msgspec.Struct, kw_only=True, gc=False):
    """The samples of one training step (for one data-parallel rank).

    Example:
        >>> TrainingBatch(samples=[]).validate()
    """

    samples: list[TrainingSample]

    def __del__(self) -> None:
        # A step a receiver returned, of thousands of samples, is freed in a thread of
        # its own rather than wherever it is dropped (an event loop: some 3 ms).
        on_drop(self)

    def validate(self, where: str = "batch") -> None:
        """Validate every sample.

        Raises:
            SchemaError: naming the sample index and field of the first problem.
        """
        self._check_samples(where)
        if isinstance(self.samples, Columns):
            return
        for i, sample in enumerate(self.samples):
            sample.validate(f"{where}.samples[{i}]")

    def _check_samples(self, where: str) -> None:
        if isinstance(self.samples, Columns):  # sent packed (docs/how-to/packed.md)
            _check_columns(self.samples, f"{where}.samples")
            return
        if not isinstance(self.samples, list):
            raise SchemaError(
                f"{where}.samples: must be a list or Columns, got {type(self.samples).__name__}"
            )
        if set(map(type, self.samples)) <= _SAMPLE:  # in C: the usual case, thousands of them
            return
        for i, sample in enumerate(self.samples):
            if not isinstance(sample, TrainingSample):
                raise SchemaError(
                    f"{where}.samples[{i}]: expected TrainingSample, got {type(sample).__name__}"
                )


#: A problem a column check found: the first row it refuses, and the error naming it.
_Found = tuple[int, SchemaError]


def _check_columns(cols: Columns, where: str) -> None:
    """:meth:`TrainingSample.validate`'s rules over samples held as columns, a few numpy
    calls a column (one ``isfinite`` each), naming the first problem as the check of the
    samples one by one would (``where[i].logprobs``): each column's checks tell the
    first row they refuse, and the least row's first problem in the order a sample's
    check meets them is raised. A per-token field whose rows differ (``None`` in some,
    or two dtypes) is a list column, as the codec stores and returns it: then every row
    is checked as its sample would be."""
    _check_column_names(cols, where)
    listed = (cols[name] for name in _LISTED if name in cols)
    if any(type(column) is list and not _all_none(column) for column in listed):
        for i, row in enumerate(cols.rows()):
            TrainingSample(**row).validate(f"{where}[{i}]")
        return
    ids = _ragged(cols, "token_ids", where, ndim=1)
    if ids.values.dtype.kind not in "iu":
        raise SchemaError(
            f"{where}.token_ids: token ids must be integers, got dtype {ids.values.dtype}"
        )
    names = ["mask", *_PER_TOKEN_FLOATS]
    if "ref_logprobs" in cols and not _all_none(cols["ref_logprobs"]):
        names.append("ref_logprobs")
    found: list[_Found] = []
    for name in names:
        found += _check_token_column(_ragged(cols, name, where, ndim=1), ids, where, name)
    if "routed_experts" in cols and not _all_none(cols["routed_experts"]):
        found += _check_routed_column(_ragged(cols, "routed_experts", where, ndim=3), ids, where)
    found += _check_per_sample_columns(cols, where)
    if found:
        raise min(found, key=lambda problem: problem[0])[1]  # the least row's first


def _check_per_sample_columns(cols: Columns, where: str) -> list[_Found]:
    """The env_name column, then extras: the first row each refuses. Thousands of rows:
    each look runs in C (map, set, any); a row at a time only to name the first bad one,
    or for extras that hold something."""
    found: list[_Found] = []
    if set(map(type, cols["env_name"])) != _STR:
        for i, env in enumerate(cols["env_name"]):
            if not isinstance(env, str):
                kind = type(env).__name__
                found.append((i, SchemaError(f"{where}[{i}].env_name: must be str, got {kind}")))
                break
    if "extras" in cols and (set(map(type, cols["extras"])) != _DICT or any(cols["extras"])):
        for i, extras in enumerate(cols["extras"]):
            try:
                _check_extras(extras, f"{where}[{i}]")
            except SchemaError as exc:
                found.append((i, exc))
                break
    return found


def _check_column_names(cols: Columns, where: str) -> None:
    fields = TrainingSample.__struct_fields__
    for name in cols.names:
        if name not in fields:
            raise SchemaError(f"{where}: column {name!r} is not a field of TrainingSample")
    for name in _REQUIRED:
        if name not in cols:
            raise SchemaError(f"{where}: no column {name!r} (TrainingSample requires it)")


def check_columns_held(batch: TrainingBatch) -> None:
    """A receiver's check of a :class:`TrainingBatch` it returns with columns, whether
    it validates or not: its Columns of samples holds every field
    :class:`TrainingSample` requires, as each sample of a step received as samples must
    (a step sent packed, or as dicts, may lack one). One look a field, not a row.

    Raises:
        DecodeError: naming the first field missing, as decoding a sample without it
            does.
    """
    if not isinstance(batch.samples, Columns):
        return
    for name in _REQUIRED:
        if name not in batch.samples:
            raise DecodeError(
                "received data does not match list[TrainingSample]: the columns hold no "
                f"{name!r}, a field TrainingSample requires - at `$.samples` (columns of "
                "other fields are received with type=dict)"
            )


def _check_routed_column(experts: Ragged, ids: Ragged, where: str) -> list[_Found]:
    if experts.values.dtype not in _EXPERT_DTYPES:
        error = SchemaError(
            f"{where}.routed_experts: must be uint8 or uint16 expert ids, got dtype "
            f"{experts.values.dtype} (uint8 holds at most 256 experts)"
        )
        return [(0, error)]  # a dtype is every row's, the first's first
    return _same_rows(experts, ids, where, "routed_experts", "rows")


def _check_token_column(column: Ragged, ids: Ragged, where: str, name: str) -> list[_Found]:
    """The mask or a per-token float column: its dtype, rows as long as the token ids',
    finite values (one look at the least and greatest, then one ``isfinite`` to find
    the row if they are not); what is wrong with it, in that order."""
    dtype = column.values.dtype
    if name == "mask" and dtype != np.bool_:
        return [(0, SchemaError(f"{where}.mask: must be a bool array, got dtype {dtype}"))]
    if name != "mask" and dtype.kind != "f":
        return [(0, SchemaError(f"{where}.{name}: must be a float array, got dtype {dtype}"))]
    found = _same_rows(column, ids, where, name, "entries")
    if name in _MUST_BE_FINITE and not all_finite(column.values):
        finite = np.isfinite(column.values)
        if not finite.all():
            i = int(np.searchsorted(column.offsets, int(np.argmin(finite)), "right")) - 1
            try:
                _check_finite(column[i], f"{where}[{i}].{name}")
            except SchemaError as exc:
                found.append((i, exc))
    return found


def _ragged(cols: Columns, name: str, where: str, *, ndim: int) -> Ragged:
    column = cols[name]
    if not isinstance(column, Ragged):
        raise SchemaError(
            f"{where}.{name}: a per-token column must be an rlwire.Ragged (or a list of a "
            f"value a row), got {type(column).__name__}"
        )
    if column.values.ndim != ndim:
        shape = "[tokens]" if ndim == 1 else "[tokens, layers, topk]"
        raise SchemaError(
            f"{where}.{name}: values must be {shape}, got shape {column.values.shape}"
        )
    return column


def _same_rows(column: Ragged, ids: Ragged, where: str, name: str, what: str) -> list[_Found]:
    """Nothing if ``column``'s rows are as long as ``ids``', else the first row that is
    not, named."""
    if column.offsets is ids.offsets or np.array_equal(column.offsets, ids.offsets):
        return []
    i = int(np.argmax(column.lengths != ids.lengths))
    error = SchemaError(
        f"{where}[{i}].{name}: has {int(column.lengths[i])} {what} but token_ids has "
        f"{int(ids.lengths[i])}; per-token arrays must have the same length"
    )
    return [(i, error)]


def _all_none(column: Any) -> bool:
    return isinstance(column, list) and all(v is None for v in column)


def check_object(obj: Any, path: str) -> None:
    """Validate ``obj`` if it is a :class:`TrainingSample` or :class:`TrainingBatch`; the
    codecs' ``check`` hook.

    The encoder calls this for every Struct it walks, so samples are validated at any
    depth, inside the user's own Structs too, and in the same pass that encodes them (a
    batch's samples are checked one by one as the encoder reaches them).
    """
    if isinstance(obj, TrainingSample):
        obj.validate(path)
    elif isinstance(obj, TrainingBatch):
        obj._check_samples(path)


def _token_count(sample: TrainingSample, where: str) -> int:
    """The length of ``sample``'s token ids, once they are shown to be a 1-D int array."""
    ids = _array(sample, "token_ids", where, ndim=1)
    if ids.dtype.kind not in "iu":
        raise SchemaError(f"{where}.token_ids: token ids must be integers, got dtype {ids.dtype}")
    return len(ids)


def _check_per_token(sample: TrainingSample, where: str, n: int) -> None:
    """The mask and the per-token floats: 1-D, ``n`` long, of their dtype, finite."""
    mask = _array(sample, "mask", where, ndim=1)
    if mask.dtype != np.bool_:
        raise SchemaError(f"{where}.mask: must be a bool array, got dtype {mask.dtype}")
    names = ["mask", *_PER_TOKEN_FLOATS]
    if sample.ref_logprobs is not None:
        names.append("ref_logprobs")
    for name in names:
        arr = _array(sample, name, where, ndim=1)
        if name != "mask" and arr.dtype.kind != "f":
            raise SchemaError(f"{where}.{name}: must be a float array, got dtype {arr.dtype}")
        if len(arr) != n:
            raise SchemaError(
                f"{where}.{name}: has {len(arr)} entries but token_ids "
                f"has {n}; per-token arrays must have the same length"
            )
        if name in _MUST_BE_FINITE:
            _check_finite(arr, f"{where}.{name}")


def _check_routed_experts(sample: TrainingSample, where: str, n: int) -> None:
    """Expert ids: a uint8/uint16 array of ``n`` rows, ``[seq_len, layers, topk]``."""
    re = _array(sample, "routed_experts", where, ndim=3)
    if re.dtype not in (np.uint8, np.uint16):
        raise SchemaError(
            f"{where}.routed_experts: must be uint8 or uint16 expert ids, "
            f"got dtype {re.dtype} (uint8 holds at most 256 experts)"
        )
    if re.shape[0] != n:
        raise SchemaError(
            f"{where}.routed_experts: has {re.shape[0]} rows but "
            f"token_ids has {n}; expected shape [seq_len, layers, topk]"
        )


def _check_extras(extras: Any, where: str) -> None:
    """``extras``: a dict of arrays by str name."""
    if not isinstance(extras, dict):
        raise SchemaError(f"{where}.extras: must be a dict of arrays, got {type(extras).__name__}")
    for key, value in extras.items():
        if not isinstance(key, str):
            raise SchemaError(f"{where}.extras: keys must be str, got {key!r}")
        if not isinstance(value, np.ndarray):
            raise SchemaError(
                f"{where}.extras[{key!r}]: expected a numpy array, got {type(value).__name__}"
            )


def _array(obj: Any, name: str, where: str, *, ndim: int) -> np.ndarray:
    """The array field ``name`` of ``obj``: an ndarray, or a non-empty :class:`~rlwire.Chunked`
    (read through its shape and dtype; its chunks are checked one by one, and refused
    if they are not all arrays of one dtype and trailing shape)."""
    value = getattr(obj, name)
    if not (isinstance(value, np.ndarray) or (isinstance(value, Chunked) and value.chunks)):
        raise SchemaError(f"{where}.{name}: expected a numpy array, got {type(value).__name__}")
    problem = chunks_problem(value.chunks) if isinstance(value, Chunked) else ""
    if problem:  # its list of chunks changed directly: as the encoder refuses it
        raise SchemaError(f"{where}.{name}: {problem} (the Chunked's chunks were changed)")
    if len(value.shape) != ndim:
        raise SchemaError(f"{where}.{name}: expected {ndim} dimension(s), got shape {value.shape}")
    return value  # type: ignore[return-value]  # a Chunked has the dtype, shape and len used


def _check_finite(arr: np.ndarray, where: str) -> None:
    if isinstance(arr, Chunked):
        arr = arr.to_array()  # a copy, only to find the first bad token's index
    finite = np.isfinite(arr)
    if finite.all():
        return
    bad = np.flatnonzero(~finite)
    plural = "value" if len(bad) == 1 else "values"
    raise SchemaError(
        f"{where}: {len(bad)} non-finite {plural} (NaN or Inf; first at token "
        f"{int(bad[0])}); {_FINITE_LISTED} must be finite"
    )
