"""Calls into a plugin's code, guarded: what a plugin raises that is not an rlwire error
becomes one naming the plugin, the call and the step, and what it returns that its call
does not return is refused the same way.

A plugin is code outside rlwire: a sink, source or staged step whose class is defined in
another package (:func:`guard_class`, which :class:`~rlwire.abc.Sink`,
:class:`~rlwire.abc.Source` and :class:`~rlwire.abc.Staged` apply to each subclass as it
is defined, so every caller of a plugin's method gets its errors typed), or a codec of
another package (:func:`guarded_sliced` and :func:`plugin_error`, where the sender
encodes and the receiver decodes). rlwire's own errors pass through as they are, and so
does every BaseException that is not an Exception (a cancellation, KeyboardInterrupt,
:class:`~rlwire._core.offload.Abandoned`): a guard never swallows one.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from rlwire._core.errors import PluginError, RlwireError, TransportError

__all__ = [
    "Returns",
    "guard_class",
    "guarded_sliced",
    "is_plugin",
    "plugin_error",
    "wrong_return",
]

T = TypeVar("T")

#: What a call must return: ``(test, what it wants)``, e.g. ``(is_int, "an int")``.
Returns = tuple[Callable[[Any], bool], str]

_GUARDED = "__rlwire_guarded__"  # set on a guard, so that one is never guarded again


def is_plugin(obj: object) -> bool:
    """True if ``obj`` (a class, an instance of one, or a function) is defined outside
    rlwire."""
    owner = obj if isinstance(obj, type) or inspect.isfunction(obj) else type(obj)
    module = getattr(owner, "__module__", "") or ""
    return module != "rlwire" and not module.startswith("rlwire.")


def plugin_error(exc: Exception, who: str, call: str, *, step: int | None = None) -> RlwireError:
    """The error to raise ``from exc`` for ``exc``, which the plugin ``who`` raised in
    ``call``: a :class:`~rlwire.TransportError` for an OSError (errno kept), else a
    :class:`~rlwire.PluginError`.

    Example:
        >>> str(plugin_error(ValueError("bad"), "the sink plugin x.Sink", "stage()", step=3))
        'step 3: stage() of the sink plugin x.Sink raised ValueError: bad'
    """
    message = f"{call} of {who} raised {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):
        err: RlwireError = TransportError(message, step=step)
        if isinstance(exc.errno, int):
            err.errno = exc.errno  # type: ignore[attr-defined]
        return err
    return PluginError(message, step=step)


def wrong_return(got: object, who: str, call: str, wants: str, *, step: int | None) -> PluginError:
    """The error for ``got``, which ``call`` of ``who`` returned instead of ``wants``."""
    shown = repr(got)
    shown = shown if len(shown) <= 80 else f"{shown[:77]}..."
    return PluginError(
        f"{call} of {who} returned {type(got).__name__} {shown}, not {wants}", step=step
    )


def guarded_sliced(
    slices: Generator[None, None, T],
    who: str,
    call: str,
    *,
    step: int | None = None,
    returns: Returns | None = None,
) -> Generator[None, None, T]:
    """``slices``, a plugin's sliced generator, with what it raises typed and what it
    returns checked (``returns``). Closing this generator closes ``slices``."""
    try:
        result = yield from slices
    except RlwireError:
        raise
    except Exception as exc:
        raise plugin_error(exc, who, call, step=step) from exc
    if returns is not None and not returns[0](result):
        raise wrong_return(result, who, call, returns[1], step=step)
    return result


def _step_of(fn: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], int | None]:
    """How to find the step in a call of ``fn`` (a method): its first parameter after
    ``self`` when that is named ``step``."""
    try:
        names = list(inspect.signature(fn).parameters)[1:2]
    except (TypeError, ValueError):
        names = []
    if names != ["step"]:
        return lambda args, kwargs: None

    def step_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        step = args[0] if args else kwargs.get("step")
        return step if isinstance(step, int) else None

    return step_of


class _Call:
    """One guarded method of a plugin's class: how its failures and results are told."""

    def __init__(
        self,
        fn: Callable[..., Any],
        call: str,
        describe: Callable[[Any], str],
        *,
        returns: Returns | None,
        sliced: Returns | None,
        failed: Callable[[Any], None] | None,
    ) -> None:
        self.call, self.describe = call, describe
        self.returns, self.sliced, self.failed = returns, sliced, failed
        self.step_of = _step_of(fn)

    def error(self, owner: Any, exc: Exception, args: Any, kwargs: Any) -> RlwireError:
        if self.failed is not None:
            self.failed(owner)
        return plugin_error(exc, self.describe(owner), self.call, step=self.step_of(args, kwargs))

    def checked(self, owner: Any, result: Any, args: Any, kwargs: Any) -> Any:
        if self.sliced is None and self.returns is None:
            return result
        step = self.step_of(args, kwargs)
        if self.sliced is not None:
            if not isinstance(result, Generator):
                wants = "a sliced generator (a generator function's result)"
                raise wrong_return(result, self.describe(owner), self.call, wants, step=step)
            who = self.describe(owner)
            return guarded_sliced(result, who, self.call, step=step, returns=self.sliced)
        if self.returns is not None and not self.returns[0](result):
            raise wrong_return(result, self.describe(owner), self.call, self.returns[1], step=step)
        return result


def _guard(fn: Callable[..., Any], call: _Call) -> Callable[..., Any]:
    """``fn`` (a method, or a classmethod's function) guarded as ``call`` says."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def guarded_async(owner: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = await fn(owner, *args, **kwargs)
            except RlwireError:
                raise
            except Exception as exc:
                raise call.error(owner, exc, args, kwargs) from exc
            return call.checked(owner, result, args, kwargs)

        setattr(guarded_async, _GUARDED, True)
        return guarded_async

    @functools.wraps(fn)
    def guarded(owner: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(owner, *args, **kwargs)
        except RlwireError:
            raise
        except Exception as exc:
            raise call.error(owner, exc, args, kwargs) from exc
        return call.checked(owner, result, args, kwargs)

    setattr(guarded, _GUARDED, True)
    return guarded


def guard_class(
    cls: type,
    describe: Callable[[Any], str],
    calls: dict[str, tuple[Returns | None, Returns | None, Callable[[Any], None] | None]],
) -> None:
    """Guard the methods named in ``calls`` that ``cls`` itself defines, if it is a
    plugin's class (:func:`is_plugin`) and they are its own code; an inherited method is
    guarded where it is defined, or is rlwire's own. ``calls`` maps a name to
    ``(returns, sliced, failed)``: what a call must return, or (``sliced``) that it
    returns a sliced generator and what that must return, and what to do to the object
    before its error is raised. ``describe(obj)`` names the plugin (``obj`` is an
    instance, or the class for a classmethod)."""
    if not is_plugin(cls):
        return
    for name, (returns, sliced, failed) in calls.items():
        attr = cls.__dict__.get(name)
        fn = attr.__func__ if isinstance(attr, classmethod) else attr
        if not inspect.isfunction(fn) or getattr(fn, _GUARDED, False) or not is_plugin(fn):
            continue  # rlwire's own (``prune = Sink.prune``): rlwire tells it by identity
        call = _Call(fn, f"{name}()", describe, returns=returns, sliced=sliced, failed=failed)
        guarded = _guard(fn, call)
        setattr(cls, name, classmethod(guarded) if isinstance(attr, classmethod) else guarded)
