"""The docs' python blocks, run against the real library, so that what a reader pastes
works.

The blocks of each page run in order in one namespace, as a reader pastes them into one
program, in a fresh temporary working directory. Top-level ``await`` runs as written, on
an asyncio loop that lives as long as the page (as in ``python -m asyncio``); code
without ``await`` runs in the test's thread. A block that only includes a file
(``--8<-- "examples/x.py"``) is that example, which tests/api/test_processes.py runs.

Hidden comments in the markdown, which mkdocs renders invisibly, carry the rest:

- ``<!-- setup: what the reader's program holds here``, then code, then ``-->``: run
  before the next python block of the page; what the block takes from the reader's own
  program (``url``, ``rollouts()``, a batch, steps already sent). Right above the fence,
  or, for a block indented in a list item, before the list (a comment there ends it).
- ``<!-- check: what it checks``, code, ``-->``, right below a closing fence: run after
  the block, to check what the block's comments or prose say it did.
- ``<!-- not-run: reason -->`` right above a fence: a block deliberately not run (code
  spread over processes or actors), listed as a skipped test with its reason.
- ``<!-- needs: module -->`` right above a fence: skipped where the optional package
  (torch) is not installed.

Setups may call :func:`send_steps`, ``make_batch`` and, on a page that uses S3,
``make_bucket(name)``. Absolute paths in a block (``"/shared/run42"``) are made relative
to the temporary directory (:data:`PATHS`), a host it names is loopback (:data:`HOSTS`)
and an S3 endpoint it names is the session's moto server (:data:`ENDPOINTS`); S3 blocks
that name none reach it through ``AWS_ENDPOINT_URL``, as a reader's environment would.
An expression statement whose comment is a Python literal (``receiver.receive()  #
{'step': 3}``) must give exactly that value, types included.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib.util
import inspect
import io
import re
import sys
import textwrap
import tokenize
import traceback
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from s3_server import s3_client

import rlwire
from rlwire.testing import make_batch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: The pages whose python blocks are run.
PAGES = [
    "index.md",
    "tutorial.md",
    "integrations.md",
    "json.md",
    *sorted(str(p.relative_to(DOCS)) for p in (DOCS / "how-to").glob("*.md")),
]

#: Absolute paths in the docs, and where they go: under the test's working directory.
PATHS = {'"/shared/': '"shared/', '"/data/': '"data/', '"/dev/shm/': '"dev/shm/'}
#: Hosts named in the docs, and the one they are here.
HOSTS = {'"zmq+tcp://orchestrator:': '"zmq+tcp://127.0.0.1:'}
#: S3 endpoints named in the docs; each becomes the test's moto server.
ENDPOINTS = ("http://minio:9000",)

#: The warning docs/how-to/receive.md says torch gives for a read-only array, once.
TORCH_WARNING = "The given NumPy array is not writable"

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>\S*)\s*$")
_MARKER = re.compile(r"^(?P<kind>setup|check|not-run|needs):\s*(?P<rest>.*)$", re.S)


@dataclass
class Block:
    """One python block of a page: its code, dedented, and its markers."""

    page: str
    line: int  # the line of the opening fence, from 1
    code: str
    end: int = 0  # the line of the closing fence
    setup: str = ""
    setup_line: int = 0  # the line of the setup comment's first line of code
    check: str = ""
    check_line: int = 0
    not_run: str = ""
    needs: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def include(self) -> str:
        """The file a block that only includes one names, else ``""``."""
        match = re.fullmatch(r'--8<-- "([^"]+)"\s*', self.code)
        return match.group(1) if match else ""


def read_blocks(page: str) -> list[Block]:
    """The python blocks of ``docs/<page>``, with their markers; a marker out of its
    place (see above) is an error."""
    lines = (DOCS / page).read_text().splitlines()
    blocks: list[Block] = []
    pending: list[tuple[str, str, int]] = []  # (kind, text, line of its first code line)
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("<!--"):
            start = i
            assert not lines[i].startswith(" ") or not _MARKER.match(stripped[4:].strip()), (
                f"docs/{page}:{i + 1}: an indented marker (it would end a list)"
            )
            while "-->" not in lines[i]:
                i += 1
            text = "\n".join(lines[start : i + 1]).strip()
            inner = text.removeprefix("<!--").removesuffix("-->").strip()
            marker = _MARKER.match(inner)
            if marker:
                kind, rest = marker["kind"], marker["rest"]
                body = textwrap.dedent("\n".join(lines[start + 1 : i]))
                if kind in ("setup", "check"):  # the first line describes; code follows
                    assert body.strip(), f"docs/{page}:{start + 1}: a {kind} without code"
                if kind == "check":  # right below the fence of the block it checks
                    assert blocks and blocks[-1].end == start, (
                        f"docs/{page}:{start + 1}: a check not right below a python block"
                    )
                    blocks[-1].check, blocks[-1].check_line = body, start + 2
                elif kind == "setup":
                    pending.append((kind, body, start + 2))
                else:
                    pending.append((kind, rest.strip(), start + 1))
            i += 1
            continue
        fence = _FENCE.match(lines[i])
        if fence:
            end = i + 1
            while not re.match(rf"^{fence['indent']}```\s*$", lines[end]):
                end += 1
            if fence["lang"] == "python":
                code = textwrap.dedent("\n".join(lines[i + 1 : end]))
                block = Block(page, i + 1, code, end=end + 1)
                for kind, text, line in pending:
                    if kind == "setup":
                        block.setup, block.setup_line = text, line
                    elif kind == "not-run":
                        assert text, f"docs/{page}:{line}: not-run needs a reason"
                        block.not_run = text
                    else:
                        block.needs.append(text)
                blocks.append(block)
                pending = []
            i = end
        loose = [kind for kind, _, _ in pending if kind != "setup"]
        assert not loose or not stripped, (
            f"docs/{page}:{pending[0][2]}: a marker ({loose[0]}) not right above a python fence"
        )
        i += 1
    assert not pending, f"docs/{page}: a marker at the end of the page"
    return blocks


BLOCKS = {page: read_blocks(page) for page in PAGES}


# ---------------------------------------------------------------- running a block


def _literal_comments(source: str) -> dict[int, Any]:
    """Line -> the value of its trailing comment, for comments that are Python literals."""
    found: dict[int, Any] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.removeprefix("#").strip()
            with contextlib.suppress(ValueError, SyntaxError, TypeError, RecursionError):
                found[token.start[0]] = ast.literal_eval(text)
    return found


class _CheckOutputs(ast.NodeTransformer):
    """Wraps each expression statement whose line ends in a literal comment in a call
    that checks the expression gives that literal."""

    def __init__(self, literals: dict[int, Any]) -> None:
        self.literals = literals

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        line = node.end_lineno or node.lineno
        if line not in self.literals:
            return node
        check = ast.Call(
            func=ast.Name("__docs_output__", ast.Load()),
            args=[node.value, ast.Constant(line)],
            keywords=[],
        )
        return ast.copy_location(ast.Expr(check), node)


def _same(value: Any, expected: Any) -> bool:
    """Equal, and of the same types all the way down (what a REPL prints)."""
    if type(value) is not type(expected):
        return False
    if isinstance(value, dict):
        return value.keys() == expected.keys() and all(_same(value[k], expected[k]) for k in value)
    if isinstance(value, list | tuple):
        return len(value) == len(expected) and all(map(_same, value, expected))
    return bool(value == expected)


def _rewrite(source: str, ns: dict[str, Any]) -> str:
    """``source`` with the docs' absolute paths and S3 endpoints replaced (see above)."""
    for old, new in {**PATHS, **HOSTS}.items():
        source = source.replace(old, new)
    for endpoint in ENDPOINTS:
        if endpoint in source:
            source = source.replace(endpoint, ns["S3_ENDPOINT"])
    return source


