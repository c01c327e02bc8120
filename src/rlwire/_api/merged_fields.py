"""Fields appended to a step, set on the step as a receiver decoded it: beside its
columns (a :class:`~rlwire.Columns`), or on each sample (a Struct's field of that name,
converted to its annotation as the step's own values are; else its ``extras``; a
dict's key). The receiving side of :mod:`rlwire._api.appending`.
"""

from __future__ import annotations

import re
import typing
from typing import Any

import msgspec
import numpy as np

from rlwire._api.appended_rows import samples_of
from rlwire._core.built import dec_hook, type_name
from rlwire._core.columns import Column, Columns
from rlwire._core.errors import DecodeError
from rlwire._core.ragged import Ragged

__all__ = ["merge_appended"]


def _python(value: Any) -> Any:
    """A numpy number of an array column as the Python number a row holds."""
    return value.item() if isinstance(value, np.generic) else value


def merge_appended(obj: Any, columns: dict[str, Column]) -> Any:
    """``obj`` (a decoded step) with ``columns`` added to its list of samples: beside
    its columns, or set on each sample (a Struct's field of that name, else its
    ``extras``; a dict's key).

    Raises:
        DecodeError: the step holds no list of samples, or one of another length, or a
            sample that cannot take the field.
    """
    samples = samples_of(obj)
    if samples is None:
        raise DecodeError("the step has fields appended but holds no list of samples")
    rows = len(next(iter(columns.values())))
    # Columns of no field (fields= named appended ones only) have no row count.
    if len(samples) != rows and not (isinstance(samples, Columns) and not samples.names):
        raise DecodeError(f"fields appended for {rows} rows, the step holds {len(samples)}")
    if isinstance(samples, Columns):
        merged = Columns({**dict(samples.items()), **columns})
        return _replace(obj, samples, merged)
    for name, column in columns.items():
        typed = _struct_values(samples, name, column)
        for i, sample in enumerate(samples):
            if typed[i] is not _UNTYPED:
                # force_setattr: a frozen Struct is filled as its decode would have.
                msgspec.structs.force_setattr(sample, name, typed[i])
                continue
            value = column[i]
            if isinstance(sample, dict):
                sample[name] = _python(value)
            elif isinstance(getattr(sample, "extras", None), dict):
                # extras hold arrays (TrainingSample's rule): a number per sample is a
                # 0-d array there, not a numpy scalar a validating receiver refuses.
                number = isinstance(value, np.generic | int | float)
                sample.extras[name] = np.asarray(value) if number else value
            else:
                raise DecodeError(
                    f"appended field {name!r}: a {type(sample).__name__} sample has no "
                    "such field and no extras; receive with as_columns=True"
                )
    return obj


#: A row whose sample takes an appended value as it is (a dict, ``extras``).
_UNTYPED: Any = object()


def _struct_values(samples: list[Any], name: str, column: Column) -> list[Any]:
    """For each row, ``column``'s value converted to the annotation of the sample's
    field ``name`` as the step's own values are (one call per Struct type for the
    whole column), or :data:`_UNTYPED` where the sample is no Struct with that field.

    Raises:
        DecodeError: a value does not match the annotation; names the field and row.
    """
    out: list[Any] = [_UNTYPED] * len(samples)
    kinds = {
        kind
        for kind in set(map(type, samples))
        if issubclass(kind, msgspec.Struct) and name in kind.__struct_fields__
    }
    if not kinds:
        return out
    if isinstance(column, np.ndarray) and column.ndim == 1:
        values = column.tolist()  # Python numbers, as the step's own rows hold
    else:
        values = list(column)  # a Ragged's rows, as views, in one pass
    for kind in kinds:
        rows = [i for i, s in enumerate(samples) if type(s) is kind]
        annotation = next(f.type for f in msgspec.structs.fields(kind) if f.name == name)
        got = values if len(rows) == len(values) else [values[i] for i in rows]
        members = {annotation, *typing.get_args(annotation)}
        if not (Any in members or (isinstance(column, Ragged) and np.ndarray in members)):
            try:
                got = msgspec.convert(got, list[annotation], dec_hook=dec_hook)  # type: ignore[valid-type]
            except msgspec.ValidationError as exc:
                at = re.search(r" - at `\$\[(\d+)\]`", str(exc))
                row = rows[int(at[1])] if at else rows[0]
                why = str(exc)[: at.start()] if at else str(exc)
                raise DecodeError(
                    f"appended field {name!r} row {row} does not match "
                    f"{kind.__name__}.{name} ({type_name(annotation)}): {why}"
                ) from None
        if len(rows) == len(samples):
            return list(got)
        for i, value in zip(rows, got, strict=True):
            out[i] = value
    return out


def _replace(obj: Any, old: Any, new: Any) -> Any:
    if obj is old:
        return new
    if isinstance(obj, dict):
        return {k: (new if v is old else v) for k, v in obj.items()}
    for f in obj.__struct_fields__:
        if getattr(obj, f) is old:
            return msgspec.structs.replace(obj, **{f: new})
    return obj
