"""How the public faces (``rlwire``, ``rlwire.abc``, ``rlwire.aio``, ...) own their names.

Implementation lives in private modules; a face re-exports it and calls :func:`claim`, so
``rlwire.Frame.__module__ == "rlwire"``: what users see in reprs, tracebacks and the API
reference is where they import a name from, never a private path. The first face that
re-exports a name claims it, so a face re-exports a name of another face from that face.

Modules that used to be public and are now private stay importable under their old names
through :func:`alias_old_modules`, with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from rlwire._core.errors import ConfigError

__all__ = ["alias_old_modules", "claim", "is_private", "names_on_demand"]


def is_private(module: str) -> bool:
    """Whether a dotted module path has a private part (``rlwire._core.errors``)."""
    return any(part.startswith("_") for part in module.split("."))


def claim(face: str, namespace: Mapping[str, Any], names: Sequence[str]) -> None:
    """Make ``face`` the ``__module__`` of each of ``names`` not yet owned by a face."""
    for name in names:
        obj = namespace[name]
        module = getattr(obj, "__module__", None)
        if isinstance(module, str) and module.startswith("rlwire.") and is_private(module):
            if isinstance(obj, type):
                _resolve_annotations(obj)
            with contextlib.suppress(AttributeError, TypeError):  # a constant has none of its own
                obj.__module__ = face


def _resolve_annotations(cls: type) -> None:
    """Evaluate a class's string annotations in its own module, in place, before its
    ``__module__`` changes: msgspec and ``typing.get_type_hints`` evaluate them in the
    namespace of ``__module__``, which would be the face's by then."""
    annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 (the dict itself)
    namespace = vars(sys.modules[cls.__module__])
    for name, value in annotations.items():
        if isinstance(value, str):
            with contextlib.suppress(NameError):  # a name imported only for type checking
                annotations[name] = eval(value, namespace, dict(vars(cls)))


class _OldModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and hands back the module that now holds its code."""

    def __init__(self, old_to_new: Mapping[str, str], hints: Mapping[str, str]) -> None:
        self.old_to_new = dict(old_to_new)
        self.hints = dict(hints)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.old_to_new:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> None:
        """The default: a new module object, filled by :meth:`exec_module`."""

    def exec_module(self, module: ModuleType) -> None:
        new = self.old_to_new[module.__name__]
        hint = self.hints.get(module.__name__) or f"import from {_face_of(new)}"
        warnings.warn(
            f"{module.__name__} is deprecated and private now: {hint}",
            DeprecationWarning,
            stacklevel=4,
        )
        own = {"__name__", "__spec__", "__loader__", "__package__", "__file__", "__cached__"}
        target = importlib.import_module(new)
        module.__dict__.update({k: v for k, v in vars(target).items() if k not in own})


def _face_of(module: str) -> str:
    """``rlwire.transport._file.sink`` -> ``rlwire.transport``: the face above a module."""
    parts = module.split(".")
    return ".".join(parts[: next(i for i, p in enumerate(parts) if p.startswith("_"))])


def alias_old_modules(old_to_new: Mapping[str, str], hints: Mapping[str, str] = {}) -> None:
    """Let ``import OLD`` keep working for each old public module name, with a warning
    that says to import from the face above the new module, or ``hints[OLD]`` instead
    (for a module no face re-exports)."""
    if not any(isinstance(f, _OldModules) for f in sys.meta_path):
        sys.meta_path.append(_OldModules(old_to_new, hints))


def names_on_demand(
    face: str,
    *,
    optional: Mapping[str, str] = {},
    moved: Mapping[str, str] = {},
    extras: Mapping[str, str] = {},
) -> Any:
    """A module ``__getattr__`` for a face's names that are imported only when used.

    ``optional`` maps a name to ``"module:attribute"`` for names that need an optional
    dependency (imported on first use, so importing the face needs none); ``moved`` maps
    names the face no longer exports to where they live now, and using one warns.
    ``extras`` maps an optional dependency (its top module) to rlwire's pip extra: an
    optional name that needs it, used without it, raises ConfigError naming the extra.
    """

    def __getattr__(name: str) -> Any:
        target = optional.get(name) or moved.get(name)
        if target is None:
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        module, _, attribute = target.partition(":")
        if name in moved:
            hint = "private now" if is_private(module) else f"use {module}.{attribute}"
            warnings.warn(f"{face}.{name} is deprecated: {hint}", DeprecationWarning, stacklevel=2)
        try:
            value = getattr(importlib.import_module(module), attribute)
        except ModuleNotFoundError as exc:
            extra = extras.get(exc.name or "")
            if extra is None:
                raise
            why = f"{face}.{name} needs {exc.name}: pip install 'rlwire[{extra}]'"
            raise ConfigError(why) from None
        if name in optional:
            claim(face, {name: value}, [name])
        return value

    return __getattr__
