"""JSON-lines files on orjson: one JSON document per line, for rollouts, logs and datasets.

:func:`dump_jsonl` writes records and :func:`load_jsonl` reads them back; the async
:func:`adump_jsonl` and :func:`aload_jsonl` do the same work in worker threads, in slices
short enough that the event loop stays responsive. Files are streamed a run of lines at
a time, never held in memory whole, and a file written to a path appears whole or not at
all. Records follow the value rules of the JSON codec (docs/json.md): numpy arrays become
lists, NaN and Inf become ``null``. It needs orjson (``rlwire[json]``): without it,
importing this module raises ConfigError naming the extra.

Example:
    >>> import numpy as np, pathlib, tempfile
    >>> from rlwire.codecs.jsonl import dump_jsonl, load_jsonl
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "rollouts.jsonl"
    >>> dump_jsonl([{"step": 1, "ids": np.arange(3)}, {"step": 2, "r": float("nan")}], path)
    2
    >>> list(load_jsonl(path))
    [{'step': 1, 'ids': [0, 1, 2]}, {'step': 2, 'r': None}]
"""

from rlwire._core.faces import claim

try:
    from rlwire.codecs._json.files import JsonlDestination, JsonlSource
    from rlwire.codecs._json.jsonl import (
        DEFAULT_MAX_LINE_BYTES,
        adump_jsonl,
        aload_jsonl,
        dump_jsonl,
        load_jsonl,
    )
except ModuleNotFoundError as exc:
    if exc.name != "orjson":
        raise
    from rlwire._core.errors import ConfigError

    raise ConfigError("rlwire.codecs.jsonl needs orjson: pip install 'rlwire[json]'") from None

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "JsonlDestination",
    "JsonlSource",
    "adump_jsonl",
    "aload_jsonl",
    "dump_jsonl",
    "load_jsonl",
]

claim(__name__, globals(), __all__)
