"""``rlwire inspect PATH``: one stored message described (its size by field, bounded
for hostile ones), then its manifest, then, for a destination, its fence; ``--part N``
or ``--json``: the manifest alone; the fence file: the fence alone."""

from __future__ import annotations

import argparse
import itertools
import os
import pkgutil
import sys
from typing import Any

import msgspec
import numpy as np

from rlwire._api.manifest import Manifest
from rlwire._api.receiver import open_receiver
from rlwire._core.errors import ConfigError, EndOfStream, StepGapError
from rlwire.transport._heads import FENCE_NAME, fence_at, message_of, stored_steps_at
from rlwire.transport._url import local_path, parse_url

__all__ = ["inspect"]


def _located(ns: argparse.Namespace) -> tuple[str, int, int, int | None]:
    """The directory or URL to read, and the step, rank and part: a stored file given
    as the path (``run/step-00000003.rank-0001.rlw``, its sidecar, a part; or such an
    object's URL, ``s3://bucket/run/step-00000003.rank-0001.rlw``) names them
    (ConfigError: no such path, not a step's file, options that say otherwise)."""
    path = ns.path
    local = _local(path)
    if local is None:  # a URL of another scheme: a prefix, or one of its step files
        parent, _, name = path.rpartition("/")
        named = None if "?" in path or "#" in path else message_of(name)
        if named is None or "://" not in parent:
            return path, ns.step or 0, ns.rank or 0, ns.part
        return parent, *_options_agree(ns, name, named)
    if os.path.isdir(local):
        return path, ns.step or 0, ns.rank or 0, ns.part
    if not os.path.exists(local):
        raise ConfigError(f"{path}: no such directory (give the directory a sender writes to)")
    named = message_of(os.path.basename(local))
    if named is None:
        raise ConfigError(
            f"{path}: not a stored step's file (step-NNNNNNNN.rank-NNNN.rlw): give the "
            "directory a sender writes to, or one of its step files"
        )
    return os.path.dirname(local) or ".", *_options_agree(ns, os.path.basename(local), named)


def _local(path: str) -> str | None:
    """The local path a plain path or ``file://`` URL names; ``None`` for another URL."""
    url = parse_url(path)
    return local_path(url) if url.scheme == "file" else None


def _options_agree(
    ns: argparse.Namespace, name: str, named: tuple[int, int, int | None]
) -> tuple[int, int, int | None]:
    """The step, rank and part of the file ``name`` (``named``), if ``--step``,
    ``--rank`` and ``--part`` say the same or nothing (else ConfigError)."""
    given = (ns.step, ns.rank, ns.part)
    for option, value, own in zip(("--step", "--rank", "--part"), given, named, strict=True):
        if value is not None and value != own:
            raise ConfigError(f"{option} {value}: the file {name} is of {option[2:]} {own}")
    return named


def inspect(ns: argparse.Namespace) -> int:
    """Run ``rlwire inspect`` with the parsed arguments ``ns``: its exit status."""
    if os.path.basename(ns.path) == FENCE_NAME and not os.path.isdir(ns.path):
        return _inspect_fence(ns)
    # A directory or a URL (s3://..., memory://...), as open_receiver takes, or a file.
    path, step, rank, ns.part = _located(ns)
    destination = path == ns.path  # not one of its files: its fence is described too
    if ns.json or ns.part is not None:  # the manifest alone: envelope and header only
        with open_receiver(path, rank=rank, record_consumed=False) as receiver:
            if ns.part is None:
                manifest = _manifests(receiver, step, None)
            else:
                manifest = receiver.manifest(step, part=ns.part)
        if manifest is None:
            return _missing(path, step, rank, ns.part, fence=False)
        if isinstance(manifest, Manifest) and not ns.json:
            print(_manifest_text(manifest))
        else:  # JSON; of a step filled part by part: the list of its parts' manifests
            print(_manifest_json(manifest))
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
    except (StepGapError, EndOfStream):  # deleted by keep_last, never sent, after the end
        obj = None
    if obj is None:
        return _missing(path, step, rank, None, fence=destination)
    print(f"step {step} rank {rank}: {_size(*_nbytes(obj, _MAX_VISITS))}{_describe(obj)}")
    with open_receiver(path, rank=rank, record_consumed=False) as receiver:
        manifest = _manifests(receiver, step, _MAX_PARTS)
    if isinstance(manifest, Manifest):
        print(_manifest_text(manifest))
    elif manifest is not None:
        print(_parts_text(manifest, step, rank))
    if destination:
        _print_fence(path)
    return 0


