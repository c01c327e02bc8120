#!/usr/bin/env python3
"""Development tasks that need nothing but python3 (3.11+) on the PATH.

    python3 tasks.py demo    # create or reuse .venv, install rlwire[dev], run `rlwire demo`
    python3 tasks.py test    # the same set-up, then ruff, mypy, the docs site and pytest
    python3 tasks.py long    # the long scenarios the test command leaves out (marker `long`),
                             # and every property test at full depth (tests/depth.py)
    python3 tasks.py bench   # the whole benchmark suite (docs/benchmarks.md)
    python3 tasks.py chaos   # the chaos suite (docs/reliability.md): kills, corruption, ...

Extra arguments after the task name go to the command (pytest, rlwire demo, the benchmark,
the chaos suite: `--kills N --corruptions N --seed S`, `--help` for the rest).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / "python"
LINTED = ("src", "tests", "examples", "benchmarks", "chaos", "docs/_ext", "tasks.py")


def run(*args: str | Path) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    code = subprocess.call([str(a) for a in args], cwd=ROOT)
    if code:
        sys.exit(code)


def ensure_env() -> None:
    """Create .venv and install rlwire with its dev extra, again only when pyproject changes."""
    stamp = VENV / ".rlwire-installed"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not PYTHON.exists():
        print(f"+ creating {VENV.name}", flush=True)
        venv.create(VENV, with_pip=True)
    if not stamp.exists() or stamp.read_text() != digest:
        run(
            PYTHON, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e", ".[dev]"
        )
        stamp.write_text(digest)


def main() -> None:
    task, extra = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if task not in ("demo", "test", "long", "bench", "chaos"):
        sys.exit(__doc__)
    ensure_env()
    if task == "demo":
        run(BIN / "rlwire", "demo", *extra)
    elif task == "test":
        run(BIN / "ruff", "check", *LINTED)
        run(BIN / "ruff", "format", "--check", *LINTED)
        run(BIN / "mypy")
        # The documentation site: a broken link, anchor or included file fails the build.
        os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")  # Material's notice about its future
        run(BIN / "mkdocs", "build", "--strict", "--quiet", "--site-dir", "build/site")
        # The long scenarios (actors killed and restarted, Ray clusters of their own) have
        # their own task, as the chaos campaigns do: with them the suite took 11 minutes
        # on this kind of machine on a slow day (2026-11-29).
        run(*pytest_command("not long"), *extra)
    elif task == "long":
        os.environ.setdefault("RLWIRE_TEST_DEPTH", "1")
        run(*pytest_command("long or hypothesis"), *extra)
    elif task == "chaos":
        # The campaign is the package chaos/ beside src/; it uses the tests' S3 server.
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
        run(PYTHON, "-m", "chaos.run", *extra)
    else:
        os.environ["PYTHONPATH"] = bench_path()
        run(*bench_command(PYTHON, extra))


def pytest_command(marks: str) -> list[str | Path]:
    """pytest over the tests that ``marks`` selects, two workers per core (pytest-xdist):
    the tests wait on processes, sockets and Ray much of the time (on 2 cores: 270 s with
    4 workers, 334 s with 3, the same tree, 2026-11-28). loadgroup: the tests of one
    xdist_group (the Ray cluster's, one chaos campaign's, the plugin's install) share a
    worker, so each starts once."""
    workers = str(2 * (os.cpu_count() or 2))
    return [PYTHON, "-m", "pytest", "-n", workers, "--dist", "loadgroup", "-m", marks]


def bench_path() -> str:
    """PYTHONPATH for the benchmark suite: this checkout's src first, then the checkout."""
    return os.pathsep.join([str(ROOT / "src"), str(ROOT)])


def bench_command(python: str | Path, extra: list[str]) -> list[str | Path]:
    """The benchmark suite's command line: benchmarks/suite.py, whose directory Python puts
    first on sys.path (its scripts import each other by file name), run by ``python``."""
    return [python, ROOT / "benchmarks" / "suite.py", *extra]


if __name__ == "__main__":
    main()
