"""Exactly once across a producer's crash: a producer killed (SIGKILL) while filling a
step part by part, then resumed with on_existing="resume", delivers every key once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import forked
import pytest
from helpers import make_sample

import rlwire

pytestmark = pytest.mark.anyio

KEYS = [f"rollout-{i}" for i in range(24)]

#: The producer: step 0 sent whole, then step 1 filled part by part, one key at a time,
#: printing each key once its put returned; it never seals (it is killed first).
_PRODUCER = textwrap.dedent(
    """
    import sys, time
    import anyio
    import rlwire
    from rlwire.testing import make_sample

    path, keys = sys.argv[1], sys.argv[2:]

    async def main() -> None:
        async with rlwire.open_sender(
            path, sidecar=("routed_experts",), on_existing="resume"
        ) as sender:
            if sender.next_step == 0:
                await sender.send_ranks([rlwire.TrainingBatch(samples=[make_sample(4)])] * 2)
            async with sender.open_step(ranks=2) as writer:
                for i, key in enumerate(keys):
                    await writer.put([make_sample(16 + i, seed=i)], key=key)
                    print(key, flush=True)
                time.sleep(60)  # killed here at the latest: the step is never sealed

    anyio.run(main)
    """
)


def start_producer(path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return forked.Popen(
        [sys.executable, "-c", _PRODUCER, str(path), *KEYS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def kill_after(proc: subprocess.Popen[str], puts: int, delay: float) -> list[str]:
    """SIGKILL ``proc`` ``delay`` seconds after it reported ``puts`` puts; the keys it
    reported."""
    assert proc.stdout is not None
    seen: list[str] = []
    while len(seen) < puts:
        line = proc.stdout.readline()
        assert line, f"the producer ended early: {proc.stderr.read() if proc.stderr else ''}"
        seen.append(line.strip())
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.stdout is not None
    seen += [line.strip() for line in proc.stdout.read().splitlines()]
    return seen


@pytest.mark.parametrize(("puts", "delay"), [(1, 0.0), (5, 0.003), (11, 0.02)])
async def test_a_killed_producer_resumed_delivers_every_key_exactly_once(
    tmp_path: Path, puts: int, delay: float
) -> None:
    with start_producer(tmp_path) as proc:
        try:
            reported = await anyio.to_thread.run_sync(kill_after, proc, puts, delay)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "step-00000001.seal.rlw").exists()

    async with rlwire.open_sender(
        tmp_path, sidecar=("routed_experts",), on_existing="resume"
    ) as sender:
        assert sender.next_step == 1  # the open step, to finish
        with pytest.raises(rlwire.StepExistsError, match="not sealed"):
            await sender.send(rlwire.TrainingBatch(samples=[]))
        async with sender.open_step(ranks=2) as writer:
            assert set(reported) <= writer.resumed  # every reported put is committed
            skipped = [
                key
                for i, key in enumerate(KEYS)
                if await writer.put([make_sample(16 + i, seed=i)], key=key)
            ]
        assert set(skipped) == writer.resumed
        assert sender.next_step == 2
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]

    delivered: list[str] = []
    for rank in range(2):
        with rlwire.open_receiver(tmp_path, rank=rank, start_step=1) as receiver:
            for part in receiver.parts(timeout=10):
                i = KEYS.index(str(part.key))
                assert len(part.value.samples[0].token_ids) == 16 + i  # the key's own data
                delivered.append(str(part.key))
    assert sorted(delivered) == sorted(KEYS)  # each key once: none lost, none twice


async def test_resume_refuses_to_skip_an_open_step(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        with pytest.raises(RuntimeError):
            async with sender.open_step() as writer:
                await writer.put([make_sample(4)], key="a")
                raise RuntimeError
    with pytest.raises(rlwire.StepExistsError, match="step 0 was being filled part by part"):
        async with rlwire.open_sender(tmp_path, on_existing="resume", start_step=1):
            pass
    with pytest.raises(rlwire.StepExistsError):
        async with rlwire.open_sender(tmp_path):  # "error": it holds a step
            pass
    async with rlwire.open_sender(tmp_path, on_existing="truncate", start_step=0) as sender:
        assert sender.next_step == 0
        assert not [n for n in os.listdir(tmp_path) if n.startswith("step-")]
        assert await sender.send(rlwire.TrainingBatch(samples=[])) == 0  # sent whole now


async def test_a_resumed_step_must_keep_its_ranks(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        with pytest.raises(RuntimeError):
            async with sender.open_step(ranks=3) as writer:
                await writer.put([make_sample(4)], key="a", rank=2)
                raise RuntimeError
        with pytest.raises(rlwire.ConfigError, match=r"rank 2.*ranks=2"):
            async with sender.open_step(ranks=2):
                pass
        with anyio.fail_after(10):
            async with sender.open_step(ranks=3) as writer:
                assert writer.assignment == ((), (), ("a",))