def _compile(block: Block, source: str, first_line: int) -> types.CodeType:
    """``source`` compiled so that tracebacks name the page and its own line numbers."""
    padded = "\n" * (first_line - 1) + source
    tree = ast.parse(padded, filename=f"docs/{block.page}")
    checked: ast.Module = _CheckOutputs(_literal_comments(padded)).visit(tree)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    path = str(DOCS / block.page)
    code: types.CodeType = compile(
        ast.fix_missing_locations(checked), path, "exec", flags=flags, dont_inherit=True
    )
    return code


async def _await(code: types.CodeType, namespace: dict[str, Any]) -> None:
    await eval(code, namespace)  # the docs' own code


def run_code(
    portal: BlockingPortal, block: Block, source: str, first_line: int, ns: dict[str, Any]
) -> None:
    """Run ``source`` of ``block`` in ``ns``: on the page's loop if it awaits."""
    literals = _literal_comments("\n" * (first_line - 1) + source)

    def output(value: Any, line: int) -> None:
        want = literals[line]
        assert _same(value, want), f"docs/{block.page}:{line}: gives {value!r}, not {want!r}"

    ns["__docs_output__"] = output
    code = _compile(block, _rewrite(source, ns), first_line)
    try:
        if code.co_flags & inspect.CO_COROUTINE:  # a top-level await
            portal.call(_await, code, ns)
        else:
            exec(code, ns)
    except Exception as exc:
        failure = _told(exc)
    else:
        return
    pytest.fail(f"the python block of {block.where} failed:\n{failure}", pytrace=False)


