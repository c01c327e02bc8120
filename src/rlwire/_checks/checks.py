"""Validation for any type: :class:`Checks` names fields, found at any depth, and rules for them.

rlwire's own :class:`~rlwire.TrainingSample` validates itself; a framework's own msgspec
Structs, dicts and lists are checked by naming their fields::

    rlwire.open_sender(url, validate=rlwire.Checks(
        finite=("inference_logprobs", "advantages"),
        same_length=(("input_ids", "loss_mask", "inference_logprobs"),),
        max_value={"routed_expert_ids": 255},
    ))

The checks run as a sliced generator (see :mod:`rlwire._core.slicing`): the walk over the
object is :mod:`rlwire._checks.walk` (lists proven a group of items at a time at C
speed, arrays checked by numpy), :mod:`rlwire._checks.columns` checks a list of records
of one type (a step's samples) a field of many rows at a time, and
:mod:`rlwire._checks.plan` reads the annotations of msgspec Structs and dataclasses to
skip the fields that cannot hold a named field.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlwire._checks.columns import ColumnWalk
from rlwire._checks.plan import ANY, Planner, rules_by_name
from rlwire._core.errors import ConfigError, RlwireError, SchemaError
from rlwire._core.slicing import Sliced, run_sliced

__all__ = ["Checks"]


@dataclasses.dataclass(frozen=True, eq=True, repr=False)
class Checks:
    """Validation rules for any type, naming fields found at any depth.

    A name selects every field of that name: a msgspec Struct or dataclass attribute, a
    string key of a dict, or a column of a :class:`~rlwire.Columns`, inside any Struct,
    dict, list, tuple, array, :class:`~rlwire.Ragged`, :class:`~rlwire.Chunked` or
    Columns, at any depth. Packed values are checked as the data held a row at a time:
    a Ragged as the list of its rows (``$.logprobs[3][17]``), a Chunked as the one array
    it is sent as, a Columns as the list of its rows (``$.samples[3].logprobs[17]``),
    each array scanned whole. Where a Columns breaks several rules, the first column (in
    its order) that holds a bad value is named, and ``same_length`` is compared after
    every column is checked. One changed since it was made so that its rows are not
    what it holds (a Ragged's offsets set to rows of part of its values, a chunk
    appended to ``chunks`` directly) is refused, as the encoder refuses it, not scanned.

    Args:
        finite: field names whose float values must be finite (no NaN, Inf or -Inf): a
            float (a ``Decimal`` too), a list or nested lists of floats, a float or
            complex array, or any of these inside the field.
        same_length: groups of field names whose values must have equal ``len()`` within
            one object (the Struct, dataclass or dict that holds them); members of a
            group that are missing or ``None`` are left out. A group has at least two
            names.
        max_value: field name -> the largest integer allowed in that field (ints, an
            IntEnum's too, integer and bool arrays, nested lists of them). Only values
            above the maximum are refused: negative values are not, and floats (and
            Decimals, float arrays) are not compared.
        check: an optional callable ``check(obj) -> None`` called with the whole object
            after the rules above have passed, which raises to refuse it. An Exception
            other than an :class:`~rlwire.RlwireError` becomes a
            :class:`~rlwire.SchemaError` naming the callable; a KeyboardInterrupt or
            SystemExit passes unchanged. It runs as one slice of work in a worker
            thread, so keep it quick; and, as it runs while a sender writes the step,
            it must not change the object: a change may be written unchecked, or leave
            the step's bytes unlike their checksum (a receiver then refuses the step).

    With ``open_sender(url, validate=Checks(...))`` the checks run on every object, per
    rank, in worker-thread slices beside the write of the step, which is committed only
    once they pass (their error wins over any other the send met); rlwire's own rules
    for :class:`~rlwire.TrainingSample` still apply as well. A name that
    matches no field of the first object sent (nor of the Struct types its annotations
    declare) is a :class:`~rlwire.ConfigError`, so a typo cannot silently switch a
    check off; later objects are not checked for that.

    Performance: a list of Structs, dataclasses or dicts of one type (dicts with the
    same keys) is checked a column at a time: one field of many rows is settled by one
    ``isfinite`` or ``max`` over their arrays joined (or one ``sum`` / ``max`` over
    their lists of numbers), and only the rows a column check refuses are looked at one
    by one, so an error still names the row and the token. Other lists are checked a
    group of items at a time by ``sum`` and ``max`` in C and arrays by numpy; Struct
    annotations such as ``list[int]`` or ``str`` let whole
    fields be skipped. Untyped lists (inside dicts or ``Any`` fields) whose first and
    last items are numbers or strings are taken to hold no named fields.

    Raises:
        ConfigError: an argument of the wrong type: a name that is not a string, a
            maximum that is not an int, a group of fewer than two names, a ``check``
            that is not callable.

    Example:
        >>> import msgspec, rlwire
        >>> class Sample(msgspec.Struct):
        ...     input_ids: list[int]
        ...     logprobs: list[float]
        >>> checks = rlwire.Checks(
        ...     finite=("logprobs",),
        ...     same_length=(("input_ids", "logprobs"),),
        ...     max_value={"input_ids": 50_000},
        ... )
        >>> checks.validate({"samples": [Sample([1, 2], [-0.5, -1.25])]})
        >>> try:
        ...     checks.validate({"samples": [Sample([1, 2], [-0.5, float("nan")])]})
        ... except rlwire.SchemaError as exc:
        ...     print(exc)
        $.samples[0].logprobs[1]: nan is not finite ('logprobs' is checked finite)
    """

    finite: Sequence[str] = ()
    same_length: Sequence[Sequence[str]] = ()
    max_value: Mapping[str, int] = dataclasses.field(default_factory=dict)
    check: Callable[[Any], object] | None = None
    # The rules by name and the plans of the types met, shared by every walk.
    _planner: Planner = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        finite = _names(self.finite, "finite")
        if isinstance(self.same_length, str) or not isinstance(self.same_length, Iterable):
            raise ConfigError(
                f"Checks(same_length=) takes groups of names, e.g. (('a', 'b'),); "
                f"got {self.same_length!r}"
            )
        groups = []
        for group in self.same_length:
            if isinstance(group, str):
                raise ConfigError(
                    f"Checks(same_length=) takes groups of names, got the string {group!r} "
                    f"as a group; did you mean same_length=({tuple(self.same_length)!r},)?"
                )
            names = _names(group, "same_length group")
            if len(names) < 2:
                raise ConfigError(
                    f"Checks(same_length=): a group needs at least two names, got {group!r}"
                )
            groups.append(names)
        if not isinstance(self.max_value, Mapping):
            raise ConfigError(
                f"Checks(max_value=) takes a mapping of field name to the largest allowed "
                f"integer, e.g. {{'routed_expert_ids': 255}}; got {self.max_value!r}"
            )
        limits: dict[str, int] = {}
        for name, limit in self.max_value.items():
            if not isinstance(name, str):
                raise ConfigError(f"Checks(max_value=): names must be strings, got {name!r}")
            if isinstance(limit, bool) or not isinstance(limit, int | np.integer):
                raise ConfigError(
                    f"Checks(max_value=): the maximum of {name!r} must be an int, got {limit!r}"
                )
            limits[name] = int(limit)
        if self.check is not None and not callable(self.check):
            raise ConfigError(f"Checks(check=) must be a callable or None, got {self.check!r}")
        # Normalised, immutable forms: tuples and a read-only mapping.
        object.__setattr__(self, "finite", finite)
        object.__setattr__(self, "same_length", tuple(groups))
        object.__setattr__(self, "max_value", types.MappingProxyType(limits))
        rules = rules_by_name(finite, limits)
        object.__setattr__(self, "_planner", Planner(rules, self.same_length, self.names))

    def __hash__(self) -> int:
        return hash((self.finite, self.same_length, tuple(self.max_value.items()), self.check))

    def __repr__(self) -> str:
        given = {
            "finite": self.finite,
            "same_length": self.same_length,
            "max_value": dict(self.max_value),
            "check": self.check,
        }
        return f"Checks({', '.join(f'{k}={v!r}' for k, v in given.items() if v)})"

    @property
    def names(self) -> frozenset[str]:
        """Every field name the rules mention."""
        grouped = (name for group in self.same_length for name in group)
        return frozenset((*self.finite, *grouped, *self.max_value))

    def validate(self, obj: Any) -> None:
        """Check ``obj`` in the calling thread; see :meth:`validate_sliced`.

        Raises:
            SchemaError: ``obj`` breaks a rule; the message names the path and the value.
            ConfigError: a name of these checks matches no field of ``obj``.
        """
        run_sliced(self.validate_sliced(obj))

    def validate_sliced(self, obj: Any, *, check_names: bool = True) -> Sliced[None]:
        """Check ``obj`` as a sliced generator: each resumption holds the GIL well under a
        millisecond (see :mod:`rlwire._core.slicing`).

        Args:
            obj: a msgspec Struct, dataclass, dict, list, tuple, array, Ragged, Chunked or
                Columns, nested freely.
            check_names: also refuse names that match no field of ``obj`` (the sender
                asks this of the first object it sends only).

        Raises:
            SchemaError: ``obj`` breaks a rule, e.g.
                ``$.micro_batches[3].inference_logprobs[17]: nan is not finite (...)``,
                or ``check`` refused it.
            ConfigError: ``check_names`` is true and a name matches no field of ``obj``.
        """
        walk = ColumnWalk(self._planner, collect=check_names)
        try:
            yield from walk.visit(obj, None, None, ANY)
        except RecursionError:
            raise SchemaError(
                "$: nests too deeply for Python's recursion limit (or contains itself)"
            ) from None
        if check_names:
            self._check_names(obj, walk.seen)
        if self.check is not None:
            yield  # the user's callable gets a slice of its own
            try:
                self.check(obj)
            except RlwireError:
                raise
            except Exception as exc:
                name = getattr(self.check, "__qualname__", None) or repr(self.check)
                raise SchemaError(
                    f"$: Checks(check={name}) refused the object: {type(exc).__name__}: {exc}"
                ) from exc

    def _check_names(self, obj: Any, seen: set[str]) -> None:
        unknown = sorted(self.names - seen)
        if not unknown:
            return
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, seen, n=1)
            if close:
                hints.append(f"{name!r} (did you mean {close[0]!r}?)")
            else:
                hints.append(repr(name))
        raise ConfigError(
            f"Checks names {', '.join(hints)} match no field of the first object "
            f"({type(obj).__name__}); a misspelt name would disable its check"
        )


def _names(names: object, what: str) -> tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    if not isinstance(names, Iterable):
        raise ConfigError(f"Checks({what}): expected field names, got {names!r}")
    out = tuple(dict.fromkeys(names))  # in order, without repeats
    for name in out:
        if not isinstance(name, str):
            raise ConfigError(f"Checks({what}): names must be strings, got {name!r}")
    return out
