"""A producer killed (SIGKILL, by itself) as it writes a chosen file or object, in a child
process: on S3 (the test server) or in a directory.

:func:`run_killed` runs a plan in a process forked from the warm server (``forked.py``),
with its sender opened with ``on_existing="resume"``: ``("send", ranks)`` sends a whole
step to ``ranks`` ranks (samples of 40 tokens, or of a third item's count);
``("parts", ranks, keys)`` fills a step part by part with ``keys`` puts, then seals it;
``("finish",)`` marks the end. Every request s3fs makes, and every ``os.link``,
``os.rename`` and ``os.replace`` (how the file sink moves a file into place), goes
through a hook: the first that writes the object or file named ``kill_at`` (a
``put_object`` or a completed multipart upload whose ``Key`` ends with it, or one of
the requests ``extra["kill_methods"]`` names, such as ``delete_objects``; a move to a
path that ends with it) sends the process SIGKILL just ``before`` it is made, or just
after it returns. So the store is left as a producer killed at that moment leaves it,
by a real kill.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from typing import Any

import forked

import rlwire
from rlwire.testing import make_sample

__all__ = ["batch", "part_sample", "run_killed", "run_plan"]

_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    import anyio, s3fs
    import rlwire
    from killed_producer import run_plan

    url, options, plan, kill_at, when, extra = json.loads(sys.argv[1])
    methods = extra.pop("kill_methods", ["put_object", "complete_multipart_upload"])
    real = s3fs.S3FileSystem._call_s3

    async def call_s3(self, method, *args, **kwargs):
        doomed = kwargs.get("Delete", {}).get("Objects", [])
        keys = [kwargs.get("Key", "")] + [o["Key"] for o in doomed]
        hit = method in methods and kill_at in [str(k).rpartition("/")[2] for k in keys]
        if hit and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        out = await real(self, method, *args, **kwargs)
        if hit:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    def moved(real):
        def move(src, dst, *args, **kwargs):
            hit = os.path.basename(os.fspath(dst)) == kill_at
            if hit and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            out = real(src, dst, *args, **kwargs)
            if hit:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        return move

    s3fs.S3FileSystem._call_s3 = call_s3
    os.link, os.rename, os.replace = moved(os.link), moved(os.rename), moved(os.replace)
    anyio.run(run_plan, url, options, plan, extra)
    """
)


def batch(step: int, rank: int, tokens: int = 40) -> rlwire.TrainingBatch:
    """The batch a plan sends to ``rank`` at ``step``: a function of both."""
    return rlwire.TrainingBatch(samples=[make_sample(tokens, seed=100 * step + rank)])


def part_sample(step: int, key: int) -> rlwire.TrainingSample:
    """The sample a plan puts under ``key`` in ``step`` (filled part by part)."""
    return make_sample(30, seed=1000 * step + key)


async def run_plan(
    url: str, options: dict[str, Any], plan: list[list[Any]], extra: dict[str, Any] | None = None
) -> None:
    """Carry out ``plan`` with a sender opened with ``on_existing="resume"`` (and the
    options ``extra``: ``sidecar`` as a list)."""
    extra = dict(extra or {})
    if "sidecar" in extra:
        extra["sidecar"] = tuple(extra["sidecar"])
    opened = rlwire.open_sender(url, storage_options=options or None, on_existing="resume", **extra)
    async with opened as sender:
        for action in plan:
            if action[0] == "send":
                step = sender.next_step
                tokens = action[2] if len(action) > 2 else 40
                await sender.send_ranks([batch(step, r, tokens) for r in range(action[1])])
            elif action[0] == "parts":
                async with sender.open_step(ranks=action[1]) as writer:
                    for key in range(action[2]):
                        sample = part_sample(writer.step, key)
                        await writer.put([sample], key=key, rank=key % action[1])
            else:
                await sender.finish()


def run_killed(
    url: str,
    options: dict[str, Any],
    plan: list[list[Any]],
    kill_at: str | None,
    when: str = "before",
    extra: dict[str, Any] | None = None,
) -> int:
    """Run ``plan`` in a child killed at the request for the object ``kill_at``; its
    exit status (``-SIGKILL`` if the kill came)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = json.dumps([url, options, plan, kill_at, when, extra or {}])
    proc = forked.run(
        [sys.executable, "-c", _CHILD, args], capture_output=True, text=True, env=env, timeout=60
    )
    if kill_at is not None and proc.returncode != -signal.SIGKILL:
        raise AssertionError(f"the producer was not killed at {kill_at}: {proc.stderr}")
    if kill_at is None and proc.returncode:
        raise AssertionError(f"the producer failed: {proc.stderr}")
    return int(proc.returncode)
