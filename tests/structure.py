"""What the guards of tests/test_structure.py read: the modules of a source tree, the
imports of each, the rooms and their ranks. Each check returns a list of problems as
text, empty when the tree keeps the rule, so a test can plant a violation and see it.

The rules (docs/reference/plugins.md and CONTRIBUTING-like notes in CHANGELOG 0.2.0):

* Faces are the public modules; everything else has a private part in its path.
* Rooms, by rank: ``_core`` (0) < ``_frame`` (1) < ``_checks`` (2) < ``codecs`` and
  ``transport`` (3, never each other) < ``_api`` (4) < ``testing`` (5) < the faces (6).
  A module imports only from its own room or lower ranks; a face imports anything.
* A private part of a path is private to the package that holds it; a private package
  at the top (``rlwire._core``) is shared by the whole library, and the private modules
  directly in ``codecs/`` and ``transport/`` are those rooms' doors to the others.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

RANKS = {"_core": 0, "_frame": 1, "_checks": 2, "codecs": 3, "transport": 3, "_api": 4}
TESTING_RANK, FACE_RANK = 5, 6
#: Test folders named without the underscore of the room they mirror.
MIRRORED = {
    "core": "_core",
    "frame": "_frame",
    "checks": "_checks",
    "api": "_api",
    "json": "_json",
    "msgpack": "_msgpack",
    "file": "_file",
    "stored": "_stored",
}


def is_private(dotted: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in dotted.split("."))


@dataclass
class Tree:
    """The modules of one source tree: ``root`` holds the top package (``rlwire/``), or
    with ``top=""`` is a folder of scripts that import each other by bare name."""

    root: Path
    top: str = "rlwire"
    modules: dict[str, Path] = field(default_factory=dict)
    packages: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.top:
            self.modules = {path.stem: path for path in sorted(self.root.glob("*.py"))}
            return
        for path in sorted((self.root / self.top).rglob("*.py")):
            parts = list(path.relative_to(self.root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
                self.packages.add(".".join(parts))
            self.modules[".".join(parts)] = path

    def faces(self) -> list[str]:
        return sorted(name for name in self.modules if not is_private(name))

    def rank(self, module: str) -> int:
        if not is_private(module):
            return FACE_RANK
        parts = module.split(".")
        if len(parts) > 1 and parts[1] == "testing":
            return TESTING_RANK
        return RANKS.get(parts[1], FACE_RANK) if len(parts) > 1 else FACE_RANK

    def room(self, module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else ""

    def imports(self, module: str, path: Path | None = None) -> Iterator[tuple[int, str]]:
        """(line, dotted target) for each import in ``module``, ``TYPE_CHECKING`` blocks
        and function bodies included; ``from m import name`` yields ``m.name``."""
        path = path or self.modules[module]
        package = module if module in self.packages else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, alias.name
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                for alias in node.names:
                    yield node.lineno, f"{target}.{alias.name}" if alias.name != "*" else target

    def module_of(self, target: str) -> str | None:
        """The module a dotted import target names or lies in, if it is in this tree."""
        while target and target not in self.modules:
            target = target.rpartition(".")[0]
        return target or None


def face_problems(tree: Tree, faces: set[str]) -> list[str]:
    """Public modules that are not declared faces, and faces that define something."""
    problems = [f"{m} is public but not a face" for m in tree.faces() if m not in faces]
    allowed = {"__all__", "__version__", "__getattr__"}
    for face in sorted(faces & set(tree.modules)):
        for node in ast.parse(tree.modules[face].read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                problems.append(f"{face} defines {node.name}")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                if names - allowed or len(names) != len(targets):
                    problems.append(f"{face} defines {ast.unparse(targets[0])}")
    return problems


def rank_problems(tree: Tree) -> list[str]:
    """Imports that go up the ranks, across between codecs and transport, or from a
    private module to a face (faces sit on top; they import anything)."""
    problems = []
    for module in tree.modules:
        mine = tree.rank(module)
        if mine == FACE_RANK:
            continue
        for line, target in tree.imports(module):
            used = tree.module_of(target)
            if used is None:
                continue
            theirs = tree.rank(used)
            same_room = tree.room(used) == tree.room(module)
            if theirs == FACE_RANK or (theirs >= mine and not same_room):
                problems.append(f"{module}:{line} imports {target} (rank {theirs} >= {mine})")
    return problems


def owner_of_private(tree: Tree, target: str) -> str | None:
    """The package a private part of ``target`` is private to (the innermost one), or
    None where nothing in it is private to less than the whole library."""
    parts = target.split(".")
    owner = None
    for k in range(2, len(parts)):
        if not parts[k].startswith("_"):
            continue
        holder = ".".join(parts[:k])
        path = ".".join(parts[: k + 1])
        door = k == 2 and holder in (f"{tree.top}.codecs", f"{tree.top}.transport")
        if door and path in tree.modules and path not in tree.packages:
            continue  # transport/_base.py, codecs/_registry.py: a room's doors
        if holder in tree.modules and holder not in tree.packages:
            holder = holder.rpartition(".")[0]  # a module's private name: its package's
        owner = holder
    return owner


def privacy_problems(tree: Tree, importer: str, targets: Iterator[tuple[int, str]]) -> list[str]:
    """Imports by ``importer`` of something private to a package it is not inside."""
    problems = []
    for line, target in targets:
        if not target.startswith(tree.top + "."):
            continue
        owner = owner_of_private(tree, target)
        if owner is not None and not (importer == owner or importer.startswith(owner + ".")):
            problems.append(f"{importer}:{line} reaches into {target} (private to {owner})")
    return problems


def src_privacy_problems(tree: Tree) -> list[str]:
    return [p for m in tree.modules for p in privacy_problems(tree, m, tree.imports(m))]


def mirrored_privacy_problems(tree: Tree, tests: Path) -> list[str]:
    """Each test module is taken to live in the package its folder mirrors
    (tests/transport/zmq/test_x.py in rlwire.transport.zmq)."""
    problems = []
    for path in sorted(tests.rglob("*.py")):
        folders = [MIRRORED.get(p, p) for p in path.relative_to(tests).parts[:-1]]
        importer = ".".join([tree.top, *folders, path.stem])
        problems += privacy_problems(tree, importer, tree.imports(importer, path))
    return problems


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph(tree: Tree) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports (anywhere in its body)."""
    graph: dict[str, set[str]] = {}
    for module in tree.modules:
        used = {tree.module_of(target) for _, target in tree.imports(module)}
        graph[module] = {u for u in used if u is not None and u != module}
    return graph


