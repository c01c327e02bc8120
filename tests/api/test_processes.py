"""Real processes: sender and receivers in different interpreters, the CLI, the examples."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from helpers import assert_batches_equal
from s3_server import s3_client

import rlwire
from rlwire._api.cli import main
from rlwire._frame.compression import Compressor
from rlwire.testing import make_batch

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"count": 3, "n": 300, "layers": 6, "topk": 4}

RECEIVER = textwrap.dedent("""
    import sys, rlwire
    from rlwire.testing import make_batch
    path, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with rlwire.open_receiver(path, rank=rank, poll_interval=0.005) as receiver:
        for step in range(steps):
            batch = receiver.receive(timeout=60)
            want = make_batch(3, 300, seed=100 * step + rank, layers=6, topk=4)
            for a, b in zip(batch.samples, want.samples, strict=True):
                assert a.routed_experts.tobytes() == b.routed_experts.tobytes()
                assert a.token_ids.tobytes() == b.token_ids.tobytes()
                assert a.logprobs.tobytes() == b.logprobs.tobytes()
            print(receiver.last_step, flush=True)
""")

SENDER = textwrap.dedent("""
    import sys, anyio, rlwire
    from rlwire.testing import make_batch
    path, steps = sys.argv[1], int(sys.argv[2])
    async def main():
        async with rlwire.open_sender(path, sidecar=("routed_experts",)) as sender:
            for step in range(steps):
                await sender.send(make_batch(3, 300, seed=100 * step, layers=6, topk=4))
                await anyio.sleep(0.01)
    anyio.run(main, backend=sys.argv[3])
