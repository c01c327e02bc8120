"""The thread limiter and lock of a sender or receiver, for whichever event loop awaits it.

anyio binds a ``CapacityLimiter`` or ``Lock`` to the backend (asyncio or trio) that first
uses it: awaited later under the other backend (successive ``anyio.run`` calls), it
raises ``RuntimeError: no running event loop``. What rlwire makes is made again for each
backend; a limiter the user gave is theirs to share, so it is kept, and a use under
another backend than its own raises a :class:`~rlwire.ConfigError` saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from anyio import CapacityLimiter, CapacityLimiterStatistics, Lock, LockStatistics

from rlwire._core.args import check_int
from rlwire._core.errors import ConfigError

T = TypeVar("T")

_library: Callable[[], str] | None
try:
    from sniffio import current_async_library as _library
except ImportError:  # pragma: no cover (trio, which rlwire's tests run, needs sniffio)
    _library = None

__all__ = ["BackendLimiter", "BackendLock", "GivenLimiter", "make_limiter"]


def make_limiter(limiter: CapacityLimiter | int | None, default: int = 2) -> CapacityLimiter:
    """The limiter given, kept as :class:`GivenLimiter`, or one of that many (or ``default``)
    tokens made for each backend. Safe to call before an event loop runs."""
    if isinstance(limiter, BackendLimiter | GivenLimiter):
        return limiter  # one of rlwire's, passed on (a receiver's, to a codec)
    if isinstance(limiter, CapacityLimiter):
        return GivenLimiter(limiter)
    if limiter is None:
        return BackendLimiter(default)
    return BackendLimiter(check_int(limiter, "limiter (a CapacityLimiter or its size)", low=1))


def _backend() -> str:
    """The backend of the task running, as anyio tells it (sniffio's word, else asyncio:
    without sniffio, which trio needs, anyio runs asyncio alone)."""
    return "asyncio" if _library is None else _library()


def _own(made: dict[str, T], make: Callable[[], T]) -> T:
    """The current backend's object in ``made``, made by ``make()`` on its first use:
    made on the loop, it is that backend's own."""
    backend = _backend()
    got = made.get(backend)
    if got is None:
        got = made[backend] = make()
    return got


class _Delegating(CapacityLimiter):
    """A CapacityLimiter passing every call on to :attr:`_limiter`."""

    __slots__ = ()

    def __new__(cls, *args: object) -> _Delegating:
        return object.__new__(cls)  # not CapacityLimiter's: it makes a backend's own

    @property
    def _limiter(self) -> CapacityLimiter:
        raise NotImplementedError

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    @property
    def borrowed_tokens(self) -> int:
        return self._limiter.borrowed_tokens

    @property
    def available_tokens(self) -> float:
        return self._limiter.available_tokens

    def acquire_nowait(self) -> None:
        self._limiter.acquire_nowait()

    def acquire_on_behalf_of_nowait(self, borrower: object) -> None:
        self._limiter.acquire_on_behalf_of_nowait(borrower)

    async def acquire(self) -> None:
        await self._limiter.acquire()

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        await self._limiter.acquire_on_behalf_of(borrower)

    def release(self) -> None:
        self._limiter.release()

    def release_on_behalf_of(self, borrower: object) -> None:
        self._limiter.release_on_behalf_of(borrower)

    def statistics(self) -> CapacityLimiterStatistics:
        return self._limiter.statistics()


class BackendLimiter(_Delegating):
    """A limiter of ``total_tokens`` made anew for each backend that uses it (asyncio's
    serves every asyncio loop in turn, trio's every trio run)."""

    __slots__ = ("_made", "_total")

    def __init__(self, total_tokens: float) -> None:
        self._total = total_tokens
        self._made: dict[str, CapacityLimiter] = {}

    @property
    def _limiter(self) -> CapacityLimiter:
        return _own(self._made, lambda: CapacityLimiter(self._total))

    @property
    def total_tokens(self) -> float:
        return self._total

    @total_tokens.setter
    def total_tokens(self, value: float) -> None:
        for made in self._made.values():
            made.total_tokens = value
        self._total = value


class GivenLimiter(_Delegating):
    """The user's limiter, shared with their other work; used under another backend than
    the one it is bound to, a :class:`~rlwire.ConfigError` (anyio raises RuntimeError)."""

    __slots__ = ("given",)

    def __init__(self, given: CapacityLimiter) -> None:
        self.given = given

    @property
    def _limiter(self) -> CapacityLimiter:
        return self.given

    @property
    def total_tokens(self) -> float:
        return self.given.total_tokens

    @total_tokens.setter
    def total_tokens(self, value: float) -> None:
        self.given.total_tokens = value

    def _refused(self) -> ConfigError:
        return ConfigError(
            f"the limiter given (a CapacityLimiter of {self.given.total_tokens} tokens) "
            "belongs to another event loop "
            f"backend than this one ({_backend()}): anyio binds a CapacityLimiter to the "
            "backend that first uses it. Give one made for this backend, or a size "
            "(limiter=2) for rlwire to make one for each backend"
        )

    def acquire_nowait(self) -> None:
        try:
            self.given.acquire_nowait()
        except RuntimeError as exc:
            raise self._refused() from exc

    def acquire_on_behalf_of_nowait(self, borrower: object) -> None:
        try:
            self.given.acquire_on_behalf_of_nowait(borrower)
        except RuntimeError as exc:
            raise self._refused() from exc

    async def acquire(self) -> None:
        try:
            await self.given.acquire()
        except RuntimeError as exc:
            raise self._refused() from exc

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        try:
            await self.given.acquire_on_behalf_of(borrower)
        except RuntimeError as exc:
            raise self._refused() from exc


class BackendLock(Lock):
    """An anyio Lock made anew for each backend that uses it (a sender awaited under
    asyncio, then under trio)."""

    __slots__ = ("_made",)

    def __new__(cls) -> BackendLock:
        return object.__new__(cls)  # not Lock's: it makes a backend's own

    def __init__(self) -> None:
        self._made: dict[str, Lock] = {}

    @property
    def _lock(self) -> Lock:
        return _own(self._made, Lock)

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._lock.release()

    async def acquire(self) -> None:
        await self._lock.acquire()

    def acquire_nowait(self) -> None:
        self._lock.acquire_nowait()

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def statistics(self) -> LockStatistics:
        return self._lock.statistics()
