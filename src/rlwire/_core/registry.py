"""One plugin registry: names to objects, from an entry point group and from ``register``.

Modelled on fsspec's ``registry`` and ``register_implementation``. An entry is a
``"module:attr"`` string (an entry point's value, or rlwire's own table, which serves
rlwire's own names whether its entry points are installed or not: an installed package's
entry point under one of them is ignored, with a warning naming both) imported on first use with
:func:`pkgutil.resolve_name`, or an object registered in process. Every failure is a
:class:`~rlwire.ConfigError` naming the entry and, for an unknown name, what is available.

The entry point group is read again whenever a name is not known yet, so a plugin
installed (or put on ``sys.path``) after the first lookup is found without any cache to
clear; a name once loaded keeps its object until it is registered anew.
"""

from __future__ import annotations

import pkgutil
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint
from typing import Any

from rlwire._core.entry_points import group_entry_points
from rlwire._core.errors import ConfigError

__all__ = ["Registry"]

_warned_lock = threading.Lock()


def _target_of(ep: EntryPoint) -> str:
    """The ``"module:attr"`` an entry point names, without the extras its value may
    list (``mod:attr [extra]``), which :func:`pkgutil.resolve_name` does not take; its
    value as written if it is malformed (the error then shows it)."""
    match = ep.pattern.match(ep.value)
    if match is None:
        return ep.value
    module, attr = match.group("module"), match.group("attr")
    return f"{module}:{attr}" if attr else module


