"""Coming from a hand-written msgspec transport: your Structs unchanged, the transport
deleted (docs/how-to/from_msgspec.md).

``MicroBatch`` and ``RoutedExperts`` are shaped as RL frameworks declare them. The
"before" half is the transport frameworks write by hand around them: peel the routed
experts out into a raw side file (so that msgspec does not copy them), encode the rest,
write both under temporary names and rename, poll for the file on the other side, decode
and stitch the experts back. The "after" half sends the same objects with rlwire and
receives them typed. Both deliver equal micro-batches; then one byte of each stored step
is flipped, as a bad disk or a torn copy would: the hand-written reader returns wrong
numbers without a word, rlwire's raises ``CorruptFrameError``.

Run it: ``python examples/from_msgspec.py``.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

import anyio
import msgspec
import numpy as np

import rlwire

RANKS, MICRO_BATCHES, LAYERS, TOPK = 2, 3, 24, 8


# -- your types: unchanged --------------------------------------------------------------


class RoutedExperts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    data: bytes  # uint8 [seq_len, layers, topk], raw
    shape: list[int]
    dtype: str = "uint8"


class MicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    routed_experts: RoutedExperts | None = None


def micro_batch(step: int, rank: int, index: int) -> MicroBatch:
    rng = random.Random(f"{step}/{rank}/{index}")
    n = rng.randint(200, 400)
    experts = np.random.default_rng(rng.getrandbits(32)).integers(0, 64, (n, LAYERS, TOPK))
    return MicroBatch(
        input_ids=[rng.randrange(32_000) for _ in range(n)],
        loss_mask=[i >= 32 for i in range(n)],
        advantages=[rng.uniform(-1, 1) for _ in range(n)],
        inference_logprobs=[-rng.random() for _ in range(n)],
        routed_experts=RoutedExperts(experts.astype(np.uint8).tobytes(), [n, LAYERS, TOPK]),
    )


def per_rank(step: int) -> list[list[MicroBatch]]:
    return [[micro_batch(step, r, i) for i in range(MICRO_BATCHES)] for r in range(RANKS)]


# -- before: the transport written by hand (what you delete) ----------------------------

encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(list[MicroBatch])


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # readers see the whole file or none


async def send_by_hand(root: Path, step: int, ranks: list[list[MicroBatch]]) -> None:
    for rank, micro_batches in enumerate(ranks):
        side, peeled = [], []
        for mb in micro_batches:  # the experts go raw to a side file, not through msgspec
            experts = mb.routed_experts
            if experts is not None:
                side.append(experts.data)
                experts = msgspec.structs.replace(experts, data=b"")
            peeled.append(msgspec.structs.replace(mb, routed_experts=experts))
        main = encoder.encode(peeled)  # on the event loop: it holds the GIL throughout
        name = f"step-{step}-rank-{rank}"
        # The side file first, so that a reader who sees the main file finds it.
        await anyio.to_thread.run_sync(write_atomic, root / f"{name}.experts", b"".join(side))
        await anyio.to_thread.run_sync(write_atomic, root / f"{name}.msgpack", main)


def receive_by_hand(root: Path, step: int, rank: int, timeout: float) -> list[MicroBatch]:
    main = root / f"step-{step}-rank-{rank}.msgpack"
    deadline = time.monotonic() + timeout
    while not main.exists():  # poll for the step
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step} did not arrive")
        time.sleep(0.01)
    micro_batches = decoder.decode(main.read_bytes())
    side = memoryview((root / f"step-{step}-rank-{rank}.experts").read_bytes())
    at = 0
    for mb in micro_batches:  # stitch the experts back in
        if mb.routed_experts is not None:
            size = int(np.prod(mb.routed_experts.shape))
            mb.routed_experts.data, at = bytes(side[at : at + size]), at + size
    return micro_batches


# -- after: rlwire ----------------------------------------------------------------------


async def send_with_rlwire(url: str, steps: int) -> None:
    async with rlwire.open_sender(url, sidecar=("routed_experts",)) as sender:
        for step in range(steps):
            await sender.send_ranks(per_rank(step))


def receive_with_rlwire(url: str, rank: int, start_step: int = 0) -> list[MicroBatch]:
    with rlwire.open_receiver(
        url, rank=rank, type=list[MicroBatch], start_step=start_step
    ) as receiver:
        return receiver.receive(timeout=10)


# -- both, side by side -----------------------------------------------------------------


def flip_a_byte(path: Path) -> None:
    """Change one byte in the middle of ``path``, as a bad disk or a torn copy would."""
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


async def send_both(before: Path, after: Path, steps: int) -> None:
    for step in range(steps):
        await send_by_hand(before, step, per_rank(step))
    await send_with_rlwire(str(after), steps)


def main() -> None:
    steps = 2
    with tempfile.TemporaryDirectory() as tmp:  # a shared filesystem path in real use
        before, after = Path(tmp, "by-hand"), Path(tmp, "rlwire")
        before.mkdir()
        anyio.run(send_both, before, after, steps)
        for step in range(steps):
            for rank in range(RANKS):
                sent = per_rank(step)[rank]
                assert receive_by_hand(before, step, rank, timeout=10) == sent
                assert receive_with_rlwire(str(after), rank, start_step=step) == sent
            print(f"step {step}: before and after, every rank got its micro-batches, equal")

        # One byte flipped in the experts of step 1, rank 0, in each store.
        flip_a_byte(before / "step-1-rank-0.experts")
        flip_a_byte(next(after.glob("step-00000001.rank-0000.sidecar.*")))
        wrong = receive_by_hand(before, 1, 0, timeout=10) != per_rank(1)[0]
        print(f"before: the reader returned changed micro-batches without an error: {wrong}")
        try:
            receive_with_rlwire(str(after), 0, start_step=1)
        except rlwire.CorruptFrameError as exc:
            print(f"after: {type(exc).__name__}: {exc}")
        else:
            raise AssertionError("rlwire read a corrupt step")


if __name__ == "__main__":
    main()
