"""The connection to an fsspec URL, shared by the sink and the source.

The URL is checked when the sink or source is made, without importing fsspec. The
filesystem (and, for S3, a first request checking that the bucket exists) is made on
first use, once, in a worker thread, shared by concurrent first callers; the
:class:`Store` that the sink and source then call is chosen at that moment.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import re
from collections.abc import Mapping
from typing import Any

from anyio import CapacityLimiter

from rlwire._core.errors import ConfigError, transport_error
from rlwire._core.once import Once
from rlwire.transport._options import reject_unknown
from rlwire.transport._stored.fence import FENCE_NAME
from rlwire.transport._stored.names import (
    CONSUMED_PART_RE,
    CONSUMED_RE,
    END_NAME,
    LEFTOVER_RE,
    RANK_FILE_RE,
    REWRITE_NAME,
    SEAL_RE,
)
from rlwire.transport._stored.sink import translate_errors
from rlwire.transport._url import URL, parse_url
from rlwire.transport.fsspec._generic import GenericStore
from rlwire.transport.fsspec._s3 import S3Store
from rlwire.transport.fsspec._s3_commit import OPTION
from rlwire.transport.fsspec._store import Store

__all__ = ["Connection", "translate_errors"]

#: Packages that serve fsspec protocols rlwire names, checked without importing them.
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
#: Protocols with no bucket, whose filesystems also accept any keyword and ignore the
#: ones they do not know (their ``**kwargs`` end in fsspec's base class): rlwire checks
#: those keys itself. Others reject unknown keys on their own (s3fs when it makes its
#: session).
_LOCAL = frozenset({"memory"})
#: The names of the files a destination holds (steps' files, marks, the fence, files
#: being written): a URL whose last name is one names a file, not a destination.
_OWN_NAME = re.compile(
    "|".join(f"(?:{r.pattern})" for r in (RANK_FILE_RE, SEAL_RE, CONSUMED_RE, CONSUMED_PART_RE))
    + f"|(?:{LEFTOVER_RE.pattern})|"
    + "|".join(re.escape(name) for name in (END_NAME, REWRITE_NAME, FENCE_NAME))
)
#: Keys fsspec's base classes take from any filesystem's options.
_FSSPEC_OPTIONS = ("skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths")


class Connection:
    """The store at one fsspec URL: the URL checked now, the filesystem made on first
    use.

    :meth:`get` (or :meth:`aget` from async code) makes the filesystem once, picks the
    :class:`Store` for it (:class:`S3Store` for s3fs, else :class:`GenericStore`) and
    checks that it can be reached. Concurrent first callers share one attempt; a failed
    attempt is replayed to every caller waiting on it, and the next call tries again.

    Args:
        url: ``protocol://path``, as a string or as the registry parsed it.
        storage_options: keyword arguments for the fsspec filesystem (copied, with
            every dict and list in them: later changes by the caller do not count, and
            the filesystem's own changes, such as botocore's to ``config_kwargs``'s
            ``retries``, are not the caller's), but for ``conditional_writes`` (S3
            only), which is rlwire's.

    Raises:
        ConfigError: a malformed URL, one whose last name is one of a destination's
            files (``s3://bucket/run/step-00000003.rank-0001.rlw``), or a protocol whose
            package is not installed.

    Example:
        >>> conn = Connection("memory://doc-connection", None)
        >>> conn.url, type(conn.get()).__name__
        ('memory://doc-connection', 'GenericStore')
    """

    def __init__(self, url: str | URL, storage_options: Mapping[str, Any] | None) -> None:
        protocol, path = _split_url(url)
        #: The URL without a trailing "/", for messages and ``repr``.
        self.url = f"{protocol}://{path.rstrip('/')}"
        #: True for in-memory stores, which cost nothing to poll.
        self.local = protocol in _LOCAL
        given, options = str(url), _copied(dict(storage_options or {}))
        self._once: Once[Store] = Once(lambda: _connect(given, protocol, options))

    @property
    def connected(self) -> bool:
        """True once :meth:`get` has succeeded (it then returns at once)."""
        return self._once.done

    def get(self) -> Store:
        """The store, connecting first if no attempt has succeeded yet (blocking).

        Raises:
            ConfigError: fsspec cannot serve the protocol, the filesystem rejects the
                storage options, or the URL (not ending in ``/``) names an object.
            TransportError: the filesystem cannot be made, or the bucket does not
                exist or cannot be reached.
        """
        return self._once.get()

    async def aget(self, limiter: CapacityLimiter | None = None) -> Store:
        """:meth:`get` in a worker thread (under ``limiter``) that a cancelled caller
        abandons: the attempt carries on for the others. Raises as :meth:`get`."""
        return await self._once.aget(limiter)


def _split_url(given: str | URL) -> tuple[str, str]:
    """``(protocol, path)`` of an fsspec URL, checked without importing fsspec."""
    parsed = parse_url(given) if isinstance(given, str | URL) else None
    if parsed is None or parsed.rest == parsed.text:
        raise ConfigError(f"{given!r}: not an fsspec URL (expected protocol://path)")
    url = parsed.text
    # A host given as an IPv6 literal ([::1]) holds "::" too: it chains nothing.
    if "::" in re.sub(r"\[[0-9A-Fa-f:.%]*\]", "", url):
        raise ConfigError(
            f"{url!r}: chained fsspec URLs (a::b) are not supported; give the target URL "
            "and its storage_options"
        )
    protocol, path = url.partition("://")[0], parsed.rest
    if not re.fullmatch(r"[a-z][a-z0-9+.\-]*", protocol):
        raise ConfigError(f"{url!r}: malformed URL protocol {protocol!r}")
    if protocol not in _LOCAL and not path.strip("/"):
        raise ConfigError(f"{url!r}: names no bucket or directory")
    parent, _, name = path.rstrip("/").rpartition("/")
    if _OWN_NAME.fullmatch(name) and (parent or protocol in _LOCAL):
        raise ConfigError(
            f"{url!r}: names a destination's file ({name}), not a destination: give the "
            f"directory or prefix it is in ({protocol}://{parent}); rlwire inspect "
            "describes a step's file"
        )
    for package in ("fsspec", _PACKAGES.get(protocol)):
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"{url!r}: protocol {protocol!r} needs the {package!r} package "
                "(pip install 'rlwire[fsspec]', 'rlwire[s3]' for s3://, or gcsfs for gs://)"
            )
    return protocol, path


def _connect(url: str, protocol: str, storage_options: Mapping[str, Any]) -> Store:
    """Import the implementation, make the filesystem, choose its store and check it.

    Runs in a worker thread (through :class:`~rlwire._core.once.Once`): importing s3fs and
    the first request take long enough to stall an event loop.
    """
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"{url!r}: fsspec cannot serve protocol {protocol!r}: {exc}") from exc
    given: dict[str, Any] = _copied(dict(storage_options))  # each attempt: s3fs changes them
    conditional = given.pop(OPTION, None)
    if conditional is not None and not isinstance(conditional, bool):
        raise ConfigError(f"{url!r}: storage option {OPTION!r} must be True or False")
    if protocol in _LOCAL:
        reject_unknown(url, given, _named_parameters(cls))
    root = str(cls._strip_protocol(url)).rstrip("/")
    # Options in the URL (e.g. s3's ?versionId) give way to explicit storage options.
    options = {**cls._get_kwargs_from_urls(url), **given}
    try:
        fs = cls(**options)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"{url!r}: {cls.__name__} rejects the storage options: {exc}") from exc
    except Exception as exc:
        raise transport_error(exc, "create the filesystem", where=url) from exc
    store: Store
    if S3Store.serves(fs):
        store = S3Store(fs, url, root)
        store.conditional = conditional is not False
    elif conditional is not None:
        raise ConfigError(f"{url!r}: storage option {OPTION!r} applies to s3:// only")
    else:
        store = GenericStore(fs, url, root)
    store.check()
    if not url.endswith("/") and store.names_an_object():
        raise ConfigError(
            f"{url!r}: names an object, not a directory or prefix: give the prefix the "
            "steps go under (a URL ending in '/' names a prefix even beside an object of "
            "its name)"
        )
    return store


def _copied(value: Any) -> Any:
    """``value`` with every dict and list in it copied, recursively; other objects (a
    session, credentials) are shared. s3fs hands ``config_kwargs`` to botocore, which
    rewrites its ``retries`` dict in place."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


def _named_parameters(cls: type) -> list[str]:
    """Every keyword the ``__init__`` methods of ``cls`` and its bases name."""
    names = set(_FSSPEC_OPTIONS)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        with contextlib.suppress(TypeError, ValueError):  # builtins have no signature
            for param in inspect.signature(init).parameters.values():
                if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                    names.add(param.name)
    names.discard("self")
    return sorted(names)
