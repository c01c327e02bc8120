"""Fields appended to a step, set on the step as a receiver decoded it: beside its
columns (a :class:`~rlwire.Columns`), or on each sample (a Struct's field of that name,
converted to its annotation as the step's own values are; else its ``extras``; a
dict's key). The receiving side of :mod:`rlwire._api.appending`.

A step whose samples are Structs (a :class:`~rlwire.TrainingSample`) stored as columns
is decoded as columns when it has fields appended, and its rows are made once the
fields its Struct declares are merged (:func:`merged_rows`): a field the Struct
requires may be one appended (``advantages``, from a later stage), which a decode into
Structs before the merge would refuse as missing.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import numpy as np

from rlwire._api.appended_rows import samples_of
from rlwire._api.appending import Appended
from rlwire._api.decoding import FrameDecoding
from rlwire._api.parts import part_types
from rlwire._api.sealed import SealedStep
from rlwire._core.built import dec_hook, type_name
from rlwire._core.column_types import check_column_types
from rlwire._core.columns import Column, Columns
from rlwire._core.errors import ConfigError, DecodeError
from rlwire._core.ragged import Ragged
from rlwire._core.slicing import Sliced, timed
from rlwire._frame.bounds import heap_allowance
from rlwire._frame.frame import Frame

__all__ = ["RowsAfter", "merge_appended", "merged_rows", "rows_type"]


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
                attribute, value = typed[i]
                msgspec.structs.force_setattr(sample, attribute, value)
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
    """For each row, the field of the sample that ``column`` (appended as ``name``)
    fills and its value converted to that field's annotation as the step's own values
    are (one call per Struct type for the whole column), or :data:`_UNTYPED` where the
    sample is no Struct with that field. The field is the one stored as ``name`` (its
    encoded name, as the step's own columns are matched), else the one of that
    attribute name.

    Raises:
        DecodeError: a value does not match the annotation; names the field and row.
            Or the field is one matched by its attribute name, stored under another
            name, and holds the step's data (a rename by a mapping or function, which
            add_fields could not tell): an appended field never takes its place.
    """
    out: list[Any] = [_UNTYPED] * len(samples)
    kinds = {
        kind: field
        for kind in set(map(type, samples))
        if issubclass(kind, msgspec.Struct) and (field := _field_named(kind, name)) is not None
    }
    if not kinds:
        return out
    if isinstance(column, np.ndarray) and column.ndim == 1:
        values = column.tolist()  # Python numbers, as the step's own rows hold
    else:
        values = list(column)  # a Ragged's rows, as views, in one pass
    for kind, field in kinds.items():
        rows = [i for i, s in enumerate(samples) if type(s) is kind]
        if field.encode_name != name:
            _check_left_empty(samples, rows, name, kind, field)
        annotation = field.type
        got = values if len(rows) == len(values) else [values[i] for i in rows]
        members = {annotation, *typing.get_args(annotation)}
        if not (Any in members or (isinstance(column, Ragged) and np.ndarray in members)):
            try:
                got = msgspec.convert(got, list[annotation], dec_hook=dec_hook)  # type: ignore[valid-type]
            except msgspec.ValidationError as exc:
                at = re.search(r" - at `\$\[(\d+)\]`", str(exc))
                row = rows[int(at[1])] if at else rows[0]
                why = str(exc)[: at.start()] if at else str(exc)
                raise _misfit(name, row, kind, field.name, annotation, why) from None
        for i, value in zip(rows, got, strict=True):
            out[i] = (field.name, value)
    return out


def _field_named(kind: type[msgspec.Struct], name: str) -> msgspec.structs.FieldInfo | None:
    """``kind``'s field stored as ``name``, else the one of that attribute name."""
    fields = msgspec.structs.fields(kind)
    stored = next((f for f in fields if f.encode_name == name), None)
    return stored or next((f for f in fields if f.name == name), None)


def _check_left_empty(
    samples: list[Any], rows: list[int], name: str, kind: type, field: msgspec.structs.FieldInfo
) -> None:
    """Refuse the appended ``name`` in ``field`` (stored as another name) of the rows
    of ``kind`` unless the step left it empty (``None``) in each."""
    full = next((i for i in rows if getattr(samples[i], field.name) is not None), None)
    if full is not None:
        raise DecodeError(
            f"appended field {name!r} row {full}: {kind.__name__}.{field.name} is stored "
            f"as {field.encode_name!r}, which holds the step's data there; an appended "
            "field never takes the place of the step's data (receive with as_columns=True "
            "to see both)"
        )


def _misfit(name: str, row: int, kind: type, field: str, annotation: Any, why: str) -> DecodeError:
    """The error for row ``row`` of the appended field ``name``, whose value does not
    match ``kind``'s ``field`` (``annotation``): ``why``, as msgspec said it."""
    return DecodeError(
        f"appended field {name!r} row {row} does not match "
        f"{kind.__name__}.{field} ({type_name(annotation)}): {why}"
    )


def _replace(obj: Any, old: Any, new: Any) -> Any:
    if obj is old:
        return new
    if isinstance(obj, dict):
        return {k: (new if v is old else v) for k, v in obj.items()}
    for f in obj.__struct_fields__:
        if getattr(obj, f) is old:
            return msgspec.structs.replace(obj, **{f: new})
    return obj


