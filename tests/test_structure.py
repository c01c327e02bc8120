"""Guards that keep the house in shape: faces, ranks, privacy, sizes, circles, docstring
references and ruff's complexity rules. Each runs on the real tree and on a tree with a
planted violation, which it must find."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from structure import (
    Tree,
    circles,
    face_problems,
    import_graph,
    long_modules,
    mirrored_privacy_problems,
    rank_problems,
    src_privacy_problems,
    unresolved_references,
)

import rlwire

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
TREE = Tree(SRC)

#: The public modules users import. Each defines nothing: it re-exports and owns names.
FACES = {
    "rlwire",
    "rlwire.abc",
    "rlwire.aio",
    "rlwire.codecs",
    "rlwire.codecs.jsonl",
    "rlwire.errors",
    "rlwire.metrics",
    "rlwire.testing",
    "rlwire.transport",
    "rlwire.transport.fsspec",
    "rlwire.transport.layout",
    "rlwire.transport.ray",
    "rlwire.transport.zmq",
}

#: Modules allowed over 400 lines, and why. Keep it short: split by concept instead.
LONG_MODULES: dict[str, str] = {}


def plant(root: Path, files: dict[str, str], top: str = "rlwire") -> Tree:
    """A tree of a package ``top`` with ``files`` (path -> source) under ``root``."""
    for name, source in files.items():
        path = root / top / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
        for parent in path.relative_to(root).parents:
            init = root / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text("")
    return Tree(root, top=top)


def test_the_package_root_holds_at_most_twelve_entries() -> None:
    entries = {p.name for p in (SRC / "rlwire").iterdir() if p.name != "__pycache__"}
    assert len(entries - {"__init__.py"}) <= 12, sorted(entries)


def test_only_faces_are_public_and_faces_define_nothing() -> None:
    assert set(TREE.faces()) == FACES
    assert face_problems(TREE, FACES) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"helpers.py": "x = 1\n"}, "rlwire.helpers is public but not a face"),
        ({"__init__.py": "def open_sender(): pass\n"}, "rlwire defines open_sender"),
        ({"__init__.py": "class Frame: pass\n"}, "rlwire defines Frame"),
        ({"__init__.py": "LIMIT = 3\n"}, "rlwire defines LIMIT"),
    ],
)
def test_the_face_check_finds_a_planted_violation(
    tmp_path: Path, files: dict[str, str], expected: str
) -> None:
    tree = plant(tmp_path, {"_core/x.py": "", **files})
    assert expected in face_problems(tree, {"rlwire"})


def test_every_exported_name_reports_its_face_as_module() -> None:
    wrong = []
    for face in sorted(FACES):
        module = __import__(face, fromlist=["__all__"])
        for name in module.__all__:
            owner = getattr(getattr(module, name), "__module__", None)
            if isinstance(owner, str) and owner.startswith("rlwire") and owner not in FACES:
                wrong.append(f"{face}.{name}.__module__ == {owner!r}")
    assert wrong == []
    assert rlwire.LagMonitor.__module__ == "rlwire.aio"  # its home face, not the first import
    assert rlwire.Frame.__module__ == "rlwire"


def test_a_claimed_struct_keeps_its_annotations_resolvable() -> None:
    # Claiming moves __module__, and msgspec and typing evaluate string annotations in
    # that module's namespace: claim resolves them first, in the defining module.
    import typing

    import msgspec

    info = msgspec.inspect.type_info(rlwire.TrainingBatch)
    assert isinstance(info, msgspec.inspect.StructType)
    assert typing.get_type_hints(rlwire.SendStats)


def test_imports_follow_the_ranks() -> None:
    assert rank_problems(TREE) == []


@pytest.mark.parametrize(
    ("file", "line"),
    [
        ("codecs/_msgpack/x.py", "from rlwire.transport._base import Sink"),
        ("codecs/_x.py", "import rlwire.transport._file.sink"),
        ("transport/zmq/_x.py", "from rlwire.codecs._registry import Codec"),
        ("_frame/x.py", "from rlwire._api.sender import open_sender"),
        ("_core/x.py", "from rlwire._frame.frame import Frame"),
        ("_api/x.py", "from rlwire import Frame"),  # a private module importing a face
        ("_core/x.py", "if TYPE_CHECKING:\n    from rlwire._checks.plan import Plan"),
        ("_checks/x.py", "def f():\n    from rlwire.codecs._registry import Codec"),
    ],
)
def test_the_rank_check_finds_a_planted_violation(tmp_path: Path, file: str, line: str) -> None:
    targets = ["transport/_base.py", "transport/_file/sink.py", "codecs/_registry.py"]
    targets += ["_frame/frame.py", "_api/sender.py", "_checks/plan.py"]
    tree = plant(tmp_path, {**dict.fromkeys(targets, ""), file: line + "\n"})
    assert len(rank_problems(tree)) == 1, rank_problems(tree)


def test_nothing_reaches_into_another_packages_privates() -> None:
    assert src_privacy_problems(TREE) == []
    assert mirrored_privacy_problems(TREE, ROOT / "tests") == []


@pytest.mark.parametrize(
    ("importer", "line", "ok"),
    [
        ("_api/x.py", "from rlwire.transport.zmq._protocol import Head", False),
        ("_api/x.py", "from rlwire.transport._stored.layout import plan", False),
        ("_api/x.py", "from rlwire.transport._base import Sink", True),  # a room's door
        ("_api/x.py", "from rlwire._core.slicing import _helper", False),
        ("transport/fsspec/_x.py", "from rlwire.transport.zmq._sink import ZmqSink", False),
        ("transport/zmq/_x.py", "from rlwire.transport.zmq._sink import ZmqSink", True),
        ("transport/_file/x.py", "from rlwire.transport._stored.layout import _span", False),
        ("transport/_stored/x.py", "from rlwire.transport._stored.layout import _span", True),
        ("codecs/x.py", "from rlwire._core.slicing import SliceTimer", True),
    ],
)
def test_the_privacy_check_finds_a_planted_violation(
    tmp_path: Path, importer: str, line: str, ok: bool
) -> None:
    tree = plant(
        tmp_path,
        {
            importer: line + "\n",
            "transport/zmq/_protocol.py": "",
            "transport/zmq/_sink.py": "",
            "transport/_stored/layout.py": "",
            "transport/_base.py": "",
            "_core/slicing.py": "",
        },
    )
    assert (src_privacy_problems(tree) == []) is ok, src_privacy_problems(tree)


def test_the_privacy_check_of_tests_follows_the_mirrored_folder(tmp_path: Path) -> None:
    tree = plant(tmp_path / "src", {"transport/zmq/_protocol.py": ""})
    tests = tmp_path / "tests"
    (tests / "transport" / "zmq").mkdir(parents=True)
    line = "from rlwire.transport.zmq._protocol import Head\n"
    (tests / "transport" / "zmq" / "test_a.py").write_text(line)
    assert mirrored_privacy_problems(tree, tests) == []
    (tests / "test_b.py").write_text(line)
    assert len(mirrored_privacy_problems(tree, tests)) == 1


def test_no_import_circles_in_src_or_benchmarks() -> None:
    assert circles(import_graph(TREE)) == []
    assert circles(import_graph(Tree(ROOT / "benchmarks", top=""))) == []


def test_the_circle_check_finds_a_planted_circle(tmp_path: Path) -> None:
    tree = plant(
        tmp_path,
        {
            "_core/a.py": "from rlwire._core.b import x\n",
            "_core/b.py": "def f():\n    from rlwire._core import a\n",
        },
    )
    assert circles(import_graph(tree)) == [["rlwire._core.a", "rlwire._core.b"]]


def test_no_module_is_over_400_lines_unless_allowed() -> None:
    assert long_modules(SRC, 400, LONG_MODULES) == []


def test_the_size_check_finds_a_planted_long_module(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text("x = 1\n" * 401)
    assert long_modules(tmp_path, 400, {}) == ["big.py has 401 lines"]
    assert long_modules(tmp_path, 400, {"big.py": "a table"}) == []


def test_every_docstring_reference_resolves() -> None:
    assert unresolved_references(TREE) == []


def test_the_reference_check_finds_a_planted_dangling_reference(tmp_path: Path) -> None:
    source = '''
        """See :class:`~rlwire.transport.Sink`, :func:`len` and :class:`A`."""
        class A:
            """:meth:`go` works, :meth:`gone` does not."""
            def go(self) -> None: ...
    '''
    tree = plant(tmp_path, {"refs.py": source}, top="planted_refs_pkg")
    sys.path.insert(0, str(tmp_path))
    try:
        found = unresolved_references(tree)
    finally:
        sys.path.remove(str(tmp_path))
    assert found == ["planted_refs_pkg.refs: gone", "planted_refs_pkg.refs: rlwire.transport.Sink"]


@pytest.mark.parametrize(
    ("source", "code"),
    [
        (
            "def f(x):\n"
            + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(13))
            + "    return 0\n",
            "C901",
        ),
        ("def f(a, b, c, d, e, f, g, h, i):\n    return a\n", "PLR0913"),
    ],
)
def test_ruff_complexity_rules_are_on(tmp_path: Path, source: str, code: str) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    config = ROOT / "pyproject.toml"
    ruff = [sys.executable, "-m", "ruff", "check", "--config", str(config), str(planted)]
    result = subprocess.run(ruff, capture_output=True, text=True, cwd=tmp_path)
    assert code in result.stdout, result.stdout + result.stderr


#: A claim that a name or behaviour belongs to a version: "since 0.2", "before 0.2",
#: "private since 0.2" (not a size or a time: "before 0.5 s").
_VERSION_CLAIM = re.compile(
    r"\b(?:since|before|until|as of|(?:added|new|removed|renamed|changed) in)\s+"
    r"(?:rlwire\s+|version\s+|v)?(\d+)\.(\d+)(?:\.\d+)?"
    r"(?![\d.]*\s*(?:s|ms|µs|GB|MB|kB|KiB|MiB|GiB|x|%|seconds?)\b)(?![\d-])",
    re.IGNORECASE,
)


def version_claims(paths: list[Path], version: str) -> list[str]:
    """The claims in ``paths`` that name a release of the package after ``version``
    (its major version's: the wire format's versions, 1.x and 2.x, are another count)."""
    major, minor = (int(part) for part in version.split(".")[:2])
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in _VERSION_CLAIM.finditer(line):
                if (int(match[1]), int(match[2])) > (major, minor) and int(match[1]) == major:
                    found.append(f"{path.name}:{number}: {match[0]!r}")
    return found


def test_no_doc_or_module_names_a_release_after_the_package_version() -> None:
    """The package is 0.1.0 and the CHANGELOG's changes are Unreleased: 'since 0.2' and
    'before 0.2' named a release that does not exist (while `rlwire.__version__` says
    0.1.0 to a reader who meets the deprecated name)."""
    paths = [*ROOT.glob("docs/**/*.md"), *SRC.rglob("*.py"), ROOT / "README.md"]
    assert version_claims(paths, rlwire.__version__) == []


def test_the_version_check_finds_a_planted_claim(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "private since 0.2; Before 0.3 it was; wire format 1.6 since 1.6; in 0.2 s;\n"
        "before 0.5 ms; since 0.1; before 0.2-0.4x\n"
    )
    assert version_claims([doc], "0.1.0") == [
        "doc.md:1: 'since 0.2'",
        "doc.md:1: 'Before 0.3'",
    ]
