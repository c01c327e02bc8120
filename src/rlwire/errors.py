"""The errors rlwire raises: one hierarchy under :class:`RlwireError`.

Every class here is also importable from :mod:`rlwire` itself (``rlwire.DecodeError``);
each reports this module as where it lives, as tracebacks show. Each one but
:class:`EndOfStream` (which reports no failure) derives from the closest built-in
exception too, so code that already catches ``ValueError`` or ``OSError`` keeps working.
Two warnings live here too: :class:`MarkSkippedWarning`, when a receiver reads on
without recording what it consumed, and :class:`SidecarWarning`, when a name given to
``sidecar=`` matched nothing in a message sent.

Example:
    >>> import rlwire.errors
    >>> issubclass(rlwire.errors.DecodeError, ValueError)
    True
"""

from rlwire._core.errors import (
    ClosedError,
    ConfigError,
    CorruptFrameError,
    DecodeError,
    EncodeError,
    EndOfStream,
    FieldNotFoundError,
    FrameTooLargeError,
    MarkSkippedWarning,
    PluginError,
    ReceiveTimeout,
    RlwireError,
    SchemaError,
    SidecarWarning,
    StaleManifestError,
    StepExistsError,
    StepGapError,
    StepOrderError,
    TransportError,
    UnsupportedVersionError,
)
from rlwire._core.faces import claim, names_on_demand

__all__ = [
    "ClosedError",
    "ConfigError",
    "CorruptFrameError",
    "DecodeError",
    "EncodeError",
    "EndOfStream",
    "FieldNotFoundError",
    "FrameTooLargeError",
    "MarkSkippedWarning",
    "PluginError",
    "ReceiveTimeout",
    "RlwireError",
    "SchemaError",
    "SidecarWarning",
    "StaleManifestError",
    "StepExistsError",
    "StepGapError",
    "StepOrderError",
    "TransportError",
    "UnsupportedVersionError",
]

claim(__name__, globals(), __all__)

# In earlier versions this module also held a helper for sink authors.
__getattr__ = names_on_demand(
    __name__, moved={"transport_error": "rlwire.transport:transport_error"}
)