class Registry:
    """Named plugins of one kind (codecs, sinks).

    Args:
        group: the entry point group plugins register in.
        label: how an error names an entry, with ``{name}`` in it, e.g. ``"codec {name!r}"``.
        unknown: the message for an unknown name, with ``{name}`` and ``{available}``.
        builtin: rlwire's own ``{name: "module:attr"}``, used under the entry points.
        hints: an install hint per optional entry, shown when its import fails.
        accepts: a test every loaded object must pass, and ``expected`` says what it wants.
        check_name: what is wrong with a name (None for a good one): ``register``
            refuses such a name, and an entry point under one is ignored (not listed),
            named by the error for an unknown name and by :meth:`refused`.

    Example:
        >>> reg = Registry("example.group", label="thing {name!r}",
        ...                unknown="no thing {name!r}; known: {available}")
        >>> reg.register("path", "os:path")
        >>> reg.load("path").join("a", "b")
        'a/b'
        >>> reg.load("nope")
        Traceback (most recent call last):
        rlwire.errors.ConfigError: no thing 'nope'; known: path
    """

    def __init__(
        self,
        group: str,
        *,
        label: str,
        unknown: str,
        builtin: Mapping[str, str] | None = None,
        hints: Mapping[str, str] | None = None,
        accepts: Callable[[Any], bool] | None = None,
        expected: str = "",
        check_name: Callable[[str], str | None] | None = None,
    ) -> None:
        self.group = group
        self._label = label
        self._unknown = unknown
        self._builtin = dict(builtin or {})
        self._hints = dict(hints or {})
        self._accepts = accepts
        self._expected = expected
        self._check_name = check_name
        # Entry points under a name check_name refuses: name: (package, target, why).
        self._refused: dict[str, tuple[str, str, str]] = {}
        self._registered: dict[str, object] = {}  # objects or "module:attr" strings
        self._entries: dict[str, str] = self._builtin
        # Names that installed packages register with different targets: "pkg (target)".
        self._conflicts: dict[str, list[str]] = {}
        self._scanned = False
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str, str]] = set()  # built-ins' names taken, warned

    def _scan(self) -> dict[str, str]:
        """Read the entry point group again (rlwire's own table under it)."""
        found = dict(self._builtin)
        claims: dict[str, dict[str, str]] = {}  # name: {target: the package claiming it}
        refused: dict[str, tuple[str, str, str]] = {}
        for ep in group_entry_points(self.group):  # a broken package skipped, not fatal
            package = ep.dist.name if ep.dist else "?"
            if ep.name in self._builtin:  # rlwire's own, whatever sys.path holds
                self._shadowing(ep.name, package, _target_of(ep))
                continue
            problem = self._check_name(ep.name) if self._check_name else None
            if problem:  # unreachable: refused when asked for, not in every process
                refused[ep.name] = (package, _target_of(ep), problem)
                continue
            found[ep.name] = target = _target_of(ep)
            claims.setdefault(ep.name, {})[target] = package
        self._refused = refused
        self._conflicts = {
            name: [f"{package} ({target})" for target, package in sorted(by.items())]
            for name, by in claims.items()
            if len(by) > 1
        }
        self._entries, self._scanned = found, True
        return found

    def _shadowing(self, name: str, package: str, target: str) -> None:
        """An installed package's entry point under the name of one of rlwire's own:
        ignored, so that no package installed beside rlwire replaces a built-in (in a
        source tree, without rlwire's entry points, it did, silently; installed, the
        two were refused as a conflict, and with them every plain path). Warns once per
        process, naming both, unless it is rlwire's own entry point."""
        if re.sub(r"[-_.]+", "-", package).lower() == "rlwire" or target == self._builtin[name]:
            return
        key = (name, package, target)
        with _warned_lock:  # not self._lock: register() scans while it holds that
            if key in self._warned:
                return
            self._warned.add(key)
        warnings.warn(
            f"{package} registers {name!r} ({target}) in {self.group}, ignored: "
            f"{self._label.format(name=name)} is rlwire's own ({self._builtin[name]}); "
            "to use the package's in a program, register it there (register_sink or "
            "register_codec, clobber=True)",
            RuntimeWarning,
            stacklevel=4,
        )

    def _target(self, name: str) -> object | None:
        if name in self._registered:
            return self._registered[name]
        entries = self._entries if self._scanned and name in self._entries else self._scan()
        return entries.get(name)

    def names(self) -> list[str]:
        """Every name known now, sorted."""
        return sorted(self._scan().keys() | self._registered.keys())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._target(name) is not None

    def unknown(self, name: object, *, also: str = "") -> ConfigError:
        """The error for a name nothing is registered under, listing the known ones
        (``also`` ends the message)."""
        available = ", ".join(self.names())
        ignored = "".join(
            f"; {package} registers {key!r} ({target}) in {self.group}, ignored: {why}"
            for key, (package, target, why) in sorted(self._refused.items())
        )
        return ConfigError(self._unknown.format(name=name, available=available) + also + ignored)

    def refused(self, name: str) -> str | None:
        """Why an installed package's entry point under ``name`` is ignored, naming the
        package, or None if none is."""
        self._scan()
        if name not in self._refused:
            return None
        package, target, why = self._refused[name]
        return f"{package} registers {name!r} ({target}) in {self.group}, ignored: {why}"

    def register(self, name: str, target: object, *, clobber: bool = False) -> None:
        """Register ``target`` (an object, or ``"module:attr"`` imported on first use)
        under ``name``.

        Raises:
            ConfigError: ``name`` is taken and ``clobber`` is false, or ``target`` is an
                object this registry does not accept.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{self._label.format(name=name)}: a name must be a non-empty str")
        problem = self._check_name(name) if self._check_name else None
        if problem:
            raise ConfigError(f"{self._label.format(name=name)}: {problem}")
        if not isinstance(target, str):
            self._check(name, target, repr(target))
        with self._lock:
            current = self._target(name)
            if current is not None and current != target and not clobber:
                raise ConfigError(
                    f"{self._label.format(name=name)} is already registered ({current!r}); "
                    "pass clobber=True to replace it"
                )
            self._registered[name] = target
            self._loaded.pop(name, None)

    def load(self, name: str) -> Any:
        """The object registered under ``name``, imported on first use.

        Raises:
            ConfigError: unknown name (the message lists the known ones), a name that
                installed packages register with different targets, or its target
                cannot be imported (with an install hint for rlwire's optional parts),
                does not exist, or is not what this registry accepts.
        """
        if name in self._loaded:
            return self._loaded[name]
        target = self._target(name) if isinstance(name, str) else None
        if target is None:
            raise self.unknown(name)
        if name not in self._registered and name in self._conflicts:
            # Which one wins would depend on the order of sys.path: refuse to guess.
            raise ConfigError(
                f"{self._label.format(name=name)} is registered by more than one installed "
                f"package: {', '.join(self._conflicts[name])}; uninstall all but one, or "
                "choose one in process (register_sink or register_codec, clobber=True)"
            )
        obj = self.resolve(name, target)
        self._loaded[name] = obj
        return obj

    def resolve(self, name: str, target: object) -> Any:
        """``target`` itself, or the object the ``"module:attr"`` string names, checked,
        with errors that name the entry as ``name``."""
        if not isinstance(target, str):
            return target
        label = self._label.format(name=name)
        try:
            obj = pkgutil.resolve_name(target)
        except ImportError as exc:
            hint = f" ({self._hints[name]})" if name in self._hints else ""
            raise ConfigError(f"{label} ({target}) cannot be loaded: {exc}{hint}") from exc
        except AttributeError as exc:
            raise ConfigError(f"{label}: {target} does not exist: {exc}") from exc
        except Exception as exc:  # a plugin whose module fails as it is imported
            raise ConfigError(
                f"{label} ({target}) cannot be loaded: {type(exc).__name__}: {exc}"
            ) from exc
        self._check(name, obj, target)
        return obj

    def _check(self, name: str, obj: object, shown: str) -> None:
        if self._accepts is not None and not self._accepts(obj):
            raise ConfigError(f"{self._label.format(name=name)}: {shown} is not {self._expected}")