def _told(exc: Exception) -> str:
    """The traceback from the page's own frame on, which names the page and its lines
    (pytest's own would print the page from its first line, as the code of a module)."""
    tb = exc.__traceback__
    while tb and not tb.tb_frame.f_code.co_filename.startswith(str(DOCS)):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


# ---------------------------------------------------------------- what setups may use


def send_steps(
    url: str, count: int = 2, *, ranks: int = 1, finish: bool = True, **options: Any
) -> None:
    """Send ``count`` small steps of ``ranks`` ranks to ``url`` (and end the stream), as
    the reader's producer did before the block."""
    with rlwire.open_sync_sender(url, sidecar=("routed_experts",), **options) as sender:
        for step in range(count):
            sender.send_ranks([make_batch(2, 16, seed=10 * step + r) for r in range(ranks)])
        if finish:
            sender.finish()


@pytest.fixture
def page_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A module of its own for one page, its working directory a fresh temporary one."""
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("docs_page")
    sys.modules[module.__name__] = module
    module.__dict__.update(send_steps=send_steps, make_batch=make_batch)
    try:
        yield module.__dict__
    finally:
        del sys.modules[module.__name__]
        gc.unfreeze()  # docs/how-to/operate.md freezes what the process holds


def _reach_s3(request: pytest.FixtureRequest, ns: dict[str, Any]) -> None:
    """The session's moto server, reached through the environment as a reader's S3 is,
    and ``make_bucket(name)`` for the setups."""
    options = request.getfixturevalue("s3_endpoint")
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", options["client_kwargs"]["region_name"])
    ns["make_bucket"] = lambda name: s3_client(options).create_bucket(Bucket=name)
    ns["S3_ENDPOINT"] = options["endpoint_url"]


def _runnable(block: Block) -> bool:
    return not (block.not_run or block.include or _missing(block))


def _missing(block: Block) -> list[str]:
    return [name for name in block.needs if importlib.util.find_spec(name) is None]


def _close_leftovers(portal: BlockingPortal, ns: dict[str, Any], quiet: bool = False) -> None:
    """Close the senders and receivers the page left open, as the end of the reader's
    program would (``quiet``: after a failure, which their errors would hide)."""
    for value in list(ns.values()):
        if not type(value).__module__.startswith("rlwire"):
            continue
        try:
            if hasattr(value, "aclose"):
                portal.call(value.aclose)
            elif hasattr(value, "close"):
                value.close()
        except Exception:
            if not quiet:
                raise


@pytest.mark.parametrize("page", [p for p in PAGES if any(map(_runnable, BLOCKS[p]))])
@pytest.mark.filterwarnings(f"ignore:{TORCH_WARNING}:UserWarning")
def test_the_blocks_of_a_page_run_in_order(
    page: str, page_namespace: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    runnable = [b for b in BLOCKS[page] if _runnable(b)]
    if any("s3://" in b.code + b.setup for b in runnable):
        _reach_s3(request, page_namespace)
    with start_blocking_portal("asyncio") as portal:
        try:
            for block in runnable:
                if block.setup:
                    run_code(portal, block, block.setup, block.setup_line, page_namespace)
                run_code(portal, block, block.code, block.line + 1, page_namespace)
                if block.check:
                    run_code(portal, block, block.check, block.check_line, page_namespace)
        except BaseException:
            _close_leftovers(portal, page_namespace, quiet=True)
            raise
        _close_leftovers(portal, page_namespace)


_SKIPPED = [
    pytest.param(b, id=b.where)
    for page in PAGES
    for b in BLOCKS[page]
    if b.not_run or (not b.include and _missing(b))
]


@pytest.mark.parametrize("block", _SKIPPED)
def test_a_block_not_run_says_why(block: Block) -> None:
    if block.not_run:
        pytest.skip(f"{block.where}: not run: {block.not_run}")
    pytest.skip(f"{block.where}: needs {', '.join(_missing(block))}, not installed")


def test_an_included_block_is_an_example() -> None:
    included = [b.include for page in PAGES for b in BLOCKS[page] if b.include]
    assert included
    for path in included:
        assert path.startswith("examples/") and (ROOT / path).is_file(), path
