"""The files of a step filled part by part (docs/format.md): each part is a message in
the usual layout whose envelope also records its index, key and cost, and the seal that
closes the step is a small checksummed msgpack object, written whole and last.

The seal is::

    magic "RLWS" (4) | major u16 | minor u16 | body length u32 | body xxh3-64 u64 | body

and its body a msgpack map: ``step`` (int), ``keys`` (for each rank, the keys of its
parts in commit order) and ``costs`` (for each rank, each part's cost, in that order).

Example:
    >>> from rlwire.transport._parts import Seal
    >>> seal = Seal(step=3, keys=(("a", "c"), ("b",)), costs=((5.0, 1.0), (4.0,)))
    >>> parse_seal(seal_bytes(seal), step=3, where="doc") == seal
    True
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterable
from functools import partial

import msgspec
import xxhash

from rlwire._core.errors import ConfigError, CorruptFrameError, StepExistsError, StepOrderError
from rlwire._frame.frame import Frame
from rlwire.transport._parts import MAX_KEY_LENGTH, Key, PartInfo, Seal
from rlwire.transport._stored.layout import (
    _PRELUDE,
    MAX_ENVELOPE,
    PARTS_VERSION,
    _envelope,
    _parse,
    _PartEnvelope,
)
from rlwire.transport._stored.marks import MAX_MARK_BYTES
from rlwire.transport._stored.names import STEP_PART_RE, part_name, seal_name
from rlwire.transport._stored.table import check_magic

__all__ = [
    "MAX_SEAL_FILE_BYTES",
    "SEAL_MAGIC",
    "FirstParts",
    "after_seal",
    "check_end",
    "check_seal_size",
    "check_sealable",
    "head_envelope",
    "is_part_of",
    "parse_part",
    "parse_seal",
    "part_files",
    "part_zero_id",
    "read_parts",
    "seal_bytes",
    "write_seal",
]

SEAL_MAGIC = b"RLWS"
_SEAL_PRELUDE = struct.Struct("<4sHHIQ")
#: The largest seal body a reader accepts (a million parts with keys of 50 bytes).
MAX_SEAL_BYTES = 64 << 20
#: The largest seal file a reader accepts: its prelude and the largest body.
MAX_SEAL_FILE_BYTES = _SEAL_PRELUDE.size + MAX_SEAL_BYTES


class _SealBody(msgspec.Struct, omit_defaults=True):
    step: int
    keys: list[list[str | int]]
    costs: list[list[float]]


_seal_encoder = msgspec.msgpack.Encoder()
_seal_decoder = msgspec.msgpack.Decoder(_SealBody)


def seal_bytes(seal: Seal) -> bytes:
    """The bytes of ``seal``, as stored."""
    body = _seal_encoder.encode(
        _SealBody(
            step=seal.step,
            keys=[list(keys) for keys in seal.keys],
            costs=[[float(c) for c in costs] for costs in seal.costs],
        )
    )
    prelude = _SEAL_PRELUDE.pack(
        SEAL_MAGIC, *PARTS_VERSION, len(body), xxhash.xxh3_64_intdigest(body)
    )
    return prelude + body


def check_seal_size(seal: Seal, where: str) -> bytes:
    """The bytes of ``seal`` (:func:`seal_bytes`) if readers accept a seal that large.

    Raises:
        ConfigError: its body is over :data:`MAX_SEAL_BYTES` (too many parts, or too
            long keys); nothing is written, and the step stays open.
    """
    data = seal_bytes(seal)
    size = len(data) - _SEAL_PRELUDE.size
    if size > MAX_SEAL_BYTES:
        raise ConfigError(
            f"step {seal.step} cannot be sealed: its seal would be {size} bytes (its "
            f"{sum(map(len, seal.keys))} parts' keys and costs), over the {MAX_SEAL_BYTES} "
            f"bytes (64 MiB) readers accept. "
            f"Nothing was written and the step stays open (receive() never returns it): close the "
            f"sender and send the step again from a sender opened with "
            f"start_step={seal.step}, on_existing='truncate', with fewer parts or shorter keys",
            where=where,
        )
    return data


def parse_seal(data: memoryview | bytes | bytearray, *, step: int, where: str) -> Seal:
    """The seal stored as ``data``, checked: its prelude, checksum and body, that it is
    the seal of ``step``, that every rank has one cost per key, and that no key repeats.

    Raises:
        CorruptFrameError: ``data`` is not such a seal.
        UnsupportedVersionError: a major version this reader does not know.
    """
    view = memoryview(data)
    if view.nbytes < _SEAL_PRELUDE.size:
        raise CorruptFrameError(f"a seal of {view.nbytes} bytes is truncated", where=where)
    magic, major, _minor, size, digest = _SEAL_PRELUDE.unpack_from(view)
    check_magic(magic, major, expected=SEAL_MAGIC, known=PARTS_VERSION[0], what="seal", where=where)
    body = view[_SEAL_PRELUDE.size :]
    if size > MAX_SEAL_BYTES:
        raise CorruptFrameError(
            f"the seal says its body is {size} bytes, over the {MAX_SEAL_BYTES} bytes "
            f"(64 MiB) a reader accepts",
            where=where,
        )
    if size != body.nbytes:
        raise CorruptFrameError(
            f"the seal says its body is {size} bytes, found {body.nbytes}", where=where
        )
    if xxhash.xxh3_64_intdigest(body) != digest:
        raise CorruptFrameError("the seal does not match its checksum", where=where)
    try:
        got = _seal_decoder.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise CorruptFrameError(f"malformed seal: {exc}", where=where) from exc
    if got.step != step:
        raise CorruptFrameError(f"the seal of step {got.step}, expected {step}", where=where)
    if len(got.keys) != len(got.costs) or any(
        len(k) != len(c) for k, c in zip(got.keys, got.costs, strict=True)
    ):
        raise CorruptFrameError("the seal's keys and costs disagree in length", where=where)
    keys: list[Key] = [key for rank in got.keys for key in rank]
    if len(set(map(_typed, keys))) != len(keys) or any(
        isinstance(k, str) and not 0 < len(k) <= MAX_KEY_LENGTH for k in keys
    ):
        raise CorruptFrameError("the seal lists a key twice, or an empty key", where=where)
    return Seal(
        step=step,
        keys=tuple(tuple(rank) for rank in got.keys),
        costs=tuple(tuple(rank) for rank in got.costs),
    )


def _typed(key: Key) -> tuple[type, Key]:
    """A key told apart by its type too: ``1`` and ``"1"`` are different keys."""
    return (type(key), key)


def parse_part(
    data: memoryview,
    *,
    step: int,
    rank: int,
    index: int,
    load_sidecar: Callable[[int], memoryview],
    where: str,
    verify: bool = True,
) -> tuple[PartInfo, Frame]:
    """Rebuild a part's Frame from its main file, as
    :func:`~rlwire.transport._stored.layout.parse_main` does, with what its envelope
    records of it.

    Raises:
        CorruptFrameError: as ``parse_main``, and a main file that is not part ``index``
            of ``rank`` (a whole step's message included).
        UnsupportedVersionError: as ``parse_main``.
    """
    env = _envelope(data, where)
    info = _part_info(env, rank, index, where)
    return info, _parse(env, data, step, rank, load_sidecar, where, verify)


def part_zero_id(
    load_head: Callable[[int], bytes | bytearray | memoryview | None], rank: int, where: str
) -> bytes:
    """The id of rank ``rank``'s part 0 of a step, read from its first bytes with
    ``load_head(size)`` (``None``: no such file), never the whole part; ``b""`` when
    there is none (:meth:`~rlwire.abc.Source.first_part`).

    Raises:
        CorruptFrameError: the envelope is garbled, not part 0's, or longer than the file.
    """
    found = _head_envelope(load_head, rank, 0, where)
    return b"" if found is None else found[0].id


def _head_envelope(
    load_head: Callable[[int], bytes | bytearray | memoryview | None],
    rank: int,
    index: int,
    where: str,
) -> tuple[_PartEnvelope, PartInfo] | None:
    """The envelope of the main file of part ``index`` of ``rank`` and what it records
    of the part, read from the file's first bytes with ``load_head(size)``: a second
    read when the envelope is longer than the first; ``None`` if there is no such file.

    Raises:
        CorruptFrameError: the envelope is garbled, not that of this part, or longer
            than the file.
        UnsupportedVersionError: a major version this reader does not know.
    """
    env = head_envelope(load_head, where)
    return None if env is None else (env, _part_info(env, rank, index, where))


def head_envelope(
    load_head: Callable[[int], bytes | bytearray | memoryview | None], where: str
) -> _PartEnvelope | None:
    """The envelope of a main file (a part's or a whole step's), read from its first
    bytes with ``load_head(size)``: a second read when the envelope is longer than the
    first; ``None`` if there is no such file.

    Raises:
        CorruptFrameError: the envelope is garbled, or longer than the file.
        UnsupportedVersionError: a major version this reader does not know.
    """
    size = MAX_MARK_BYTES
    for _ in range(2):
        head = load_head(size)
        if head is None:
            return None
        view = memoryview(head)
        if view.nbytes >= _PRELUDE.size:
            needed = _PRELUDE.size + int(_PRELUDE.unpack_from(view)[3])
            if view.nbytes < needed <= _PRELUDE.size + MAX_ENVELOPE:
                size = needed
                continue
        return _envelope(view, where, whole=False)
    raise CorruptFrameError("its envelope is longer than the file", where=where)


def _part_info(env: _PartEnvelope, rank: int, index: int, where: str) -> PartInfo:
    if env.part != index or env.key is None or env.rank != rank:
        found = "a whole step's message" if env.part is None else f"part {env.part}"
        raise CorruptFrameError(
            f"holds {found} of rank {env.rank}, expected part {index} of rank {rank}",
            where=where,
        )
    cost = env.cost if env.cost is not None else 0.0
    return PartInfo(rank=env.rank, index=env.part, key=env.key, cost=cost, of=env.of)


class FirstParts:
    """The ids of each rank's part 0 of the step a sender fills, which its later parts
    record that they follow (format 1.6: a reader tells a part of another run of the
    step, one written again since by a producer restarted with ``overwrite``). Read
    once per step and rank, from part 0's envelope, when part 1 is staged."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._ids: dict[int, bytes] = {}

    def follows(self, step: int, part: PartInfo, read: Callable[[], bytes | None]) -> PartInfo:
        """``part`` with the id of the part 0 it follows (``read`` reads it from the
        store); as it is for part 0, or when part 0 is not committed yet (a part staged
        before it: it says nothing, as before 1.6)."""
        if not part.index:
            return part
        if self._step != step:
            self._step, self._ids = step, {}
        first = self._ids.get(part.rank)
        if first is None:
            first = read()
            if first is None:
                return part
            self._ids[part.rank] = first
        return dataclasses.replace(part, of=first)


def is_part_of(name: str, step: int) -> bool:
    """Whether ``name`` is a file of a part of ``step``."""
    m = STEP_PART_RE.fullmatch(name)
    return m is not None and int(m.group(1)) == step


def part_files(names: Iterable[str], step: int) -> tuple[dict[tuple[int, int], str], list[str]]:
    """The main files of the parts of ``step`` among ``names``, by ``(rank, index)``,
    and the sidecar files whose main file is not there (a killed commit's)."""
    mains: dict[tuple[int, int], str] = {}
    sidecars: dict[tuple[int, int], str] = {}
    for name in names:
        m = STEP_PART_RE.fullmatch(name)
        if m and int(m.group(1)) == step:
            (sidecars if m.group(4) else mains)[(int(m.group(2)), int(m.group(3)))] = name
    return mains, sorted(n for place, n in sidecars.items() if place not in mains)


def read_parts(
    mains: dict[tuple[int, int], str],
    load_head: Callable[[str, int], bytes | bytearray | memoryview | None],
    locate: Callable[[str], str],
) -> list[PartInfo]:
    """What the envelopes of the parts ``mains`` (from :func:`part_files`) record, read
    from their first bytes with ``load_head(name, size)``; every rank's indices must run
    from 0 without a gap.

    Raises:
        CorruptFrameError: an envelope is garbled or not its part's, a part is gone, or
            a rank's parts have a gap.
    """
    found = []
    for (rank, index), name in sorted(mains.items()):
        if index and (rank, index - 1) not in mains:
            raise CorruptFrameError(
                f"part {index - 1} of rank {rank} is missing, part {index} is there",
                where=locate(name),
            )
        got = _head_envelope(partial(load_head, name), rank, index, locate(name))
        if got is None:
            raise CorruptFrameError("deleted while the step was resumed", where=locate(name))
        found.append(got[1])
    return found


def after_seal(seal: Seal) -> list[str]:
    """The names of the part each rank of ``seal`` would have next: none may exist when
    the seal is written (a part there was put by another producer, and no rank's
    ``parts()`` must hand out a part its seal does not list)."""
    return [part_name(seal.step, rank, len(keys)) for rank, keys in enumerate(seal.keys)]


def check_sealable(seal: Seal, found: list[int], where: str) -> None:
    """Refuse to write ``seal`` when ``found`` (indices into its seal name followed by
    :func:`after_seal`, that exist) is not empty.

    Raises:
        StepExistsError: the step is sealed, or holds a part the seal does not list.
    """
    if not found:
        return
    if found[0] == 0:
        raise StepExistsError(f"step {seal.step} is sealed already", where=where)
    rank = found[0] - 1
    raise StepExistsError(
        f"step {seal.step} holds part {len(seal.keys[rank])} of rank {rank}, which this "
        f"producer did not put and its seal would not list (another producer fills the "
        f"step: one producer per step); the step stays open",
        where=where,
    )


def write_seal(
    save: Callable[[str, bytes], None], seal: Seal, found: list[int], where: str
) -> None:
    """Write ``seal`` with ``save`` once :func:`check_seal_size` and
    :func:`check_sealable` allow it (``found``).

    Raises:
        ConfigError: as :func:`check_seal_size`.
        StepExistsError: as :func:`check_sealable`; also when another producer's seal
            was written since ``found`` was listed (``save`` raised ``FileExistsError``:
            a store that refuses to replace a seal).
    """
    data = check_seal_size(seal, where)
    check_sealable(seal, found, where)
    try:
        save(seal_name(seal.step), data)
    except FileExistsError:
        check_sealable(seal, [0], where)


def check_end(end: int, unsealed: int | None, where: str) -> None:
    """Refuse to mark the end of the stream at ``end`` while that step is open part by
    part (``unsealed``): its visible parts would be handed out past the end, and a
    receiver part way through it would wait for the rest forever.

    Raises:
        StepOrderError: ``end`` is the open step.
    """
    if end == unsealed:
        raise StepOrderError(
            f"step {end} is open part by part (a killed producer's): open_step({end}) and "
            "seal it (or truncate it) before finishing the stream",
            where=where,
        )
