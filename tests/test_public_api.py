"""The public surface: what `import rlwire` offers, and that every module says what it exports."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import rlwire

MODULES = sorted(name for _, name, _ in pkgutil.walk_packages(rlwire.__path__, prefix="rlwire."))


#: Modules that only re-export: every public name they hold is listed in __all__, and
#: nothing else is (as anyio checks its own face).
FACES = [
    "rlwire",
    "rlwire.abc",
    "rlwire.aio",
    "rlwire.codecs",
    "rlwire.transport",
    "rlwire.transport.layout",
]


def export_problems(module: types.ModuleType, *, face: bool) -> list[str]:
    """What is wrong with ``module.__all__``: a missing or repeated name, a public class or
    function the module defines without exporting it, and for a face, any public name
    that is not exported (imports included) or exported but absent."""
    exported = getattr(module, "__all__", None)
    if not isinstance(exported, list):
        return ["no __all__ list"]
    problems = [f"__all__ names missing {n}" for n in exported if not hasattr(module, n)]
    if len(exported) != len(set(exported)):
        problems.append("__all__ repeats a name")
    public = {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"  # from __future__ import annotations
    }
    if face:
        unlisted = set(public) - set(exported)
    else:
        unlisted = {
            name
            for name, value in public.items()
            if isinstance(value, type | types.FunctionType)
            and value.__module__ == module.__name__
            and name not in exported
        }
    problems += [f"{name} is public but not in __all__" for name in sorted(unlisted)]
    return problems


@pytest.mark.parametrize("module", MODULES)
def test_every_module_exports_exactly_what_it_says(module: str) -> None:
    assert export_problems(importlib.import_module(module), face=module in FACES) == []


@pytest.mark.parametrize(
    ("source", "face", "expected"),
    [
        ("def f(): pass\n__all__ = []", False, "f is public but not in __all__"),
        ("from os import sep\n__all__ = []", True, "sep is public but not in __all__"),
        ("__all__ = ['gone']", False, "__all__ names missing gone"),
        ("def f(): pass\n__all__ = ['f', 'f']", False, "__all__ repeats a name"),
        ("def f(): pass", False, "no __all__ list"),
    ],
)
def test_the_export_check_finds_a_planted_violation(source: str, face: bool, expected: str) -> None:
    module = types.ModuleType("planted")
    exec(compile(source, "planted", "exec"), vars(module))
    for value in vars(module).values():
        if isinstance(value, types.FunctionType):
            value.__module__ = "planted"
    assert expected in export_problems(module, face=face)


def test_errors_form_one_hierarchy() -> None:
    errors = [getattr(rlwire, n) for n in rlwire.__all__ if n.endswith(("Error", "Timeout"))]
    assert len(errors) >= 10
    for error in errors:
        assert issubclass(error, rlwire.RlwireError), error


#: Package -> the packages it must never import. Codecs and transport meet only in the
#: sender and receiver; the Frame, errors, slicing, copying and compression sit below both.
FORBIDDEN = {
    "codecs": ("rlwire.transport",),
    "transport": ("rlwire.codecs",),
    "frame": ("rlwire.codecs", "rlwire.transport"),
    "errors": ("rlwire.codecs", "rlwire.transport"),
    "_slicing": ("rlwire.codecs", "rlwire.transport"),
    "_copying": ("rlwire.codecs", "rlwire.transport"),
    "compression": ("rlwire.codecs", "rlwire.transport"),
}


def imported_modules(path: Path, root: Path) -> Iterator[str]:
    """Every module ``path`` imports, relative imports resolved against its package
    (``from .. import transport`` in rlwire/codecs/x.py is ``rlwire.transport``)."""
    package = ["rlwire", *path.relative_to(root).parts[:-1]]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            yield module
            # ``from .. import transport`` imports a module by its attribute name.
            yield from (f"{module}.{alias.name}" for alias in node.names)


def layering_violations(root: Path) -> list[str]:
    """``"file imports module"`` for every import that crosses a forbidden arrow."""
    found = []
    for path in sorted(root.rglob("*.py")):
        top = path.relative_to(root).parts[0].removesuffix(".py")
        for module in imported_modules(path, root):
            for banned in FORBIDDEN.get(top, ()):
                if module == banned or module.startswith(banned + "."):
                    found.append(f"{path.relative_to(root)} imports {module}")
    return found


def test_layering_codecs_and_transport_never_import_each_other() -> None:
    assert layering_violations(Path(rlwire.__file__).parent) == []


@pytest.mark.parametrize(
    ("file", "line"),
    [
        ("codecs/deep/x.py", "from ...transport import Sink"),
        ("codecs/x.py", "from .. import transport"),
        ("codecs/x.py", "from ..transport._base import Sink"),
        ("codecs/x.py", "import rlwire.transport._file.sink"),
        ("transport/zmq/x.py", "from ...codecs import json"),
        ("transport/__init__.py", "from ..codecs.msgpack import MsgpackCodec"),
        ("frame.py", "from .transport import layout"),
    ],
)
def test_the_layering_check_finds_a_planted_violation(tmp_path: Path, file: str, line: str) -> None:
    planted = tmp_path / file
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text(f"{line}\n")
    assert len(layering_violations(tmp_path)) >= 1
    planted.write_text("from . import sibling\nfrom ..frame import Frame\n")
    assert layering_violations(tmp_path) == []


def pickle_uses(root: Path) -> list[str]:
    """Files under ``root`` that import pickle or cloudpickle, or call a pickle-based loader."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for module in imported_modules(path, root):
            if module.split(".")[0] in ("pickle", "cloudpickle", "dill", "_pickle"):
                found.append(f"{path.relative_to(root)} imports {module}")
        if "allow_pickle=True" in path.read_text():
            found.append(f"{path.relative_to(root)} lets numpy unpickle")
    return found


def test_no_pickle_anywhere() -> None:
    assert pickle_uses(Path(rlwire.__file__).parent) == []


@pytest.mark.parametrize(
    "line",
    [
        "import pickle",
        "from pickle import loads",
        "import cloudpickle as cp",
        "np.load(f, allow_pickle=True)",
    ],
)
def test_the_pickle_check_finds_a_planted_use(tmp_path: Path, line: str) -> None:
    (tmp_path / "codecs").mkdir()
    (tmp_path / "codecs" / "x.py").write_text(f"{line}\n")
    assert pickle_uses(tmp_path) != []


def test_console_script_is_declared() -> None:
    from importlib.metadata import entry_points

    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "rlwire"]
    assert script.load() is rlwire._api.cli.main


def test_frame_checks_sidecar_indices() -> None:
    frame = rlwire.Frame(b"h", (memoryview(b"ab"), memoryview(b"c")), frozenset({1}))
    assert frame.nbytes == 4
    with pytest.raises(ValueError, match=r"sidecar indices \[2\] out of range for 2 buffers"):
        rlwire.Frame(b"h", (memoryview(b"ab"), memoryview(b"c")), frozenset({2}))
