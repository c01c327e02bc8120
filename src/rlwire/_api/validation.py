"""Validation beside the write: the checks of a step run in a thread of their own while
its bytes are written, and the step is committed only once they pass.

The checks that read every value (the finiteness of a 2048 x 2048 step's floats, about
10 ms; a ``rlwire.Checks`` walk) would otherwise add their time to every send. Writing
first is safe: nothing is visible before the commit, and a step that fails is discarded.
What a user sees does not change: a step that fails its checks raises their error, as
when they ran first, even if its encoding or its write failed meanwhile.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

from anyio import CapacityLimiter, to_thread

from rlwire._api.schema import check_object
from rlwire._api.schema_rows import check_rows_sliced
from rlwire._core.errors import RlwireError
from rlwire._core.offload import Resumes, drive_sliced, run_to_the_end
from rlwire._core.pools import shared_executor
from rlwire._core.slicing import Sliced, run_sliced_beside
from rlwire.transport._base import Staged

__all__ = ["ChecksBeside", "Validation"]


class ChecksBeside:
    """The codec's ``check`` hook of one sender: each Struct is checked at once
    (:func:`~rlwire._api.schema.check_object`, a few calls), and each list the codec
    stores as columns is queued, for :meth:`take` to hand to a :class:`Validation`
    once the encoding is done (beside it, the two would pass the GIL back and forth and
    both run slower; beside the write, which lets go of it, the checks cost nothing)."""

    def __init__(self) -> None:
        self._queued: list[tuple[list[Any], str, dict[str, Any]]] = []

    def __call__(self, obj: Any, path: str) -> None:
        check_object(obj, path)

    def rows(self, items: list[Any], path: str) -> dict[str, Any]:
        """Queue the check of ``items``; the dict the codec fills with what it stored
        for each field (:data:`~rlwire.codecs._registry.Check`), which the check reads
        rather than every item (the column the codec joined, not the rows again)."""
        stored: dict[str, Any] = {}
        self._queued.append((items, path, stored))
        return stored

    def take(self) -> Sliced[None] | None:
        """The queued checks as one sliced generator (None if there are none); the queue
        is empty after."""
        queued, self._queued = self._queued, []
        return _each(queued) if queued else None


def _each(queued: list[tuple[list[Any], str, dict[str, Any]]]) -> Sliced[None]:
    for items, path, stored in queued:
        yield from check_rows_sliced(items, path, stored)


class Validation:
    """The checks of one send, each rank's started in the shared executor as soon as it
    is known, settled before the commit."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._ranks: list[tuple[int, concurrent.futures.Future[None]]] = []
        #: The step :meth:`stage` committed in the write's last trip to a worker thread
        #: (None: not committed yet); the caller settles it as after :meth:`commit`, even
        #: when :meth:`stage` raised (a cancellation that came while it committed).
        self.committed: Staged | None = None
        #: How long that commit took, and what it raised (:meth:`commit` raises it).
        self.commit_seconds = 0.0
        self._commit_error: Exception | None = None

    def start(self, rank: int, checks: Sliced[None]) -> None:
        """Run ``checks`` (of rank ``rank``) beside whatever the caller does next."""
        future = shared_executor().submit(run_sliced_beside, checks, self._stop)
        self._ranks.append((rank, future))

    async def settle(self, limiter: CapacityLimiter) -> RlwireError | None:
        """Wait for every rank's checks; the error of the first rank that failed, its
        rank in its context, or None.

        Raises:
            Exception: a check that failed with something other than an RlwireError.
        """
        futures = [future for _, future in self._ranks if not future.done()]
        if futures:
            await to_thread.run_sync(concurrent.futures.wait, futures, limiter=limiter)
        for rank, future in self._ranks:
            exc = future.exception()
            if isinstance(exc, RlwireError):
                exc.add_context(rank=rank)
                return exc
            if exc is not None:
                raise exc
        return None

    async def stage(
        self, staging: Sliced[Staged], step: int, limiter: CapacityLimiter, resumes: Resumes
    ) -> Staged:
        """Write a step (``staging``, not visible yet) while the checks run beside it;
        the staged step once both are done, already committed (``committed``) when
        the checks had passed by the end of the write. A step that fails its checks is
        discarded and their error raised, whatever else failed meanwhile, as when they
        ran first. Commit it with :meth:`commit`.

        Raises:
            RlwireError: the checks' error, or else the write's; either with ``step``.
        """
        try:
            staged = await drive_sliced(
                self._committing(staging), limiter, resumes, dropped=self._dropped
            )
        except RlwireError as exc:
            exc.add_context(step=step)
            failed = await self.settle(limiter)
            if failed is None:
                raise
            raise failed.add_context(step=step) from None
        except BaseException:
            await self._abandon(None)
            raise
        try:
            failed = await self.settle(limiter)
        except BaseException:
            await self._abandon(staged)
            raise
        if failed is not None:
            await run_to_the_end(staged.discard)
            raise failed.add_context(step=step)
        return staged

    async def _abandon(self, staged: Staged | None) -> None:
        """Stop the checks, wait for them, then discard ``staged`` (if given): to the end,
        whatever cancellations come meanwhile (:func:`run_to_the_end`)."""
        self._stop.set()
        await run_to_the_end(self._wait_then_discard, staged)

    def _wait_then_discard(self, staged: Staged | None) -> None:
        concurrent.futures.wait([future for _, future in self._ranks])
        if staged is not None:
            staged.discard()

    async def commit(self, staged: Staged, limiter: CapacityLimiter) -> None:
        """Make ``staged`` visible (:meth:`Staged.acommit`), unless :meth:`stage` did in
        its last trip: then raise what that commit raised, if anything.

        A commit that raised anything but an rlwire error (a sink's own bug, its
        backend's error passed on) did not say what it left visible: ``staged.visible``
        becomes None, unless the sink set it True, as for a store that could not be
        asked; the caller then neither sends the step again nor goes on past it."""
        try:
            if self.committed is not staged:
                await staged.acommit(limiter)
            elif self._commit_error is not None:
                # Let go of it: its traceback holds the generator's frame, which holds self.
                error, self._commit_error = self._commit_error, None
                raise error
        except Exception as exc:
            if not isinstance(exc, RlwireError) and staged.visible is False:
                staged.visible = None
            raise

    async def settle_failed(self, staged: Staged | None) -> Staged | None:
        """After :meth:`stage` or :meth:`commit` raised: the step that may be visible
        (``staged``, or the one :meth:`stage` committed before it raised), discarded
        when nothing of it is (a failed or cancelled commit); None when nothing was
        committed (the stage cleaned up after itself)."""
        if staged is None:
            staged = self.committed
        if staged is not None and staged.visible is False:
            await run_to_the_end(staged.discard)
        return staged

    def _committing(self, staging: Sliced[Staged]) -> Sliced[Staged]:
        """``staging``, then, in the same trip to a worker thread, the commit, when the
        checks have all passed by then and the sink commits in a thread anyway (the
        default :meth:`Staged.acommit`): one trip fewer a send. The error the commit
        raises is kept for :meth:`commit`, so the caller handles it as ever. A read of
        the commit's (the fence's) that gave up on a cancelled caller
        (:class:`~rlwire._core.offload.Abandoned`) is not kept: it ends this generator,
        and :func:`~rlwire._core.offload.drive_sliced` raises the caller's cancellation;
        the step stays ``committed``, which :meth:`settle_failed` discards if none of it
        became visible."""
        staged = yield from staging
        if _commits_in_thread(staged) and self._passed():
            self.committed = staged
            began = time.perf_counter()
            try:
                staged.commit()
            except Exception as exc:
                self._commit_error = exc
            finally:
                self.commit_seconds = time.perf_counter() - began
        return staged

    def _dropped(self, staged: Staged) -> None:
        """Discard ``staged``, which the write staged (and did not commit) in a trip
        whose caller asyncio had cancelled meanwhile: no one else knows of it."""
        if self.committed is not staged:
            staged.discard()

    def _passed(self) -> bool:
        """True when every rank's checks have finished and passed (or there are none)."""
        return all(
            future.done() and not future.cancelled() and future.exception() is None
            for _, future in self._ranks
        )


def _commits_in_thread(staged: Staged) -> bool:
    """True when ``staged``'s :meth:`~Staged.acommit` is the default one, which runs its
    :meth:`~Staged.commit` in a worker thread, shielded (not a sink's own, cancellable
    async commit)."""
    return getattr(staged.acommit, "__func__", None) is Staged.acommit
