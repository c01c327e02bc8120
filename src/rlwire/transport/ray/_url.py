"""What a ``ray://NAME`` URL and its storage options say, for the sink and the source
alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlwire._core.args import check_positive
from rlwire._core.errors import ConfigError
from rlwire.transport._url import URL

__all__ = [
    "OPTIONS",
    "PULL_TIMEOUT",
    "board_options",
    "handle_options",
    "parse_name",
    "pull_timeout",
]

#: The storage options of ray:// destinations, the sender's and the receivers' alike.
OPTIONS = ("namespace", "detached", "pull_timeout")
#: Seconds the board waits for a producer's actor to hand a rank's objects over.
PULL_TIMEOUT = 120.0


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


def pull_timeout(url: URL, options: Mapping[str, Any]) -> float:
    """The ``pull_timeout`` storage option (default :data:`PULL_TIMEOUT`), checked.

    Raises:
        ConfigError: it is not a number > 0 (NaN, with which every pull gave up at
            once, included).
    """
    try:
        return check_positive(
            options.get("pull_timeout", PULL_TIMEOUT), "storage option 'pull_timeout'"
        )
    except ConfigError as exc:
        raise exc.add_context(where=url) from None


def handle_options(
    url: URL, options: Mapping[str, Any]
) -> tuple[str | None, tuple[int, str] | None]:
    """A receiver's ``board`` and ``commit`` storage options (what a
    :class:`~rlwire.transport.ray.StepHandle` gives), checked.

    Raises:
        ConfigError: either is of the wrong type.
    """
    board = options.get("board")
    if board is not None and (not isinstance(board, str) or not board):
        raise ConfigError(
            f"storage option 'board' must be a non-empty str (a StepHandle's board), got {board!r}",
            where=url,
        )
    commit = options.get("commit")
    if commit is not None and not (
        isinstance(commit, tuple | list)
        and len(commit) == 2
        and type(commit[0]) is int
        and isinstance(commit[1], str)
    ):
        raise ConfigError(
            f"storage option 'commit' must be a StepHandle's (step, token), got {commit!r}",
            where=url,
        )
    return board, None if commit is None else (commit[0], commit[1])
