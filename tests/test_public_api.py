"""The public surface: what `import rlwire` offers, and that every module says what it exports."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import rlwire

MODULES = sorted(name for _, name, _ in pkgutil.walk_packages(rlwire.__path__, prefix="rlwire."))


def test_top_level_names_exist_and_are_listed() -> None:
    for name in rlwire.__all__:
        assert hasattr(rlwire, name), name
    public = {n for n in vars(rlwire) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(rlwire, n)).__name__ == "module"}
    assert public - modules == set(rlwire.__all__)


@pytest.mark.parametrize("module", MODULES)
def test_every_module_declares_all(module: str) -> None:
    mod = importlib.import_module(module)
    assert isinstance(getattr(mod, "__all__", None), list), f"{module} has no __all__"
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.__all__ names missing {name}"


def test_errors_form_one_hierarchy() -> None:
    errors = [getattr(rlwire, n) for n in rlwire.__all__ if n.endswith(("Error", "Timeout"))]
    assert len(errors) >= 10
    for error in errors:
        assert issubclass(error, rlwire.RlwireError), error


def test_layering_codecs_and_transport_never_import_each_other() -> None:
    import ast
    from pathlib import Path

    root = Path(rlwire.__file__).parent
    for package, forbidden in (("codecs", "transport"), ("transport", "codecs")):
        for path in (root / package).glob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert forbidden not in node.module.split("."), (
                        f"{path.name} imports {forbidden}"
                    )
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        assert forbidden not in alias.name.split("."), path.name


def test_no_pickle_anywhere() -> None:
    from pathlib import Path

    root = Path(rlwire.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "import pickle" not in text and "cloudpickle" not in text, path


def test_console_script_is_declared() -> None:
    from importlib.metadata import entry_points

    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "rlwire"]
    assert script.load() is rlwire.cli.main


def test_frame_checks_sidecar_indices() -> None:
    frame = rlwire.Frame(b"h", (memoryview(b"ab"), memoryview(b"c")), frozenset({1}))
    assert frame.nbytes == 4
    with pytest.raises(ValueError, match=r"sidecar indices \[2\] out of range for 2 buffers"):
        rlwire.Frame(b"h", (memoryview(b"ab"), memoryview(b"c")), frozenset({2}))
