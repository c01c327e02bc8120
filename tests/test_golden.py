"""Messages written by an earlier rlwire (tests/golden/) keep decoding to the same objects."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest
from golden_cases import CASES, GOLDEN, ZMQ_GOLDEN, batch
from helpers import assert_batches_equal
from test_format_doc import assert_same

import rlwire


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("verify", [True, False])
def test_golden_files_decode(name: str, verify: bool) -> None:
    make, _, type_ = CASES[name]
    with rlwire.open_receiver(GOLDEN / name, type=type_, verify=verify) as receiver:
        got = receiver.receive(timeout=5)
    want = make()
    if isinstance(want, rlwire.TrainingBatch):
        assert_batches_equal(got, want)
    else:
        assert_same(got, want)


def test_every_case_has_its_files() -> None:
    assert sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()) == sorted(CASES)


def test_a_flipped_byte_in_a_golden_file_is_caught(tmp_path: Path) -> None:
    shutil.copytree(GOLDEN / "msgpack-sidecar-zstd", tmp_path, dirs_exist_ok=True)
    side = next(tmp_path.glob("*.sidecar.rlw"))
    data = bytearray(side.read_bytes())
    data[70] ^= 1  # inside the first sidecar buffer (the prelude is 64 bytes)
    side.write_bytes(bytes(data))
    with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match=r"segment \d+: buffer \d+") as caught:
            receiver.poll()
    assert (caught.value.step, caught.value.rank) == (0, 0)


def test_the_chunked_case_holds_chunked_containers() -> None:
    """The case is only worth keeping if its header really refers to chunks (ext 4, 5)."""
    from rlwire._frame.compression import decompress
    from rlwire.transport import FileSource

    frame = decompress(FileSource(GOLDEN / "msgpack-chunked").read(0))
    codes: set[int] = set()

    def ext_hook(code: int, data: memoryview) -> None:
        codes.add(code)

    msgspec.msgpack.decode(frame.header, ext_hook=ext_hook)
    assert {4, 5} <= codes and len(frame.header) < 1024


def test_golden_zeromq_messages_decode(tmp_path: Path) -> None:
    """The ZeroMQ messages a version-2.0 sender sent for one batch (several data
    messages and a seal), played to a real receiver by a raw ROUTER socket, still come
    back as that batch, verified; with one byte flipped, as a CorruptFrameError."""
    import zmq

    messages = msgspec.msgpack.decode(ZMQ_GOLDEN.read_bytes())
    assert len(messages) > 2 and messages[-1][0] == b"seal"
    flipped = [list(m) for m in messages]
    flipped[1][-1] = bytes([flipped[1][-1][0] ^ 1]) + flipped[1][-1][1:]
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVTIMEO, 30_000)
    url = f"zmq+ipc://{tmp_path}/golden.sock"
    router.bind(url.removeprefix("zmq+"))
    try:
        with rlwire.open_receiver(url) as receiver:
            peer, kind, _ = router.recv_multipart()
            assert kind == b"ready"
            for message in messages:
                router.send_multipart([peer, *message])
            assert_batches_equal(receiver.receive(timeout=30), batch())
            for message in flipped:
                router.send_multipart([peer, *message])
            with pytest.raises(rlwire.CorruptFrameError, match="does not match its checksum"):
                receiver.receive(timeout=30)
    finally:
        router.close()
        context.term()
