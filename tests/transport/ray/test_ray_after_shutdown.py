"""A ``ray://`` sender and receiver used after ``ray.shutdown()`` raise a ConfigError at
once (Ray's bare Exception from the send, a receive that hung), and a receive waiting on
the board as Ray shuts down ends within a second with it. Their ``close()`` returns:
nothing a close does can lose a step (each send returned once its step was committed),
also when a failed send left a prune not waited for (that close raised the ConfigError).
In a child process with a cluster of its own (tests/ray_after_shutdown.py): the
session's cluster stays up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

SHUT = "not connected to a Ray cluster"


@pytest.mark.long
def test_sender_and_receiver_after_ray_shutdown(tmp_path: Path) -> None:
    tests = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tests.parent / "src"), str(tests)])
    result = subprocess.run(
        [sys.executable, "-m", "ray_after_shutdown"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    kind, seconds, message = seen.pop("waiting")
    assert (kind, SHUT in message) == ("ConfigError", True), (kind, message)
    assert seconds < 5, seconds  # a wait of 60 s asked: it ends once Ray is gone
    assert seen.pop("prune pending") is True  # else the close below proves nothing
    closes = ("sender close", "sender close, a prune pending", "async sender close")
    for closing in (*closes, "receiver close"):
        assert seen.pop(closing)[0] == "returned", closing
    for call, (kind, seconds, message) in seen.items():
        assert (kind, SHUT in message) == ("ConfigError", True), (call, kind, message)
        assert "ray://after-shutdown" in message, (call, message)
        assert seconds < 1, (call, seconds)
