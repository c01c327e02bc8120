"""The public surface: what `import rlwire` offers, and that every module says what it exports."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import rlwire

MODULES = sorted(name for _, name, _ in pkgutil.walk_packages(rlwire.__path__, prefix="rlwire."))


#: Modules that only re-export: every public name they hold is listed in __all__, and
#: nothing else is (as anyio checks its own face).
FACES = [name for name in MODULES if not any(p.startswith("_") for p in name.split("."))]


def export_problems(module: types.ModuleType, *, face: bool) -> list[str]:
    """What is wrong with ``module.__all__``: a missing or repeated name, a public class or
    function the module defines without exporting it, and for a face, any public name
    that is not exported (imports included) or exported but absent."""
    exported = getattr(module, "__all__", None)
    if exported is None and not any(
        isinstance(v, type | types.FunctionType) and v.__module__ == module.__name__
        for v in vars(module).values()
    ):
        return []  # an empty package, such as a private room's __init__
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
        and getattr(value, "__module__", None) != "rlwire._core.faces"  # how faces own names
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


def only_pickle_buffer(path: Path) -> bool:
    """Whether ``path`` takes nothing from pickle but ``PickleBuffer`` (``from pickle
    import PickleBuffer``): a wrapper that hands a buffer out of band, as ray:// gives
    Ray its frame bytes; it serializes nothing."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(
            alias.name.split(".")[0] == "pickle" for alias in node.names
        ):
            return False
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "pickle"
            and any(alias.name != "PickleBuffer" for alias in node.names)
        ):
            return False
    return True


def pickle_uses(root: Path) -> list[str]:
    """Files under ``root`` that import pickle or cloudpickle, or call a pickle-based loader;
    ``from pickle import PickleBuffer`` alone is no use of pickle."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for module in imported_modules(path, root):
            if module in ("pickle", "pickle.PickleBuffer") and only_pickle_buffer(path):
                continue
            if module.split(".")[0] in ("pickle", "cloudpickle", "dill", "_pickle"):
                found.append(f"{path.relative_to(root)} imports {module}")
        if "allow_pickle=True" in path.read_text():
            found.append(f"{path.relative_to(root)} lets numpy unpickle")
    return found


def test_no_pickle_anywhere() -> None:
    assert pickle_uses(Path(rlwire.__file__).parent) == []


def test_pickle_buffer_alone_is_no_use_of_pickle(tmp_path: Path) -> None:
    (tmp_path / "transport").mkdir()
    (tmp_path / "transport" / "x.py").write_text("from pickle import PickleBuffer\n")
    assert pickle_uses(tmp_path) == []


@pytest.mark.parametrize(
    "line",
    [
        "import pickle",
        "from pickle import loads",
        "from pickle import PickleBuffer, loads",
        "from pickle import PickleBuffer\nimport pickle",
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
    from rlwire._api import cli

    assert script.load() is cli.main


def test_frame_checks_sidecar_indices() -> None:
    frame = rlwire.Frame(b"h", (memoryview(b"ab"), memoryview(b"c")), frozenset({1}))
    assert frame.nbytes == 4
    with pytest.raises(ValueError, match=r"sidecar indices \[2\] out of range for 2 buffers"):
        rlwire.Frame(b"h", (memoryview(b"ab"), memoryview(b"c")), frozenset({2}))


def test_plugin_authors_get_pieces_from_the_abc_face() -> None:
    import rlwire.abc

    assert rlwire.abc.__all__ == [
        "URL",
        "Codec",
        "OnExisting",
        "PartInfo",
        "PendingFrame",
        "Pieces",
        "Seal",
        "Sink",
        "SinkOptions",
        "SliceTimer",
        "Sliced",
        "Source",
        "SourceOptions",
        "Staged",
    ]
    pieces = rlwire.abc.Pieces([memoryview(b"ab"), memoryview(b"c")])
    assert rlwire.abc.Pieces.__module__ == "rlwire.abc"
    frame = rlwire.Frame(b"h", (pieces, memoryview(b"d")))
    assert frame.nbytes == 5
    assert rlwire.abc.Sink.gathers is False


def test_the_names_of_steps_filled_part_by_part_report_their_faces() -> None:
    import rlwire.abc

    for name in ("Part", "StepWriter", "SyncStepWriter"):
        assert name in rlwire.__all__
        assert getattr(rlwire, name).__module__ == "rlwire"
    assert rlwire.abc.PartInfo.__module__ == rlwire.abc.Seal.__module__ == "rlwire.abc"
    assert rlwire.abc.Sink.stores_parts is False and rlwire.abc.Source.stores_parts is False


def test_manifests_report_their_faces() -> None:
    for name in ("Manifest", "ManifestColumn", "StaleManifestError"):
        assert name in rlwire.__all__
        assert getattr(rlwire, name).__module__ == (
            "rlwire.errors" if name.endswith("Error") else "rlwire"
        )
    assert issubclass(rlwire.StaleManifestError, rlwire.RlwireError)


@pytest.mark.parametrize(
    ("old", "name", "face"),
    [
        ("rlwire.sender", "open_sender", "rlwire"),
        ("rlwire.receiver", "TrainingBatchReceiver", "rlwire"),
        ("rlwire.schema", "TrainingBatch", "rlwire"),
        ("rlwire.stats", "SendStats", "rlwire"),
        ("rlwire.frame", "Frame", "rlwire"),
        ("rlwire.checks", "Checks", "rlwire"),
        ("rlwire.compression", "Compressor", "rlwire"),
        ("rlwire.codecs.msgpack", "MsgpackCodec", "rlwire.codecs"),
        ("rlwire.codecs.json", "JsonCodec", "rlwire.codecs"),
        ("rlwire.transport.filesystem", "FileSink", "rlwire.transport"),
    ],
)
def test_old_module_paths_still_import_with_a_deprecation_warning(
    old: str, name: str, face: str
) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)} is deprecated.*{face}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(face), name)
    assert module.__name__ == old  # its own module object: the new one keeps its spec


def test_the_old_cli_module_points_at_the_command_not_a_face() -> None:
    # rlwire.cli held only the command's entry point, which no face exports.
    sys.modules.pop("rlwire.cli", None)
    with pytest.warns(DeprecationWarning, match=r"rlwire\.cli is deprecated") as caught:
        module = importlib.import_module("rlwire.cli")
    (warning,) = [w for w in caught if "rlwire.cli" in str(w.message)]
    assert "import from" not in str(warning.message)
    assert "the `rlwire` command" in str(warning.message)
    assert callable(module.main)


@pytest.mark.parametrize(
    ("face", "name", "home"),
    [
        ("rlwire.abc", "run_sliced", "rlwire.aio"),
        ("rlwire.abc", "SLICE_SECONDS", "rlwire.aio"),
        ("rlwire.abc", "parse_url", "rlwire.transport"),
        ("rlwire.abc", "take_frame", "rlwire.transport"),
        ("rlwire.abc", "transport_error", "rlwire.transport"),
        ("rlwire.errors", "transport_error", "rlwire.transport"),
    ],
)
def test_names_that_moved_between_faces_still_work_with_a_warning(
    face: str, name: str, home: str
) -> None:
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(face)}\.{name} is deprecated"):
        value = getattr(importlib.import_module(face), name)
    assert value is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        getattr(importlib.import_module(face), "nothing_here")  # noqa: B009


def test_an_optional_codec_is_imported_on_first_use_and_owned_by_its_face() -> None:
    import rlwire.codecs

    assert rlwire.codecs.JsonCodec.__module__ == "rlwire.codecs"
