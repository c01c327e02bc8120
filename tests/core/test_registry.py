"""The one plugin registry behind codecs and sinks."""

from __future__ import annotations

import pytest

from rlwire import ConfigError
from rlwire._core.registry import Registry


def make(**kwargs: object) -> Registry:
    return Registry(
        "rlwire.test-nothing-registers-here",
        label="thing {name!r}",
        unknown="unknown thing {name!r}; known: {available}",
        **kwargs,  # type: ignore[arg-type]
    )


def test_builtin_entries_load_lazily_and_once() -> None:
    reg = make(builtin={"path": "os:path", "gone": "no_such_module:x"})
    assert reg.names() == ["gone", "path"]
    assert "path" in reg and "other" not in reg and 3 not in reg
    first = reg.load("path")
    assert reg.load("path") is first
    with pytest.raises(ConfigError, match=r"unknown thing 'other'; known: gone, path"):
        reg.load("other")


def test_failures_name_the_entry_and_the_install_hint() -> None:
    reg = make(
        builtin={"gone": "no_such_module:x", "attr": "os:no_such_attr", "bad": "os:sep"},
        hints={"gone": "pip install 'rlwire[gone]'"},
        accepts=callable,
        expected="callable",
    )
    with pytest.raises(
        ConfigError,
        match=r"thing 'gone' \(no_such_module:x\) cannot be loaded: .*"
        r"\(pip install 'rlwire\[gone\]'\)",
    ):
        reg.load("gone")
    with pytest.raises(ConfigError, match=r"thing 'attr': os:no_such_attr does not exist"):
        reg.load("attr")
    with pytest.raises(ConfigError, match=r"thing 'bad': os:sep is not callable"):
        reg.load("bad")


def test_register_objects_and_strings() -> None:
    reg = make(builtin={"path": "os:path"}, accepts=callable, expected="callable")
    reg.register("len", len)
    reg.register("len", len)  # the same target: not a conflict
    assert reg.load("len") is len
    with pytest.raises(ConfigError, match=r"thing 'path' is already registered \('os:path'\)"):
        reg.register("path", "os:sep")
    reg.register("path", "builtins:abs", clobber=True)
    assert reg.load("path") is abs
    with pytest.raises(ConfigError, match="thing 'x': 42 is not callable"):
        reg.register("x", 42)
    with pytest.raises(ConfigError, match="a name must be a non-empty str"):
        reg.register("", len)