""")

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
async def test_receivers_in_other_processes(tmp_path: Path, compression: str | None) -> None:
    """One async sender, one receiver process per rank, started before the first step;
    compressed (from 1 KiB, so these small batches do compress) and checksummed."""
    steps, ranks = 4, 2
    comp = None if compression is None else Compressor(compression, min_size=1024)
    procs = [
        await anyio.open_process(
            [sys.executable, "-c", RECEIVER, str(tmp_path), str(r), str(steps)]
        )
        for r in range(ranks)
    ]
    try:
        async with rlwire.open_sender(
            tmp_path, sidecar=("routed_experts",), compression=comp
        ) as sender:
            for step in range(steps):
                await sender.send_ranks(
                    [make_batch(**SIZES, seed=100 * step + r) for r in range(ranks)]
                )
                await anyio.sleep(0.01)
        for proc in procs:
            with anyio.fail_after(60):
                assert await proc.wait() == 0
            assert proc.stdout is not None
            out = (await proc.stdout.receive()).decode() if proc.returncode == 0 else ""
            assert out.split()[-1] == str(steps - 1)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.aclose()


@pytest.mark.parametrize("sender_backend", ["asyncio", "trio"])
async def test_sender_in_another_process(tmp_path: Path, sender_backend: str) -> None:
    steps = 3
    proc = await anyio.open_process(
        [sys.executable, "-c", SENDER, str(tmp_path), str(steps), sender_backend]
    )
    try:
        async with rlwire.open_receiver(tmp_path, poll_interval=0.005) as receiver:
            for step in range(steps):
                got = await receiver.areceive(timeout=60)
                assert_batches_equal(got, make_batch(**SIZES, seed=100 * step))
        with anyio.fail_after(60):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.aclose()


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_demo_command() -> None:
    result = run(
        sys.executable,
        "-m",
        "rlwire._api.cli",
        "demo",
        "--steps",
        "3",
        "--samples",
        "4",
        "--tokens",
        "512",
        "--layers",
        "8",
    )
    assert result.returncode == 0, result.stderr
    assert "step   3/3" in result.stdout
    assert "loop lag max" in result.stdout
    assert "trainer verified all 3 steps bit-exact" in result.stdout


def test_demo_refuses_a_directory_with_steps(tmp_path: Path) -> None:
    args = ("demo", "--steps", "1", "--samples", "1", "--tokens", "64", "--dir", str(tmp_path))
    assert run(sys.executable, "-m", "rlwire._api.cli", *args).returncode == 0
    again = run(sys.executable, "-m", "rlwire._api.cli", *args)
    assert again.returncode == 2
    assert "StepExistsError" in again.stderr and "Traceback" not in again.stderr


def test_demo_refuses_counts_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    """A usage error, before anything is sent. Before, ``--steps -1`` ran a demo that
    sent nothing and ended "FAILED: the trainer verified 0 of -1 steps"; ``--steps 0``
    "verified all 0 steps"."""
    for option, value, least in [("--steps", "-1", 1), ("--steps", "0", 1), ("--samples", "-1", 0)]:
        with pytest.raises(SystemExit) as exited:
            main(["demo", option, value])
        assert exited.value.code == 2
        assert f"argument {option}: {value}: at least {least}" in capsys.readouterr().err


def test_inspect_command(tmp_path: Path) -> None:
    async def send() -> None:
        async with rlwire.open_sender(tmp_path) as sender:
            await sender.send(make_batch(**SIZES))
            await sender.send(make_batch(**SIZES))

    anyio.run(send)
    result = run(sys.executable, "-m", "rlwire._api.cli", "inspect", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "routed_experts: ndarray uint8 [" in result.stdout
    later = run(sys.executable, "-m", "rlwire._api.cli", "inspect", str(tmp_path), "--step", "1")
    assert later.returncode == 0, later.stderr
    # Looking records nothing: the rank's trainer still holds step 0 back from keep_last.
    assert not list(tmp_path.glob("consumed.*"))
    missing = run(sys.executable, "-m", "rlwire._api.cli", "inspect", str(tmp_path), "--step", "7")
    assert missing.returncode == 1 and "no step 7" in missing.stderr
    (tmp_path / "step-00000000.rank-0000.rlw").write_bytes(b"garbage")
    corrupt = run(sys.executable, "-m", "rlwire._api.cli", "inspect", str(tmp_path))
    assert corrupt.returncode == 2 and "CorruptFrameError" in corrupt.stderr


def test_inspect_describes_the_fence_of_the_last_open(tmp_path: Path) -> None:
    """Each open writes a new fence: inspect shows the last one's id and on_existing,
    with the destination and given the file itself."""
    cli = (sys.executable, "-m", "rlwire._api.cli", "inspect")
    fence = tmp_path / "fence.rlw"
    seen = []
    for on_existing in ("overwrite", "resume"):
        with rlwire.open_sync_sender(tmp_path, on_existing=on_existing) as sender:
            sender.send(make_batch(**SIZES))
        token = fence.read_bytes()[8:24]
        line = (
            f"fence: {fence}, id {token.hex()}: written when a sender last opened the "
            f'destination (on_existing="{on_existing}"); that sender alone commits and '
            "deletes there now, those opened before it are fenced off"
        )
        listed = run(*cli, str(tmp_path))
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines()[-1] == line
        alone = run(*cli, str(fence))
        assert alone.returncode == 0, alone.stderr
        assert alone.stdout == line + "\n"
        seen.append(token)
    assert seen[0] != seen[1]
    # A step's file, or the manifest alone: no fence.
    for args in ((str(tmp_path / "step-00000000.rank-0000.rlw"),), (str(tmp_path), "--json")):
        described = run(*cli, *args)
        assert described.returncode == 0 and "fence" not in described.stdout, described.stderr


def test_inspect_describes_the_fence_of_an_s3_destination(
    s3_url: str, s3_endpoint: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL as the destination, and the fence's URL: as on files."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint["endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_endpoint["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_endpoint["secret"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3_endpoint["client_kwargs"]["region_name"])
    url = f"{s3_url}/run"
    with rlwire.open_sync_sender(url, on_existing="truncate", start_step=0) as sender:
        sender.send(make_batch(**SIZES))
    got = s3_client(s3_endpoint).get_object(Bucket=s3_url[5:], Key="run/fence.rlw")
    token = got["Body"].read()[8:24]
    line = (
        f"fence: {url}/fence.rlw, id {token.hex()}: written when a sender last opened the "
        'destination (on_existing="truncate")'
    )
    cli = (sys.executable, "-m", "rlwire._api.cli", "inspect")
    for where in (url, f"{url}/fence.rlw"):
        described = run(*cli, where)
        assert described.returncode == 0, described.stderr
        assert described.stdout.splitlines()[-1].startswith(line), described.stdout
    # One of its step files, by its object's URL: that step and rank, no fence. Before,
    # the URL was taken for a destination, whose step 0 was "deleted by keep_last".
    described = run(*cli, f"{url}/step-00000000.rank-0000.rlw")
    assert described.returncode == 0, described.stderr
    assert described.stdout.startswith("step 0 rank 0:") and "fence" not in described.stdout


ROLLOUT_TYPES = textwrap.dedent("""
    import msgspec

    class Rollout(msgspec.Struct, array_like=True):
        token_ids: list[int]
        reward: float
        experts: bytes

    class RankBatch(msgspec.Struct, array_like=True):
        rollouts: list[Rollout]
