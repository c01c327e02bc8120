"""Odd file types at a step's paths: ``receive(timeout=2)`` must return in time (plus a
slack) with a typed error, whatever sits where the main part or the sidecar should be."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

import rlwire

from ._model import HANG, TYPED, payload, receive_one
from ._proc import Job

MAIN = "step-00000000.rank-0000.rlw"
SIDE = "step-00000000.rank-0000.sidecar.rlw"
TIMEOUT = 2.0
SLACK = 3.0


def _make(path: Path, kind: str) -> None:
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink loop":
        os.symlink(path.name, path)
    elif kind == "dangling symlink":
        os.symlink("nowhere", path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "/dev/zero symlink":
        os.symlink("/dev/zero", path)
    elif kind == "/dev/null symlink":
        os.symlink("/dev/null", path)
    elif kind == "unreadable file":
        path.write_bytes(b"\x89RLW\r\n\x1a\n" + bytes(100))
        path.chmod(0)
    elif kind == "empty file":
        path.write_bytes(b"")
    else:
        raise ValueError(kind)


KINDS = (
    "FIFO",
    "directory",
    "symlink loop",
    "dangling symlink",
    "socket",
    "/dev/zero symlink",
    "/dev/null symlink",
    "empty file",
)


def run_case(root: str, where: str, kind: str) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(dir=root))
    if where == "sidecar":

        async def send() -> None:
            async with rlwire.open_sender(directory, sidecar=("routed_experts",)) as sender:
                await sender.send(payload(0, 0))

        anyio.run(send)
        (directory / SIDE).unlink()
    _make(directory / (MAIN if where == "main part" else SIDE), kind)
    start = time.monotonic()
    got = receive_one(directory, 0, 0, None, timeout=TIMEOUT)
    took = time.monotonic() - start
    if took > TIMEOUT + SLACK:
        return {"outcome": HANG, "detail": f"receive(timeout={TIMEOUT}) took {took:.1f} s; {got}"}
    if got["outcome"] == TYPED:
        got["detail"] = f"after {took:.2f} s: {got['detail']}"
    return got


def name(where: str, kind: str) -> str:
    article = "an" if kind[0] in "aeiou" else "a"
    return f"{where} is {article} {kind}"


def jobs(root: str, repeat: int = 1, only: set[str] | None = None) -> Iterator[Job]:
    for _ in range(repeat):
        for where in ("main part", "sidecar"):
            for kind in KINDS:
                if only is not None and name(where, kind) not in only:
                    continue
                yield Job(
                    run_case,
                    (root, where, kind),
                    timeout=TIMEOUT + SLACK + 5,
                    tag=("odd file types", name(where, kind)),
                )
