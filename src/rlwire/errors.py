"""The one exception hierarchy of rlwire.

Every error rlwire raises on purpose is an :class:`RlwireError`. Each subclass also
derives from the closest built-in exception, so code that already catches ``ValueError``
or ``OSError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "ClosedError",
    "ConfigError",
    "CorruptFrameError",
    "DecodeError",
    "EncodeError",
    "FrameTooLargeError",
    "ReceiveTimeout",
    "RlwireError",
    "SchemaError",
    "StepExistsError",
    "StepGapError",
    "StepOrderError",
    "TransportError",
    "UnsupportedVersionError",
]


class RlwireError(Exception):
    """Base class of every error rlwire raises on purpose."""


class ConfigError(RlwireError, ValueError):
    """An option, URL or argument given to rlwire is not valid."""


class SchemaError(RlwireError, ValueError):
    """An object fails validation before it is sent (e.g. NaN logprobs).

    The message names the sample index and the field, e.g.
    ``$.samples[3].logprobs: 2 non-finite values (NaN or Inf; first at token 17); ...``.
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

    Open the sender with ``on_existing="overwrite"`` or ``on_existing="resume"``
    to say what should happen to earlier steps.
    """


class TransportError(RlwireError, OSError):
    """A destination cannot be written or a source cannot be read (permissions, disk
    full, ...). Nothing half-written is left visible."""


class ClosedError(RlwireError, RuntimeError):
    """The sender or receiver was used after it was closed."""


class ReceiveTimeout(RlwireError, TimeoutError):
    """No message arrived before the timeout."""
