"""What a ``ray://NAME`` URL and its storage options say, for the sink and the source
alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlwire._core.errors import ConfigError
from rlwire.transport._url import URL

__all__ = ["OPTIONS", "board_options", "parse_name"]

#: The storage options of ray:// destinations, the sender's and the receivers' alike.
OPTIONS = ("namespace", "detached", "pull_timeout")


def parse_name(url: URL) -> str:
    """The NAME of ``ray://NAME``.

    Raises:
        ConfigError: it is empty or holds a ``/``, ``?`` or ``#``.
    """
    name = url.rest
    if not name or any(c in name for c in "/?#") or name.strip() != name:
        raise ConfigError(
            "a ray:// URL is ray://NAME, NAME non-empty without '/', '?', '#' or spaces",
            where=url,
        )
    return name


def board_options(url: URL, options: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The ``namespace`` and ``detached`` storage options, checked.

    Raises:
        ConfigError: either is of the wrong type.
    """
    namespace = options.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise ConfigError(
            f"storage option 'namespace' must be a non-empty str, got {namespace!r}", where=url
        )
    detached = options.get("detached", False)
    if not isinstance(detached, bool):
        raise ConfigError(f"storage option 'detached' must be a bool, got {detached!r}", where=url)
    return namespace, detached
