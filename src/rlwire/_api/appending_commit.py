"""How ``add_fields`` commits its message when other stages append to the same step and
rank at once (:mod:`rlwire._api.appending`).

On files and S3 a message of appended fields is named by its number: the one after the
messages its fields were checked against. A stage that finds that number taken (another
stage committed it first) checks its fields again against the messages now there, and
takes the next. Each such collision is another stage's progress, and is tried again for
as long as the step holds more messages than at the try before, after a short random
wait (so that the stages that collided do not collide again in step): however many
stages append at once, each commits, and each is checked against every message committed
before it (a field two stages append is refused to the later one). A collision with no
new message (the file in the making removed by a sender opening, as a killed writer's
leftover; a step holding as many appended messages as the store allows) is tried again
at most :data:`STALLED_TRIES` times in a row. ``ray://`` numbers the messages at its
commit: none collide.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import anyio
import numpy as np
from anyio import CapacityLimiter

from rlwire._api.appended_rows import FieldsEncoding, prepare
from rlwire._api.options import Limits
from rlwire._core.args import check_int, check_step
from rlwire._core.columns import Column, Columns
from rlwire._core.errors import ConfigError, RlwireError, SchemaError, StepExistsError
from rlwire._core.offload import drive_sliced, run_to_the_end
from rlwire._frame.compression import Compressor
from rlwire.transport._base import Sink

__all__ = ["BACKOFF_FIRST", "BACKOFF_MOST", "STALLED_TRIES", "add_fields", "backoff"]

#: How many tries in a row add_fields makes that find its number taken while no other
#: message was appended to the step and rank (no stage made progress).
STALLED_TRIES = 8
#: The bound of the random wait after the first collision of a call, in seconds; it
#: doubles with each collision after it, up to :data:`BACKOFF_MOST`.
BACKOFF_FIRST = 0.005
BACKOFF_MOST = 0.1


def backoff(collisions: int) -> float:
    """The seconds to wait before the next try, after ``collisions`` (from 1) tries of
    one call found its number taken: random, from 0 to a bound that doubles with each.

    Example:
        >>> 0 <= backoff(1) <= BACKOFF_FIRST and 0 <= backoff(50) <= BACKOFF_MOST
        True
    """
    bound = min(BACKOFF_MOST, BACKOFF_FIRST * 2.0 ** min(collisions - 1, 16))
    return random.uniform(0.0, bound)


def _check_input(fields: Mapping[str, Column], rows: int | None) -> Columns:
    if not isinstance(fields, Mapping) or not fields:
        raise ConfigError(f"add_fields needs a non-empty mapping of name -> column, got {fields!r}")
    columns = Columns(fields)  # SchemaError naming the column: a kind or a length
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise ConfigError(f"rows must be a row count (int >= 0) or None, got {rows!r}")
    if rows is not None and len(columns) != rows:
        raise SchemaError(f"add_fields: the columns hold {len(columns)} rows, rows={rows}")
    return columns


async def add_fields(  # noqa: PLR0913 (the call's arguments, and the sender's own)
    sink: Sink,
    limiter: CapacityLimiter,
    limits: Limits,
    step: int,
    fields: Mapping[str, Column],
    rows: int | None,
    rank: int,
    of: bytes | None = None,
    sidecar: frozenset[str] = frozenset(),
    compression: Compressor | None = None,
) -> None:
    """What :meth:`~rlwire.TrainingBatchSender.add_fields` does, its lock held and the
    sink open (or attached); the fields named in ``sidecar`` go to the sidecar, and
    the message is compressed with ``compression`` (the sender's)."""
    # A step or rank taken from an array is a numpy integer: the stored name needs an int.
    step = check_step(int(step) if isinstance(step, np.integer) else step, "add_fields: step")
    rank = check_int(int(rank) if isinstance(rank, np.integer) else rank, "add_fields: rank")
    columns = _check_input(fields, rows)
    if of is not None and not isinstance(of, bytes):
        raise ConfigError(
            f"add_fields: of must be the bytes of a receiver's last_stats.message_id, got {of!r}"
        )
    try:
        encoding = FieldsEncoding(sidecar, compression)
        await _commit(sink, limiter, limits, step, rank, columns, of, encoding)
    except RlwireError as exc:
        exc.add_context(where=sink, step=step, rank=rank)  # the destination, at least
        raise


async def _commit(
    sink: Sink,
    limiter: CapacityLimiter,
    limits: Limits,
    step: int,
    rank: int,
    columns: Columns,
    of: bytes | None,
    encoding: FieldsEncoding,
) -> None:
    seen: int | None = None  # the messages appended when the try before checked
    stalled = collisions = 0
    while True:
        frame, count = await drive_sliced(
            prepare(sink, step, rank, columns, limits, seen is not None, of, encoding),
            limiter,
        )
        if seen is not None:
            stalled = 0 if count > seen else stalled + 1
        seen = count
        staged = None
        try:
            staged = await drive_sliced(
                sink.stage_fields(step, rank, frame, names=frozenset(columns.names)),
                limiter,
                dropped=lambda s: s.discard(),
            )
            await staged.acommit(limiter)
            return
        except BaseException as exc:
            if staged is not None and not staged.visible:
                await run_to_the_end(staged.discard)
            # Another stage took the number (it appended to the step meanwhile), or the
            # file in the making went, while written or at its commit (the sink says
            # which): check the columns again, against the messages now there.
            if not isinstance(exc, StepExistsError) or stalled >= STALLED_TRIES - 1:
                raise
        collisions += 1
        await anyio.sleep(backoff(collisions))
