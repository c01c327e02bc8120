"""The one exception hierarchy of rlwire.

Every error rlwire raises on purpose is an :class:`RlwireError`. Each subclass but
:class:`EndOfStream` (which reports no failure) also derives from the closest built-in
exception, so code that already catches ``ValueError`` or ``OSError`` keeps working.
"""

from __future__ import annotations

import re
from typing import Any, Self


class RlwireError(Exception):
    """Base class of every error rlwire raises on purpose.

    Besides its message, an error carries where it happened, as far as the code that
    raised or passed it on knows: :attr:`where` (a file, object or URL), :attr:`step`,
    :attr:`rank` and :attr:`segment` (0 is a message's header, ``i + 1`` its buffer
    ``i``). The sender and receiver fill in what they know with :meth:`add_context` as an
    error passes through them, and ``str()`` shows it before the message.

    Example:
        >>> err = DecodeError("expected an int, got str").add_context(step=3, rank=1)
        >>> str(err), err.step
        ('step 3, rank 1: expected an int, got str', 3)
    """

    where: str | None = None
    step: int | None = None
    rank: int | None = None
    segment: int | None = None

    def __init__(
        self,
        message: str = "",
        *,
        where: object = None,
        step: int | None = None,
        rank: int | None = None,
        segment: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.add_context(where=where, step=step, rank=rank, segment=segment)

    def add_context(
        self,
        *,
        where: object = None,
        step: int | None = None,
        rank: int | None = None,
        segment: int | None = None,
    ) -> Self:
        """Record what is given and not known yet (the innermost knowledge wins), and
        return the error itself, so that ``raise SomeError(...).add_context(step=7)``
        reads well. To pass on an error caught with ``except``, call it and then
        ``raise``, which keeps the error's cause."""
        if self.where is None and where is not None:
            self.where = str(where)
        if self.step is None:
            self.step = step
        if self.rank is None:
            self.rank = rank
        if self.segment is None:
            self.segment = segment
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (a process pool's worker, a trainer's child).
        # OSError keeps errno in a slot that default pickling drops.
        state = dict(self.__dict__)
        if isinstance(self, OSError):
            state["errno"] = self.errno
        return (type(self), (self.message,), state)

    def __str__(self) -> str:
        known = [
            f"{name} {value}"
            for name, value in (("step", self.step), ("rank", self.rank), ("segment", self.segment))
            if value is not None
        ]
        # A source's name for a message (its path), or the message itself, often says
        # the step and rank already.
        known = [k for k in known if not _named_in(k, f"{self.where} {self.message}")]
        if self.where is not None:
            known.insert(0, self.where)
        prefix = ", ".join(known)
        return f"{prefix}: {self.message}" if prefix else self.message


class ConfigError(RlwireError, ValueError):
    """An option, URL or argument given to rlwire is not valid."""


class SchemaError(RlwireError, ValueError):
    """An object fails validation before it is sent (e.g. NaN logprobs).

    The message names the sample index and the field, e.g.
    ``$.samples[3].logprobs: 2 non-finite values (NaN or Inf; first at token 17); ...``.
    """


class FieldNotFoundError(SchemaError):
    """A receiver opened with ``fields=`` asked for a field the step does not hold.

    The message names the step and rank, the field, and the fields the step holds, e.g.
    ``step 3, rank 0: field 'values' not in the step (its samples hold: token_ids, ...)``.
    """


class EncodeError(RlwireError, TypeError):
    """A value cannot be encoded (object-dtype array, unsupported type, ...).

    The message names the path of the value inside the object, e.g.
    ``$.samples[0].extras['ids']``.
    """


class DecodeError(RlwireError, ValueError):
    """Received data is well-formed but does not match the requested type."""


class CorruptFrameError(DecodeError):
    """Received data is truncated, garbled or internally inconsistent."""


class UnsupportedVersionError(CorruptFrameError):
    """Received data uses a wire-format major version this reader does not know."""


class FrameTooLargeError(DecodeError):
    """Received data is larger than a configured limit: a message that would decompress
    to more than ``max_decompressed_bytes``, or a JSON line longer than
    ``max_line_bytes``. Nothing beyond the limit is allocated."""


class StepOrderError(RlwireError, ValueError):
    """A step goes backwards, repeats, or skips ahead of the next expected step."""


class StepGapError(StepOrderError):
    """A receiver was handed a message out of sequence: one or more messages between the
    last one it received and this one were lost (a sender restarted, a peer reconnected).
    The message names the expected and the received step and sequence numbers. Going on
    is a deliberate choice, never silent: the next receive returns the message that
    revealed the gap."""


class StepExistsError(RlwireError, FileExistsError):
    """A step already exists at the destination, for example from an earlier run.

    Open the sender with ``on_existing="resume"``, ``"truncate"`` (with
    ``start_step``) or ``"overwrite"`` to say what should happen to earlier steps; the
    message says which applies.
    """


class StaleManifestError(RlwireError, LookupError):
    """A :class:`~rlwire.Manifest` no longer names a stored message: the message it was
    made from was deleted (retention, a rewrite) or written again under the same name
    (another message id), or it is of another store than the receiver reading through it.
    Make a new manifest of what is stored now."""


class TransportError(RlwireError, OSError):
    """A destination cannot be written or a source cannot be read (permissions, disk
    full, ...). Nothing half-written is left visible."""


class PluginError(RlwireError, RuntimeError):
    """A plugin (a sink, source or staged step of a class outside rlwire, or a codec
    registered by another package) failed in a way its contract does not allow: it
    raised something other than an rlwire error, or returned what its call does not
    return (say, a ``stage`` that returns a str). The message names the plugin (its
    class, its URL scheme or codec name), the call and, where known, the step; the
    plugin's own exception is its ``__cause__``. An ``OSError`` it raises becomes a
    :class:`TransportError` saying the same, errno kept. What the failed call staged is
    discarded as after any failed send; a commit that failed so leaves the step's
    visibility unknown (the sender refuses to go on until reopened with
    ``on_existing="resume"``).

    Example:
        >>> import rlwire
        >>> issubclass(rlwire.PluginError, RuntimeError)
        True
    """


class ClosedError(RlwireError, RuntimeError):
    """A sender, receiver or step writer cannot be used any more: it was closed (or its
    stream finished, or its step sealed); another sender opened the destination after
    it (fenced off: stop this producer); a ``finish()`` cancelled or failed part way
    waits to be called again; or (a sync sender) it was opened in the process that forked
    this one."""


class ReceiveTimeout(RlwireError, TimeoutError):
    """No message arrived before the timeout."""


class EndOfStream(RlwireError):
    """The sender finished the stream (``await sender.finish()``): no step at or after
    the end will come. ``receive`` and ``areceive`` raise it; ``for`` and ``async for``
    over a receiver simply end."""

    @classmethod
    def at(cls, end: int, *, where: object) -> EndOfStream:
        """The error for a stream whose end step is ``end`` (its first step never sent).

        Example:
            >>> str(EndOfStream.at(3, where="/run"))
            '/run: the sender finished the stream: step 2 was its last'
        """
        last = f"step {end - 1} was its last" if end else "it sent no step"
        return cls(f"the sender finished the stream: {last}", where=where)


def transport_error(exc: BaseException, action: str, *, where: object) -> TransportError:
    """The :class:`TransportError` for ``exc`` (an OSError, or what botocore, aiohttp or
    ZeroMQ raise), saying what could not be done where; it keeps ``exc``'s errno.

    Raise it ``from exc`` so the original stays attached.

    Example:
        >>> err = transport_error(OSError(28, "No space left on device"), "write", where="/p")
        >>> str(err), err.errno
        ('/p: cannot write: No space left on device', 28)
    """
    errno = getattr(exc, "errno", None)
    if isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    else:
        detail = str(exc)
        reason = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    err = TransportError(f"cannot {action}: {reason}", where=where)
    if isinstance(errno, int):
        err.errno = errno
    return err


class MarkSkippedWarning(RuntimeWarning):
    """A receiver could not record what its rank consumed (a read-only directory, a full
    disk): it goes on reading, but a sender's ``keep_last`` and ``max_ahead`` do not see
    it move on. Warned once per receiver.

    Example:
        >>> import rlwire
        >>> issubclass(rlwire.MarkSkippedWarning, RuntimeWarning)  # filter it to refuse
        True
    """


class SidecarWarning(UserWarning):
    """A name given to ``sidecar=`` matched no field or key of a message sent, where a
    dict's keys (which may vary by step) could still hold it in a later one: a misspelt
    name would send those values in the main message. Warned once per sender and name;
    a name no message of the types sent can hold is a :class:`ConfigError` instead.

    Example:
        >>> import rlwire
        >>> issubclass(rlwire.SidecarWarning, UserWarning)  # filter it to refuse
        True
    """


def _named_in(fact: str, where: str) -> bool:
    """True if ``where`` already says ``fact`` (e.g. "step 3" in "…/step-00000003…")."""
    name, value = fact.split(" ")
    return re.search(rf"{name}[- ]0*{value}(?!\d)", where) is not None


#: Every error class defined here, and the helper above.
__all__ = sorted(
    [name for name, obj in list(globals().items()) if isinstance(obj, type)] + ["transport_error"]
)
