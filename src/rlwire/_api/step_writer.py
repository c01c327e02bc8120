"""StepWriter: a step filled part by part (``sender.open_step``), each part committed on
its own and assigned to a rank; leaving the block seals the step.

A part is a list of samples: what the step's object holds in its one list field (a
:class:`~rlwire.TrainingBatch`'s ``samples``). It is encoded, checked, compressed and
written exactly as a whole step's message is (the sender's own path), under the part's
own names, and is visible once its commit returns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Protocol

import anyio
from anyio import CapacityLimiter, to_thread

from rlwire._api.balance import choose_rank, token_cost
from rlwire._api.owned_parts import OwnedParts
from rlwire._api.stats import PartsClock, SendClock, SendStats
from rlwire._api.validation import Validation
from rlwire._core.args import check_int
from rlwire._core.columns import Columns
from rlwire._core.errors import (
    ClosedError,
    ConfigError,
    RlwireError,
    StepExistsError,
    TransportError,
)
from rlwire._core.offload import run_to_the_end
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import Frame
from rlwire.transport._base import Sink, Staged
from rlwire.transport._parts import Key, PartInfo, Seal, check_key


class _Sender(Protocol):
    """What a StepWriter uses of its :class:`~rlwire.TrainingBatchSender` (which
    imports this module)."""

    _lock: anyio.Lock
    _limiter: CapacityLimiter
    _closed: bool
    _names_checked: bool
    _owned: OwnedParts
    _unsealed: int | None
    _last_stats: SendStats | None
    _on_stats: Callable[[SendStats], object] | None

    @property
    def sink(self) -> Sink: ...

    async def _begin_parts(self, step: int | None, ranks: int) -> int: ...

    def _end_parts(self, step: int, *, sealed: bool) -> None: ...

    def _encode(
        self, obj: Any, step: int, rank: int, clock: SendClock, validation: Validation
    ) -> Sliced[Frame]: ...


__all__ = ["StepWriter"]


class StepWriter:
    """One step of a :class:`~rlwire.TrainingBatchSender` filled part by part: made by
    :meth:`~rlwire.TrainingBatchSender.open_step`, used as ``async with``.

    Each :meth:`put` commits one part, visible to receivers when it returns, and assigns
    it to a rank: the one given, or the rank with the lowest cost so far in this step
    (tokens, by default). Leaving the block without an exception writes the step's
    seal, which records the final assignment (for each rank, its parts' keys in commit
    order), and only then do ``receive()`` calls for the step return it.

    Leaving the block with an exception (or cancelled) seals nothing: the parts already
    committed stay, and the step stays open. The sender then refuses other steps
    (``StepOrderError``) until the step is opened again and sealed: by
    ``open_step(step)`` on the same sender, or, after a crash, by a sender opened with
    ``on_existing="resume"``, whose ``open_step()`` learns the keys already committed;
    :meth:`put` skips those, so every key is stored exactly once.

    **Balance.** With the default ``balance="cost"``, each part goes to the rank with
    the lowest total so far (ties: the lowest rank), so the totals of any two ranks
    never differ by more than the largest part's cost, as long as no part is forced with
    ``rank=``. With ``balance="count"`` the ranks' part counts never differ by more
    than one (the lowest cost breaks ties), and the seal refuses a step whose ranks got
    different counts (``ConfigError``, the step stays open): data-parallel ranks then
    run the same number of micro-batches, at the price of no bound on tokens.

    Puts are serialized with each other and with the sender's other calls; each encodes
    and writes in worker threads as a send does.
    """

    def __init__(
        self,
        sender: _Sender,
        step: int | None,
        *,
        ranks: int,
        cost: Callable[[Any], float] | None,
        balance: str,
    ) -> None:
        if not sender.sink.stores_parts:
            raise ConfigError(f"{sender.sink!r} cannot store a step part by part (open_step)")
        check_int(ranks, "ranks", low=1)
        if balance not in ("cost", "count"):
            raise ConfigError(f"balance must be 'cost' or 'count', got {balance!r}")
        if cost is not None and not callable(cost):
            raise ConfigError(f"cost must be a callable of a part's samples, got {cost!r}")
        self._sender = sender
        self._asked = step
        self._ranks = ranks
        self._cost = token_cost if cost is None else cost
        self._balance = balance
        self.step = -1  # known once entered
        self._entered = False
        self._keys: list[list[Key]] = [[] for _ in range(ranks)]
        self._costs: list[list[float]] = [[] for _ in range(ranks)]
        self._taken: dict[tuple[type, Key], tuple[int, int]] = {}
        self._resumed: frozenset[tuple[type, Key]] = frozenset()
        self._sealed = False
        self._unknown = False  # a part's commit left it undecided
        self._clock = PartsClock(ranks, 0.0)  # the figures of the parts it puts

    def __repr__(self) -> str:
        return f"StepWriter(step={self.step}, parts={[len(k) for k in self._keys]})"

    @property
    def assignment(self) -> tuple[tuple[Key, ...], ...]:
        """For each rank, the keys of its parts so far, in commit order (what the seal
        records), resumed parts included."""
        return tuple(tuple(keys) for keys in self._keys)

    @property
    def resumed(self) -> frozenset[Key]:
        """The keys an earlier run committed to this step, which :meth:`put` skips."""
        return frozenset(key for _, key in self._resumed)

    async def __aenter__(self) -> StepWriter:
        if self._entered:
            # Its parts and seal belong to the step it was entered for.
            raise ClosedError(
                f"{self!r} is entered once: sender.open_step() again for another step, "
                "or to go on with this one"
            )
        sender = self._sender
        async with sender._lock:
            began = time.perf_counter()
            self.step = await sender._begin_parts(self._asked, self._ranks)
            self._clock = PartsClock(self._ranks, time.perf_counter() - began)
            try:
                found = await to_thread.run_sync(
                    sender.sink.committed_parts, self.step, self._ranks, limiter=sender._limiter
                )
                for info in sender._owned.learn(self.step, self._ranks, found, sender.sink):
                    self._record(info)
                self._resumed = frozenset(self._taken)
            except BaseException:
                before = sender._unsealed
                sender._end_parts(self.step, sealed=False)
                if not sender._owned.holds(self.step):  # nothing of it is this sender's
                    sender._unsealed = before
                raise
        self._entered = True
        return self

    def _record(self, info: PartInfo) -> None:
        self._keys[info.rank].append(info.key)
        self._costs[info.rank].append(info.cost)
        self._taken[(type(info.key), info.key)] = (info.rank, info.index)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None:
                await self.seal()
        finally:
            if not self._sealed:  # an error in the block, or in sealing: the step stays open
                self._sender._end_parts(self.step, sealed=False)

    async def put(
        self, samples: Sequence[Any] | Columns, *, key: Key, rank: int | None = None
    ) -> bool:
        """Commit ``samples`` (a list of the step's samples) as one part named ``key``.

        Args:
            samples: the part's samples: a list of what the step's object holds in its
                list field (:class:`~rlwire.TrainingSample` for a
                :class:`~rlwire.TrainingBatch`), or an :class:`~rlwire.Columns`.
            key: the part's name, unique within the step: a string (1 to 1024
                characters) or an integer.
            rank: the rank to give it to; default: by the writer's balance.

        Returns:
            True if ``key`` was committed by an earlier run of this step (a resumed
            producer) and nothing was written; False once the part is committed.

        Raises:
            StepExistsError: ``key`` was put already in this run of the step.
            ConfigError: a bad key, rank, cost or ``samples`` that is not a list.
            SchemaError, EncodeError: as :meth:`~rlwire.TrainingBatchSender.send`,
                nothing written; named ``step 3, rank 1, part 2 (key 'g7'): ...``.
            TransportError: the part cannot be written; or an earlier part's commit
                failed without knowing whether it became visible (reopen the step).
            ClosedError: the step is sealed, or the sender closed.

        Example:
            >>> import anyio, rlwire, tempfile
            >>> async def main(path: str) -> None:
            ...     async with rlwire.open_sender(path) as sender:
            ...         async with sender.open_step(ranks=2) as writer:
            ...             for g, tokens in enumerate(([1, 2, 3], [4], [5, 6])):
            ...                 await writer.put([{"token_ids": tokens}], key=f"group-{g}")
            ...         print(writer.assignment)  # the lightest rank takes the next part
            >>> anyio.run(main, tempfile.mkdtemp())
            (('group-0',), ('group-1', 'group-2'))
        """
        key = check_key(key)
        if not isinstance(samples, list | Columns):
            what = type(samples).__name__
            raise ConfigError(f"a part's samples must be a list (or a rlwire.Columns), got {what}")
        sender = self._sender
        async with sender._lock:
            self._check_open()
            typed = (type(key), key)
            if typed in self._resumed:
                return True
            if typed in self._taken:
                had_rank, had_index = self._taken[typed]
                raise StepExistsError(
                    f"key {key!r} was put already in step {self.step} (rank {had_rank}, part "
                    f"{had_index}): keys are unique within a step",
                    step=self.step,
                )
            cost = self._weigh(samples)
            rank = (
                choose_rank(self._costs, self._balance) if rank is None else self._check_rank(rank)
            )
            info = PartInfo(rank=rank, index=len(self._keys[rank]), key=key, cost=cost)
            await self._write(info, samples)
        return False

    def _check_open(self) -> None:
        if not self._entered:  # it has no step yet
            raise ClosedError(
                f"{self!r} is not open: use it as `async with sender.open_step() as "
                "writer` (`with` on a SyncSender) before put or seal"
            )
        if self._sealed:
            raise ClosedError(f"step {self.step} is sealed: nothing can be put after")
        if self._sender._closed:
            raise ClosedError(f"{self._sender!r} is closed")
        if self._unknown:
            raise TransportError(
                f"whether a part of step {self.step} became visible is unknown (its commit "
                "failed and did not say); open the step again, which settles it, to go on",
                where=self._sender.sink,
            )

    def _weigh(self, samples: Any) -> float:
        cost = self._cost(samples)
        if (
            isinstance(cost, bool)
            or not isinstance(cost, int | float)
            or not math.isfinite(cost)
            or cost < 0
        ):
            raise ConfigError(f"a part's cost must be a finite number >= 0, got {cost!r}")
        return float(cost)

    def _check_rank(self, rank: object) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self._ranks:
            raise ConfigError(f"rank must be an int in [0, {self._ranks}), got {rank!r}")
        return rank

    async def _write(self, info: PartInfo, samples: Any) -> None:
        sender, limiter = self._sender, self._sender._limiter
        clock = SendClock(self._ranks)
        validation = Validation()
        frame = sender._encode(samples, self.step, info.rank, clock, validation)
        staged: Staged | None = None
        try:
            staged = await validation.stage(
                sender.sink.stage_part(self.step, info, frame), self.step, limiter, clock.resumes
            )
            sender._names_checked = True
            clock.staged = time.perf_counter() - validation.commit_seconds
            await validation.commit(staged, limiter)
            self._clock.add(clock.stats(self.step))
        except BaseException as exc:
            staged = await validation.settle_failed(staged)
            if isinstance(exc, RlwireError):  # a checks' error too: which put it was
                exc.add_context(where=info.named(self.step), step=self.step, rank=info.rank)
            if staged is not None and staged.visible is None:
                self._unknown = True
            raise
        finally:
            # A part that may be visible is never put again, and is this sender's.
            if staged is not None and staged.visible is not False:
                sender._owned.put(self.step, info)
            if staged is not None and staged.visible:
                self._record(info)

    async def seal(self) -> None:
        """Seal the step now (leaving the block does it): write the record of every
        rank's parts, after which receivers' ``receive()`` returns the step, and the
        sender goes on to the next step. A second call does nothing. The step's
        :class:`~rlwire.SendStats` (its parts' figures summed) is then the sender's
        ``last_stats``, and handed to its ``on_stats``.

        Raises:
            ConfigError: ``balance="count"`` and the ranks' part counts differ (put more,
                then seal), or the seal is over the readers' 64 MiB; the step stays open.
            TransportError: the seal cannot be written (the step stays open).
        """
        sender = self._sender
        async with sender._lock:
            if self._sealed:
                return
            self._check_open()
            counts = [len(keys) for keys in self._keys]
            if self._balance == "count" and len(set(counts)) > 1:
                raise ConfigError(
                    f"step {self.step} cannot be sealed with balance='count': its ranks got "
                    f"{counts} parts; put parts until they are equal"
                )
            seal = Seal(
                step=self.step,
                keys=self.assignment,
                costs=tuple(tuple(costs) for costs in self._costs),
            )
            began = time.perf_counter()
            try:
                await sender.sink.aseal(seal, sender._limiter)
            except BaseException as exc:
                # Cancelled: asyncio's own cancellation passes the shield of a seal in a
                # thread, which goes on; the store then says whether it was written.
                if not isinstance(exc, Exception) and await self._sealed_anyway():
                    self._sealed = True
                    sender._end_parts(self.step, sealed=True)
                raise
            self._sealed = True
            sender._end_parts(self.step, sealed=True)
            stats = self._clock.sealed(self.step, time.perf_counter() - began)
            sender._last_stats = stats
        if sender._on_stats is not None:
            sender._on_stats(stats)

    async def _sealed_anyway(self) -> bool:
        """Whether the store holds this step's seal (asked to the end, whatever
        cancellations come meanwhile); False when it cannot tell (the step stays open,
        and opening it again settles it)."""
        found: list[bool] = []

        def ask() -> None:
            try:
                self._sender.sink.committed_parts(self.step)
            except StepExistsError:
                found.append(True)
            except Exception:
                pass

        await run_to_the_end(ask)
        return bool(found)