def _missing(path: str, step: int, rank: int, part: int | None, *, fence: bool) -> int:
    """Say that ``step`` (``part`` of it) is not stored for ``rank``, and which steps
    are; then, with ``fence``, what the destination's fence says: exit status 1."""
    what = "" if part is None else f" part {part}"
    stored = stored_steps_at(path, rank) if part is None else None
    hint = ""
    if stored:
        first, last = stored[0], stored[-1]
        steps = f"step {first} is" if first == last else f"steps {first} to {last} are"
        hint = f" ({steps} stored for it: --step {first} for the oldest)"
    elif stored is not None:
        hint = " (no step is stored for it)"
    print(f"{path}: no step {step}{what} for rank {rank}{hint}", file=sys.stderr)
    if fence:  # what there is of the destination
        _print_fence(path)
    return 1


def _manifests(receiver: Any, step: int, most: int | None) -> Manifest | list[Manifest] | None:
    """The manifest of ``step`` for the receiver's rank, or, for a step filled part by
    part, its parts' (the first ``most`` + 1 of them, or all); ``None``: not stored."""
    try:
        return receiver.manifest(step)  # type: ignore[no-any-return]
    except ConfigError:  # a step filled part by part, or no store (which raises again)
        parts: list[Manifest] = []
        while most is None or len(parts) <= most:
            part = receiver.manifest(step, part=len(parts))
            if part is None:
                break
            parts.append(part)
        return parts


def _parts_text(parts: list[Manifest], step: int, rank: int) -> str:
    """What the manifests of the parts of a step filled part by part say, the first
    :data:`_MAX_PARTS` of them."""
    if not parts:
        return (
            f"step {step} rank {rank} was filled part by part: none of its parts is for this rank"
        )
    more = len(parts) > _MAX_PARTS
    count = f"{_MAX_PARTS} parts and more" if more else f"{len(parts)} parts"
    lines = [
        f"step {step} rank {rank} was filled part by part: {count} (--part N: the "
        "manifest of part N alone; --json: all of them, as a list)"
    ]
    lines += [_manifest_text(m) for m in parts[:_MAX_PARTS]]
    if more:
        lines.append(f"... more parts (--part {_MAX_PARTS} and on)")
    return "\n".join(lines)


def _inspect_fence(ns: argparse.Namespace) -> int:
    """``rlwire inspect DIR/fence.rlw``: the destination's fence described (1 if the
    destination has none)."""
    for option in ("step", "rank", "part", "type"):
        if getattr(ns, option) is not None:
            raise ConfigError(f"--{option}: {ns.path} is a destination's fence, of no step")
    if ns.json:
        raise ConfigError(f"--json: {ns.path} is a destination's fence, which has no manifest")
    path = os.path.dirname(ns.path) or "."
    local = _local(path)
    if local is not None and not os.path.isdir(local):
        raise ConfigError(f"{path}: no such directory (give the directory a sender writes to)")
    text, found = _fence(path) or (f"{path}: no fence file is kept there", False)
    print(text, file=sys.stdout if found else sys.stderr)
    return 0 if found else 1


def _print_fence(path: str) -> None:
    """Print what the destination ``path``'s fence says, if it is a store."""
    fence = _fence(path)
    if fence is not None:
        print(fence[0])


def _fence(path: str) -> tuple[str, bool] | None:
    """What the fence of the destination ``path`` says, in a line, and whether there
    is one; ``None`` where no fence file is kept (ZeroMQ; ``ray://``, whose board
    fences). Every open of a store writes it (format 1.7), but one with
    ``on_existing="error"`` of a destination that had none."""
    found = fence_at(path)
    if found is None:
        return None
    if found.token is None:
        return (
            f"fence: none at {found.where}: the senders that opened the destination did "
            'so with on_existing="error" where there was none, or were before format 1.7; '
            "the first fence written fences them off"
        ), False
    how = "" if found.on_existing is None else f' (on_existing="{found.on_existing}")'
    return (
        f"fence: {found.where}, id {found.token.hex()}: written when a sender last opened "
        f"the destination{how}; that sender alone commits and deletes there now, those "
        "opened before it are fenced off"
    ), True


def _manifest_json(manifest: Manifest | list[Manifest]) -> str:
    """The manifest (or list of them) as JSON, with each XXH3-64 checksum a string of 16
    hex digits, as :func:`_manifest_text` shows it: as a JSON number, most are above
    2**53, which JavaScript and jq round."""
    data = msgspec.to_builtins(manifest)
    for m in data if isinstance(data, list) else [data]:
        if m.get("header_checksum") is not None:
            m["header_checksum"] = f"{m['header_checksum']:016x}"
        for c in m.get("columns", ()):
            if "checksums" in c:
                c["checksums"] = [f"{x:016x}" for x in c["checksums"]]
    return msgspec.json.encode(data).decode()


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
_MAX_PARTS = 16


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