def long_modules(root: Path, limit: int, allowed: dict[str, str]) -> list[str]:
    """Modules over ``limit`` lines that the allow-list does not name."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > limit and name not in allowed:
            problems.append(f"{name} has {lines} lines")
    return problems


ROLE = re.compile(r":(class|func|meth|attr|data|mod|exc|obj):`([^`]+)`")


def references(tree: Tree) -> Iterator[tuple[str, str | None, str]]:
    """(module, enclosing class, target) for each Sphinx role in a docstring of ``tree``."""
    for module, path in tree.modules.items():
        todo: list[tuple[ast.AST, str | None]] = [(ast.parse(path.read_text()), None)]
        while todo:
            node, cls = todo.pop()
            kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            inner = node.name if isinstance(node, ast.ClassDef) else cls
            if isinstance(node, kinds):
                for _, text in ROLE.findall(ast.get_docstring(node) or ""):
                    target = text.rpartition("<")[2].rstrip(">") if "<" in text else text
                    yield module, inner, target.strip().lstrip("~!").removesuffix("()")
            todo += [(child, inner) for child in ast.iter_child_nodes(node)]


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names an importable module or an attribute of one."""
    parts = dotted.split(".")
    if not all(parts):
        return False
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def unresolved_references(tree: Tree) -> list[str]:
    """Docstring references that name nothing, read as Sphinx reads them: the target as
    written, then within the docstring's class, its module, the top package, builtins."""
    problems = []
    for module, cls, target in references(tree):
        scopes = [f"{module}.{cls}"] if cls else []
        scopes += [module, tree.top, "builtins"]
        if not resolves(target) and not any(resolves(f"{s}.{target}") for s in scopes):
            problems.append(f"{module}: {target}")
    return sorted(set(problems))