class RowsAfter(NamedTuple):
    """How a step's samples, decoded as columns, are made rows after the merge: as
    ``annotation`` (a ``list[S]``), by the codec's ``make``
    (``rows_of_columns(columns, annotation, heap=...)``)."""

    annotation: Any
    make: Callable[..., Sliced[list[Any]]]


def rows_type(type_: Any, step: Appended, decoding: FrameDecoding) -> RowsAfter | None:
    """How the samples of a receiver of ``type_`` received as rows are made after the
    fields appended to ``step`` are merged (a field their Struct requires may be one
    appended, which a decode into Structs before the merge would refuse as missing):
    when they are Structs ``S`` (not ``array_like``: positional rows) and the step's
    codec makes rows of columns. Else ``None``: the step is decoded as asked and the
    fields set on its samples (:func:`merge_appended`)."""
    if not step.columns:
        return None
    try:
        decode_as, _ = part_types(type_)
    except ConfigError:  # no list of samples to tell
        return None
    item = next(iter(typing.get_args(decode_as)), None)
    if not (isinstance(item, type) and issubclass(item, msgspec.Struct)):
        return None
    if item.__struct_config__.array_like:
        return None
    frames = _frames(step.inner)
    codecs = {f.codec for f in frames}
    make = getattr(decoding.codec(codecs.pop()), "rows_of_columns", None) if codecs else None
    if make is None or codecs:  # a codec that keeps no columns (JSON, a plugin's); mixed
        return None
    return RowsAfter(decode_as, make)


def merged_rows(
    obj: Any, step: Appended, rows: RowsAfter | None, seconds: dict[str, float], type_: Any = Any
) -> Sliced[Any]:
    """``obj`` (``step`` decoded) with the columns appended to ``step`` merged: with
    ``rows`` (from :func:`rows_type`; ``obj`` was decoded as columns) its samples made
    rows once the columns their Struct declares are merged into them, the others set
    on the rows after (``extras``, as :func:`merge_appended` sets them); without,
    :func:`merge_appended`, the columns appended beside columns checked against the
    fields of the samples of ``type_`` as the step's own are. Time spent is added to
    ``seconds["decode"]``.

    Raises:
        DecodeError: as :func:`merge_appended`; or the rows do not match their Struct
            (a field it requires is neither in the step nor appended), as when the
            step is decoded into it at once.
        FrameTooLargeError: the rows would build more Python objects than the step's
            messages may.
    """
    columns = step.columns
    if not columns:
        return obj
    if rows is None or not isinstance(samples_of(obj), Columns):
        merged = merge_appended(obj, columns)
        _check_appended_types(merged, columns, type_)
        return merged
    return (yield from timed(_made_rows(obj, step, rows), seconds, "decode"))


def _check_appended_types(obj: Any, columns: dict[str, Column], type_: Any) -> None:
    """Refuse ``columns``, appended beside the columns of ``obj``'s samples, if one holds
    what its field of the samples of ``type_`` refuses (as the decode checks the step's
    own columns)."""
    samples = samples_of(obj)
    if not isinstance(samples, Columns) or type_ in (Any, object, dict):
        return
    try:
        decode_as, _ = part_types(type_)
    except ConfigError:  # no list of samples to tell
        return
    appended = Columns({name: samples[name] for name in columns if name in samples})
    check_column_types(appended, decode_as, _path_of(obj, samples))


def _made_rows(obj: Any, step: Appended, rows: RowsAfter) -> Sliced[Any]:
    kind = typing.get_args(rows.annotation)[0]
    fields = msgspec.structs.fields(kind)
    declared = {f.encode_name for f in fields}
    into = {name: c for name, c in step.columns.items() if name in declared}
    rest = {name: c for name, c in step.columns.items() if name not in declared}
    merged = merge_appended(obj, into) if into else obj
    samples = samples_of(merged)
    assert isinstance(samples, Columns)
    heap = sum(heap_allowance(f) for f in _frames(step.inner))
    try:
        made = yield from rows.make(samples, rows.annotation, heap=heap)
    except DecodeError as exc:  # its path starts at the list: say where that is
        text = str(exc)
        at = re.search(r" - at `\$\[(\d+)\]\.([^`.\[]+)", text)
        field = next((f for f in fields if at and f.encode_name == at[2]), None)
        if at and field is not None and at[2] in into:  # a value appended: say so
            why = text[: at.start()].split(": ", 1)[-1]
            raise _misfit(at[2], int(at[1]), kind, field.name, field.type, why) from None
        where = _path_of(merged, samples)
        raise DecodeError(text.replace(" - at `$", f" - at `{where}", 1)) from None
    out = _replace(merged, samples, made)
    return merge_appended(out, rest) if rest else out


def _frames(inner: Any) -> list[Frame]:
    """The messages of a step as read: one, or its parts' (none if one is not read)."""
    frames = [f for _, f in inner.parts] if isinstance(inner, SealedStep) else [inner]
    return frames if all(isinstance(f, Frame) for f in frames) else []


def _path_of(obj: Any, samples: Any) -> str:
    """Where ``samples`` is in ``obj``, as msgspec's errors write paths."""
    if obj is samples or not isinstance(obj, msgspec.Struct):
        return "$"
    for f in msgspec.structs.fields(obj):
        if getattr(obj, f.name) is samples:
            return f"$.{f.encode_name}"
    return "$"