""")


def test_inspect_names_the_fields_of_array_like_structs_given_their_type(tmp_path: Path) -> None:
    (tmp_path / "rollout_types.py").write_text(ROLLOUT_TYPES)
    send = textwrap.dedent("""
        import sys, anyio, rlwire
        from rollout_types import RankBatch, Rollout

        async def main() -> None:
            batch = RankBatch([Rollout(list(range(i + 2)), 0.5, bytes(3000 * i)) for i in range(5)])
            async with rlwire.open_sender(sys.argv[1], sidecar=("experts",)) as sender:
                await sender.send(batch)

        anyio.run(main)
    """)
    store = tmp_path / "steps"
    assert run(sys.executable, "-c", send, str(store), cwd=tmp_path).returncode == 0
    plain = run(sys.executable, "-m", "rlwire._api.cli", "inspect", str(store), cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "token_ids" not in plain.stdout and "[0]:" in plain.stdout
    typed = run(
        sys.executable,
        "-m",
        "rlwire._api.cli",
        "inspect",
        str(store),
        "--type",
        "rollout_types:RankBatch",
        cwd=tmp_path,
    )
    assert typed.returncode == 0, typed.stderr
    out = typed.stdout
    assert "rollouts: 5 items" in out and " Rollout" in out
    assert "token_ids: 2 items" in out and "reward: 0.5" in out
    assert "experts: bytes (0)" in out and "experts: bytes (3000)" in out
    # Over all five rollouts, 0 + 3000 + ... + 12000 bytes of experts (lists of ints and
    # floats count no bytes).
    assert "bytes per field, all 5: experts 30.0 kB" in out
    for bad, message in [
        ("rollout_types", "expected module:Name"),
        ("rollout_types:Nope", "has no attribute 'Nope'"),
        ("no_such_module:X", "No module named 'no_such_module'"),
    ]:
        failed = run(
            sys.executable,
            "-m",
            "rlwire._api.cli",
            "inspect",
            str(store),
            "--type",
            bad,
            cwd=tmp_path,
        )
        assert failed.returncode == 2 and message in failed.stderr, failed.stderr
        assert "ConfigError" in failed.stderr and "Traceback" not in failed.stderr


def test_bench_runs_the_suite_with_a_progress_bar_and_draws_its_charts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As `python3 tasks.py bench` runs it, in this environment instead of the task's .venv.
    import tasks

    monkeypatch.setenv("PYTHONPATH", tasks.bench_path())

    def suite(*options: str) -> subprocess.CompletedProcess[str]:
        return run(*map(str, tasks.bench_command(sys.executable, list(options))))

    results, plots = tmp_path / "results.json", tmp_path / "plots"
    small = ("--sinks", "file", "--backends", "asyncio", "--sizes", "0.004")
    rounds = ("--repeats", "1", "--warmup", "0")
    result = suite(*small, *rounds, "--json", str(results), "--plot", str(plots))
    assert result.returncode == 0, result.stderr
    assert "] 0/1 " in result.stderr and "[########################] 1/1" in result.stderr
    row = "| file | asyncio | 0.004 | send | "
    assert (
        row in result.stdout and "| file | asyncio | 0.004 | receive (verified) | " in result.stdout
    )
    saved = json.loads(results.read_text())
    assert saved["command"] == " ".join(
        ["python3 tasks.py bench", *small, *rounds, "--json", str(results), "--plot", str(plots)]
    )
    assert {r["operation"] for r in saved["ratios"]} == {"send", "receive (verified)"}
    for name in ("time.png", "stall.png", "memory.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = suite("--from-json", str(results))  # the same table, nothing run
    assert again.returncode == 0 and row in again.stdout and again.stderr == ""
    assert "--plot" in suite("--help").stdout
    moved = run(sys.executable, "-m", "rlwire._api.cli", "bench")
    assert moved.returncode == 2 and "python3 tasks.py bench" in moved.stderr


def test_the_tutorial_producer_and_trainer_work_as_two_processes(tmp_path: Path) -> None:
    # As the tutorial says: the trainer first, waiting; then the producer.
    tutorial = ROOT / "examples" / "tutorial"
    path = str(tmp_path / "steps")
    trainer = subprocess.Popen(
        [sys.executable, str(tutorial / "trainer.py"), path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        producer = run(sys.executable, str(tutorial / "producer.py"), path)
        assert producer.returncode == 0, producer.stderr
        out, err = trainer.communicate(timeout=60)
    finally:
        trainer.kill()
    assert trainer.returncode == 0, err
    assert producer.stdout.count("sent step") == 5
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == [f"step {i}" for i in range(5)]
    assert "routed_experts uint8" in out and "the producer finished the stream" in out


#: Examples that start a Ray cluster of their own: long (python3 tasks.py long).
OWN_CLUSTER = {"from_ray_put.py", "ray_worker_group.py"}


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(name, marks=[pytest.mark.long] if name in OWN_CLUSTER else [])
        for name in sorted(p.name for p in (ROOT / "examples").glob("*.py"))
    ],
)
def test_examples_run(example: str) -> None:
    if example == "torch_trainer.py" and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    result = run(sys.executable, str(ROOT / "examples" / example))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_quickstart_is_in_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    quickstart = (ROOT / "examples" / "quickstart.py").read_text()
    assert quickstart.strip() in readme


def test_make_batch_is_deterministic() -> None:
    a, b = make_batch(**SIZES, seed=3), make_batch(**SIZES, seed=3)
    assert_batches_equal(a, b)
    assert not np.array_equal(
        make_batch(**SIZES, seed=4).samples[0].logprobs[:10], a.samples[0].logprobs[:10]
    )
