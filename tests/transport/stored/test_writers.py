"""Writers that meet at one destination: two senders committing the same step, a
sender killed while it deletes an earlier run (overwrite, truncate), and the temporary
files killed writers of marks and probes leave. On the file sink and on fsspec."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import forked
import numpy as np
import pytest
from helpers import assert_batches_equal, make_batch

import rlwire
from rlwire._core.slicing import run_sliced
from rlwire.codecs import MsgpackCodec
from rlwire.transport import FileSink, FileSource
from rlwire.transport._stored.marks import rewrite_mark
from rlwire.transport._stored.names import REWRITE_NAME, main_name, sidecar_name

pytestmark = pytest.mark.anyio

CODEC = MsgpackCodec(sidecar=["routed_experts"])
# Messages without routed_experts go through a codec that does not name it: CODEC warns
# once about a sidecar name no message holds, and whether this module's first message
# holds it depends on the order in which xdist hands the tests out.
PLAIN = MsgpackCodec()


def frames(who: int, ranks: int, *, sidecar: bool = True) -> list[rlwire.Frame]:
    return [
        (CODEC if sidecar else PLAIN).encode(
            {
                "who": who,
                "rank": r,
                **({"routed_experts": np.full(5000, who, np.uint8)} if sidecar else {}),
            }
        )
        for r in range(ranks)
    ]


def read_back(path: Path, step: int, rank: int) -> dict[str, object]:
    frame = FileSource(path, rank=rank).read(step)
    assert frame is not None
    return dict(CODEC.decode(frame))


@pytest.mark.parametrize("sidecar", [True, False])
def test_two_senders_commit_one_step_the_second_gets_step_exists(
    tmp_path: Path, sidecar: bool
) -> None:
    first, second = FileSink(tmp_path), FileSink(tmp_path)
    first.open("error")
    second.open("error")
    # Both checked that step 0 is free and wrote it; the second commits first.
    late = run_sliced(first.stage(0, frames(1, 2, sidecar=sidecar)))
    early = run_sliced(second.stage(0, frames(2, 2, sidecar=sidecar)))
    early.commit()
    with pytest.raises(rlwire.StepExistsError, match="another sender committed this step first"):
        late.commit()
    assert not late.visible
    late.discard()
    for rank in range(2):  # the winner's data, whole: never a mix
        got = read_back(tmp_path, 0, rank)
        assert got["who"] == 2 and got["rank"] == rank
        if sidecar:
            assert (np.asarray(got["routed_experts"]) == 2).all()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_a_killed_commits_sidecars_do_not_block_resume(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    sink.open("error")
    run_sliced(sink.stage(0, frames(1, 1))).commit()
    (tmp_path / sidecar_name(1, 0)).write_bytes(b"left by a sender killed mid-commit")
    resumed = FileSink(tmp_path)
    assert resumed.open("resume") == 1
    assert not (tmp_path / sidecar_name(1, 0)).exists()
    run_sliced(resumed.stage(1, frames(3, 1))).commit()
    assert read_back(tmp_path, 1, 0)["who"] == 3


KILLED_WHILE_DELETING = textwrap.dedent("""
    import os, signal, sys, anyio, rlwire
    from rlwire.testing import make_batch
    real_unlink, deleted = os.unlink, []
    def unlink(path, *args, **kwargs):
        if os.path.basename(os.fspath(path)).startswith("step-"):
            deleted.append(path)
            if len(deleted) == int(sys.argv[3]):
                os.kill(os.getpid(), signal.SIGKILL)
        return real_unlink(path, *args, **kwargs)
    os.unlink = unlink
    async def main():
        start = None if sys.argv[2] == "overwrite" else 2
        async with rlwire.open_sender(sys.argv[1], on_existing=sys.argv[2], start_step=start):
            pass
    anyio.run(main)
""")


@pytest.mark.parametrize(("mode", "kill_at"), [("overwrite", 3), ("truncate", 2)])
async def test_resume_refuses_an_overwrite_or_truncate_killed_midway(
    tmp_path: Path, mode: str, kill_at: int
) -> None:
    old = [make_batch(1, seed=s) for s in range(6)]
    async with rlwire.open_sender(tmp_path) as sender:
        for batch in old:
            await sender.send(batch)
    done = forked.run(
        [sys.executable, "-c", KILLED_WHILE_DELETING, str(tmp_path), mode, str(kill_at)]
    )
    assert done.returncode == -9
    assert (tmp_path / main_name(1, 0)).exists()  # old steps are left
    repair = (
        "on_existing='overwrite'" if mode == "overwrite" else "start_step=2, on_existing='truncate'"
    )
    with pytest.raises(rlwire.StepExistsError, match="was cut short") as caught:
        async with rlwire.open_sender(tmp_path, on_existing="resume"):
            pass
    assert repair in str(caught.value)
    assert (tmp_path / REWRITE_NAME).exists()
    if mode == "truncate":  # a truncate keeping steps the cut one deletes is refused too
        with pytest.raises(rlwire.StepExistsError, match="a truncate from step 2"):
            async with rlwire.open_sender(tmp_path, on_existing="truncate", start_step=4):
                pass
    new = make_batch(1, seed=99)
    start = None if mode == "overwrite" else 2
    async with rlwire.open_sender(tmp_path, on_existing=mode, start_step=start) as sender:  # type: ignore[arg-type]
        step = await sender.send(new)
    assert not (tmp_path / REWRITE_NAME).exists()
    async with rlwire.open_sender(tmp_path, on_existing="resume") as sender:
        assert sender.next_step == step + 1
    with rlwire.open_receiver(tmp_path, start_step=step) as receiver:
        assert_batches_equal(receiver.receive(timeout=5), new)
    stored = sorted(int(p.name[5:13]) for p in tmp_path.glob("step-*.rlw"))
    assert stored == list(range(step + 1))  # nothing of the old run after the new step


LEFTOVERS = [
    ".consumed.rank-0000.rlw.0a1b2c3d4e5f.tmp",
    ".end.rlw.0a1b2c3d4e5f.tmp",
    ".rlwire-probe.4242.0a1b2c3d.tmp",
    ".step-00000003.rank-0000.rlw.0a1b2c3d4e5f.tmp",
]


@pytest.mark.parametrize("mode", ["resume", "overwrite", "truncate"])
async def test_open_removes_what_killed_writers_of_marks_and_probes_left(
    tmp_path: Path, mode: str
) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(1))
    for name in LEFTOVERS:  # what a kill between create and rename leaves
        (tmp_path / name).write_bytes(b"x")
    start = 1 if mode == "truncate" else None
    async with rlwire.open_sender(tmp_path, on_existing=mode, start_step=start):  # type: ignore[arg-type]
        pass
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


@pytest.mark.parametrize("url", ["memory://writers-leftovers"])
async def test_fsspec_open_removes_mark_leftovers_and_honours_the_rewrite_mark(url: str) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    async with rlwire.open_sender(url, on_existing="overwrite") as sender:
        await sender.send(make_batch(1))
    for name in LEFTOVERS:
        fs.pipe(f"/writers-leftovers/{name}", b"x")
    fs.pipe(f"/writers-leftovers/{REWRITE_NAME}", rewrite_mark(0))
    with pytest.raises(rlwire.StepExistsError, match="an overwrite was cut short"):
        async with rlwire.open_sender(url, on_existing="resume"):
            pass
    async with rlwire.open_sender(url, on_existing="overwrite"):
        pass
    left = [p.rpartition("/")[2] for p in fs.find("/writers-leftovers")]
    assert not [n for n in left if n.startswith(".") or n == REWRITE_NAME]
