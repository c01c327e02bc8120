"""``rlwire inspect`` on hostile and odd messages: a bounded description, or exit
status 2, within time and memory bounds (defect 6)."""

from __future__ import annotations

import contextlib
import io
import resource
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import zstandard
from msgspec.msgpack import Ext
from msgspec.msgpack import encode as mp

import rlwire
from rlwire import Frame
from rlwire._api.cli import main
from rlwire._core.slicing import run_sliced
from rlwire.codecs import MsgpackCodec
from rlwire.testing import make_batch
from rlwire.transport import FileSink

MiB = 1 << 20


def store(root: Path, frame: Frame) -> None:
    sink = FileSink(root)
    sink.open("resume")
    run_sliced(sink.stage(0, [frame])).commit()


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def inspect(root: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The finished ``rlwire inspect``, and the CPU seconds it took. CPU, not wall time:
    on the loaded test machine a run of under 2 s of CPU took 33-37 s on the clock,
    past the bounds below, which are for the work the command does."""
    began = cpu_of_children()
    proc = subprocess.run(
        [sys.executable, "-m", "rlwire._api.cli", "inspect", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limit_memory,
        check=False,
    )
    return proc, cpu_of_children() - began


def inspect_here(path: Path | str, *args: str) -> tuple[int, str, str]:
    """``rlwire inspect`` run by its entry point in this process (for ordinary files:
    a new Python and rlwire per call cost most of these tests' time): its exit status,
    stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["inspect", str(path), *args])
    return status, out.getvalue(), err.getvalue()


def nested(depth: int) -> Any:
    value: Any = [1]
    for _ in range(depth):
        value = [value]
    return value


def test_a_900_deep_message_is_described_without_a_traceback(tmp_path: Path) -> None:
    """Defect 6: a RecursionError traceback on a message the receiver reads fine."""
    header = b"\x82\xa4deep" + b"\x91" * 900 + b"\x01\xa3ids" + mp(list(range(10)))
    frame = Frame(header, ())
    assert MsgpackCodec().decode(frame) == {"deep": nested(899), "ids": list(range(10))}
    store(tmp_path, frame)
    proc, _ = inspect(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "nested too deep to show" in proc.stdout
    assert len(proc.stdout.splitlines()) < 40


def test_a_small_zstd_file_of_empty_lists_exits_2_quickly(tmp_path: Path) -> None:
    """Defect 6: more than 30 s at ~600 MB on a 2.4 kB file; now the decode bound
    refuses it, and inspect says so with status 2."""
    chunk = b"\xdd" + struct.pack(">I", MiB) + b"\x90" * MiB
    ranges = [bound for i in range(60) for bound in (i * len(chunk), (i + 1) * len(chunk))]
    header = mp(Ext(4, mp([0, 60 * MiB, ranges])))
    bulk = chunk * 60
    packed = zstandard.ZstdCompressor(level=19).compress(bulk)
    store(
        tmp_path,
        Frame(
            header, (memoryview(packed),), compression=(0, 2), raw_sizes=(len(header), len(bulk))
        ),
    )
    for args in ((), ("--type", "builtins:list")):
        proc, seconds = inspect(tmp_path, *args)
        assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
        assert "FrameTooLargeError" in proc.stderr and "Traceback" not in proc.stderr
        assert seconds < 30


def test_a_wide_message_gets_a_bounded_description(tmp_path: Path) -> None:
    """Over a million values: the walk adding up sizes stops at its bound ("over").
    The header is msgspec's, one msgpack value (rlwire's encoder, which walks the value
    in Python to chunk it, took 3-5 s of this test's time)."""
    value = {
        "many": {f"key{i}": [i, [i]] for i in range(50_000)},
        "long": [[1, 2]] * 300_000,
        "text": "x" * 100_000,
    }
    store(tmp_path, Frame(mp(value), ()))
    proc, seconds = inspect(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout) < 10_000 and "... more fields" in proc.stdout
    assert "300000 items" in proc.stdout
    assert proc.stdout.startswith("step 0 rank 0: over ")
    assert seconds < 30


def test_a_step_file_given_names_the_step_rank_and_part(tmp_path: Path) -> None:
    """A stored file as the path: its directory, step and rank (a part: its manifest).
    Before, the file was taken for a directory (``Not a directory``, naming a
    ``fields-000`` file inside it)."""
    sink = FileSink(tmp_path)
    sink.open("resume")
    frames = [MsgpackCodec().encode({"step": step, "x": list(range(step + 1))}) for step in (0, 1)]
    for step, frame in enumerate(frames):
        run_sliced(sink.stage(step, [frame, frame])).commit()
    status, out, err = inspect_here(tmp_path / "step-00000001.rank-0001.rlw")
    assert status == 0, err
    assert out.startswith("step 1 rank 1:")
    status, out, err = inspect_here(tmp_path / "step-00000001.rank-0001.rlw", "--step", "0")
    assert status == 2
    assert "--step 0: the file step-00000001.rank-0001.rlw is of step 1" in err
    for path, what in [
        (tmp_path / "no-such-run", "no such directory"),
        (tmp_path / "step-00000001.rank-0001.rlw" / "x", "no such directory"),
    ]:
        status, _, err = inspect_here(path)
        assert (status, what in err) == (2, True), err
    (tmp_path / "notes.txt").write_text("hello")
    status, _, err = inspect_here(tmp_path / "notes.txt")
    assert status == 2 and "not a stored step's file" in err


def test_output_cut_short_by_its_reader_is_no_traceback(tmp_path: Path) -> None:
    """``rlwire inspect run | head -1``: the pipe closed early ended in a traceback."""
    store(tmp_path, MsgpackCodec().encode({"x": [[i] * 8 for i in range(20_000)]}))
    cli = f"{sys.executable} -m rlwire._api.cli inspect {tmp_path} | head -c 10"
    proc = subprocess.run(cli, shell=True, capture_output=True, text=True, timeout=60, check=False)
    assert len(proc.stdout) == 10
    assert "Traceback" not in proc.stderr, proc.stderr


def fence_line(root: Path, token: bytes, how: str) -> str:
    return (
        f"fence: {root / 'fence.rlw'}, id {token.hex()}: written when a sender last opened "
        f"the destination{how}; that sender alone commits and deletes there now, those "
        "opened before it are fenced off\n"
    )


def test_the_fence_is_described_with_the_destination_and_alone(tmp_path: Path) -> None:
    """``fence.rlw`` (format 1.7): its id and the ``on_existing`` of the open that wrote
    it, after the step of a destination and as the file given. Before, the file given
    was "not a stored step's file" and a destination's description left it out."""
    store(tmp_path, MsgpackCodec().encode({"x": [1, 2]}))  # opened with resume: a fence
    fence = tmp_path / "fence.rlw"
    token = fence.read_bytes()[8:24]
    line = fence_line(tmp_path, token, ' (on_existing="resume")')
    status, out, err = inspect_here(tmp_path)
    assert status == 0, err
    assert out.startswith("step 0 rank 0:") and out.endswith(line)
    assert inspect_here(fence) == (0, line, "")
    status, out, _ = inspect_here(tmp_path, "--step", "3")  # no such step: its fence still
    assert status == 1 and out == line
    for option in ("--step", "--rank", "--part"):
        status, _, err = inspect_here(fence, option, "0")
        assert status == 2 and f"{option}: " in err, err
        assert "is a destination's fence" in err
    # An on_existing this rlwire does not know is left unsaid.
    fence.write_bytes(b"RLWF" + struct.pack("<HH", 1, 9) + token + b"later")
    status, out, _ = inspect_here(fence)
    assert (status, out) == (0, fence_line(tmp_path, token, ""))
    fence.write_bytes(b"RLWF\x01\x00")
    status, _, err = inspect_here(fence)
    assert status == 2 and "CorruptFrameError" in err
    assert "a fence is 24 to 40 bytes, this one 6" in err
    assert "Traceback" not in err


def test_a_destination_without_a_fence_says_so(tmp_path: Path) -> None:
    """Opened with ``error`` where there was none, a destination has no fence."""
    sink = FileSink(tmp_path)
    sink.open("error")
    run_sliced(sink.stage(0, [MsgpackCodec().encode({"x": 1})])).commit()
    assert not (tmp_path / "fence.rlw").exists()
    status, out, err = inspect_here(tmp_path)
    assert status == 0, err
    assert out.splitlines()[-1].startswith(f"fence: none at {tmp_path / 'fence.rlw'}")
    status, out, err = inspect_here(tmp_path / "fence.rlw")
    assert status == 1 and out == ""
    assert err.startswith("fence: none at") and 'on_existing="error"' in err
    status, _, err = inspect_here(tmp_path / "no-such-run" / "fence.rlw")
    assert status == 2 and "no such directory" in err


def test_a_step_filled_part_by_part_lists_its_parts(tmp_path: Path) -> None:
    """A step filled part by part: its tree, then its parts' manifests (``--part N``:
    one); ``--json``: a JSON list of them. Before, the tree was followed by a
    ConfigError naming a file that does not exist and the Python API's
    ``manifest(step, part=i)``, exit status 2 (``--json`` too)."""
    with rlwire.open_sync_sender(tmp_path) as sender:
        with sender.open_step(ranks=2) as writer:
            for key in range(3):
                writer.put(make_batch(1, 16, seed=key).samples, key=key)
        with sender.open_step(ranks=3) as writer:  # one part: none for ranks 1 and 2
            writer.put(make_batch(1, 16).samples, key=0)
    status, out, err = inspect_here(tmp_path)
    assert status == 0, err
    assert out.startswith("step 0 rank 0:"), out
    assert "step 0 rank 0 was filled part by part: 2 parts (--part N:" in out
    assert "manifest of step 0 rank 0 part 0 (key 0)" in out
    assert "manifest of step 0 rank 0 part 1 (key 2)" in out
    assert out.splitlines()[-1].startswith("fence: ")
    status, out, err = inspect_here(tmp_path, "--json", "--rank", "1")
    assert status == 0, err
    listed = msgspec.json.decode(out)
    assert [(m["rank"], m["part"], m["key"]) for m in listed] == [(1, 0, 1)]
    status, out, err = inspect_here(tmp_path, "--part", "1")
    assert status == 0, err
    assert out.startswith("manifest of step 0 rank 0 part 1 (key 2)")
    status, out, err = inspect_here(tmp_path, "--step", "1", "--rank", "2")
    assert status == 0, err
    assert "step 1 rank 2 was filled part by part: none of its parts is for this rank" in out


def test_a_step_files_url_names_its_step_and_rank(tmp_path: Path) -> None:
    """The URL of a step's file (``memory://run/step-00000001.rank-0001.rlw``,
    ``file:///...``): its destination, step and rank, as its path does. Before, it was
    taken for a destination, its step 0 "deleted by keep_last" (StepGapError); a
    ``file://`` URL of another file named a made-up path, and one of no directory
    printed "fence: none at ..."."""
    url = f"memory://inspect-url-{tmp_path.name}"
    with rlwire.open_sync_sender(url) as sender:
        sender.send_ranks([{"x": [0]}, {"x": [1]}])
        sender.send_ranks([{"x": [2]}, {"x": [3]}])
    status, out, err = inspect_here(f"{url}/step-00000001.rank-0001.rlw")
    assert status == 0, err
    assert out.startswith("step 1 rank 1:") and "[0]: 3" in out and "fence" not in out
    status, _, err = inspect_here(f"{url}/step-00000001.rank-0001.rlw", "--rank", "0")
    assert status == 2 and "--rank 0: the file step-00000001.rank-0001.rlw is of rank 1" in err
    with rlwire.open_sync_sender(tmp_path / "run") as sender:
        sender.send({"x": [4]})
    status, out, err = inspect_here(f"file://{tmp_path}/run/step-00000000.rank-0000.rlw")
    assert status == 0 and out.startswith("step 0 rank 0:"), err
    (tmp_path / "notes.txt").write_text("hello")
    for where, what in [
        (f"file://{tmp_path}/notes.txt", "not a stored step's file"),
        (f"file://{tmp_path}/no-such-run", "no such directory"),
        (f"file://{tmp_path}/no-such-run/fence.rlw", "no such directory"),
    ]:
        status, out, err = inspect_here(where)
        assert (status, out, what in err) == (2, "", True), (where, out, err)


def test_a_step_not_stored_is_told_alike_with_the_steps_that_are(tmp_path: Path) -> None:
    """A step keep_last deleted, or after the end: exit status 1 and the steps stored,
    with the option that shows one, with ``--json`` or without. Before, without it, a
    deleted step was a StepGapError (exit 2) whose advice was the library's (``skip()``,
    ``start_step=5``), a step after the end an EndOfStream, where ``--json`` said "no
    step 0" (exit 1)."""
    with rlwire.open_sync_sender(tmp_path, keep_last=2) as sender:
        for _ in range(4):
            sender.send({"x": [1]})
        with rlwire.open_receiver(tmp_path, type=dict) as receiver:
            for _ in range(4):
                receiver.receive(timeout=5)
        sender.send({"x": [2]})
        sender.finish()
    told = "no step {} for rank 0 (steps 3 to 4 are stored for it: --step 3 for the oldest)\n"
    for step in (0, 9):
        for json in ([], ["--json"]):
            status, _, err = inspect_here(tmp_path, "--step", str(step), *json)
            assert (status, err) == (1, f"{tmp_path}: {told.format(step)}"), (json, err)
    status, _, err = inspect_here(tmp_path, "--step", "0", "--rank", "1")
    assert (status, err) == (1, f"{tmp_path}: no step 0 for rank 1 (no step is stored for it)\n")
