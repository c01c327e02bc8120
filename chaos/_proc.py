"""Isolated trials: each runs in a forked child under a deadline and a memory bound.

The parent never starts a thread or an event loop, so forking it is safe. A child returns
a small JSON dict (``{"outcome": ..., "detail": ...}``) through a pipe. The parent turns
a child that outlives its deadline into ``hang``, one whose resident memory grows past its
bound into ``memory over limit`` (polled every few milliseconds, and checked again from the
child's own peak), and one that dies otherwise into ``crash``.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 1 << 20
#: Memory a trial may use beyond its start, on top of a multiple of the file size.
MEMORY_CONSTANT = 256 * MiB
#: Address space a child may reserve beyond its start: a safety net for the machine.
ADDRESS_SPACE_SLACK = 8 << 30


@dataclass
class Job:
    """One trial: ``fn(*args)`` run in a child, returning a JSON-able dict."""

    fn: Callable[..., dict[str, Any]]
    args: tuple[Any, ...] = ()
    timeout: float = 10.0
    mem_limit: int = MEMORY_CONSTANT
    tag: Any = None
    # Filled in by the pool.
    pid: int = 0
    fd: int = -1
    start: float = 0.0
    base_rss: int = 0
    chunks: list[bytes] = field(default_factory=list)


def rss(pid: int | str = "self") -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def reap(pid: int, timeout: float) -> int | None:
    """Wait for ``pid``'s exit status; kill it at ``timeout`` (then None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _child(job: Job, w: int) -> None:
    try:
        base = rss()
        vm = 0
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * PAGE
        resource.setrlimit(resource.RLIMIT_AS, (vm + ADDRESS_SPACE_SLACK, resource.RLIM_INFINITY))
        try:
            result = job.fn(*job.args)
        except MemoryError:
            result = {"outcome": "memory over limit", "detail": "MemoryError"}
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if peak - base > job.mem_limit and result.get("outcome") != "hang":
            result = {
                "outcome": "memory over limit",
                "detail": f"peak RSS grew by {(peak - base) / MiB:.0f} MiB "
                f"(bound {job.mem_limit / MiB:.0f} MiB); then {result.get('outcome')}",
            }
        result["peak_mib"] = round((peak - base) / MiB, 1)
    except BaseException:
        result = {"outcome": "untyped error", "detail": "harness: " + traceback.format_exc()[-800:]}
    data = json.dumps(result, default=str).encode()
    if len(data) > 60_000:
        result["detail"] = str(result.get("detail"))[:2000]
        data = json.dumps(result, default=str).encode()
    os.write(w, data)
    os._exit(0)


def _start(job: Job) -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        _child(job, w)
    os.close(w)
    os.set_blocking(r, False)
    job.pid, job.fd, job.start, job.chunks = pid, r, time.monotonic(), []
    job.base_rss = rss(pid)


def _drain(job: Job) -> None:
    while True:
        try:
            data = os.read(job.fd, 65536)
        except BlockingIOError:
            return
        if not data:
            return
        job.chunks.append(data)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def run_jobs(
    jobs: Iterable[Job], on_result: Callable[[Job, dict[str, Any]], None], parallel: int = 2
) -> None:
    """Run ``jobs``, ``parallel`` at a time, calling ``on_result`` for each in the parent."""
    pending = iter(jobs)
    running: list[Job] = []
    exhausted = False
    while running or not exhausted:
        while not exhausted and len(running) < parallel:
            job = next(pending, None)
            if job is None:
                exhausted = True
                break
            _start(job)
            running.append(job)
        time.sleep(0.002)
        for job in list(running):
            _drain(job)
            verdict: dict[str, Any] | None = None
            done, status = os.waitpid(job.pid, os.WNOHANG)
            if done:
                _drain(job)
                text = b"".join(job.chunks)
                if text:
                    verdict = json.loads(text)
                elif os.WIFSIGNALED(status):
                    sig = signal.Signals(os.WTERMSIG(status)).name
                    verdict = {"outcome": "crash", "detail": f"child died of {sig}"}
                else:
                    verdict = {"outcome": "crash", "detail": f"child exited {status}"}
            else:
                grown = rss(job.pid) - job.base_rss
                if grown > job.mem_limit:
                    _kill(job.pid)
                    os.waitpid(job.pid, 0)
                    verdict = {
                        "outcome": "memory over limit",
                        "detail": f"RSS grew by {grown / MiB:.0f} MiB "
                        f"(bound {job.mem_limit / MiB:.0f} MiB)",
                    }
                elif time.monotonic() - job.start > job.timeout:
                    _kill(job.pid)
                    os.waitpid(job.pid, 0)
                    verdict = {"outcome": "hang", "detail": f"no answer in {job.timeout:.0f} s"}
            if verdict is not None:
                os.close(job.fd)
                running.remove(job)
                on_result(job, verdict)
