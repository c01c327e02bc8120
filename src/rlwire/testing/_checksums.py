"""The contract on checksums: a sink records the checksum of every segment the sender
asks for, and its source verifies them and says so.

A sink that drops them moves every step intact as long as nothing damages it, so no
round trip can tell; what tells is the frame a source returns,
:attr:`rlwire.Frame.verified` (the stored layout sets it; a source of your own sets it
once it has checked every segment). The frame is sent through the real sender and
receiver with the contract's pass-through codec, which hands the test the frame's bytes
and its ``verified`` flag.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlwire._frame.frame import Frame
from rlwire.codecs._registry import register_codec
from rlwire.testing._fixtures import ContractFixtures, Endpoint, receive_beside
from rlwire.testing._pieces import FRAME_CODEC, FrameCodec, ReceivedFrame

__all__ = ["ChecksumsContract"]


def _frame() -> Frame:
    """A header, a buffer beside it and one in the sidecar, of random bytes."""
    rng = np.random.default_rng(26)
    buffers = tuple(rng.integers(0, 256, n, np.uint8).data for n in (70_000, 5000))
    return Frame(b"rlwire contract: checksums", buffers, sidecar=frozenset({1}))


class ChecksumsContract(ContractFixtures):
    """Checksums pass through the sink to a receiver that verifies them."""

    @pytest.mark.parametrize(
        ("checksum", "verify"),
        [(True, True), (False, True), (True, False)],
        ids=["recorded-verified", "not-recorded", "not-verified"],
    )
    async def test_checksums_pass_through_to_the_receiver(
        self, endpoint: Endpoint, checksum: bool, verify: bool
    ) -> None:
        """Sent with ``checksum=True`` to a receiver with ``verify=True``, a step
        arrives verified (:attr:`rlwire.Frame.verified`): the sink recorded a checksum
        of every segment and its source checked them. Sent without checksums, or read
        without verifying, it is not said to be verified."""
        register_codec(FRAME_CODEC, FrameCodec)  # the receiver looks the name up
        frame = _frame()

        async def send() -> None:
            async with endpoint.open_sender(codec=FrameCodec(), checksum=checksum) as sender:
                await sender.send(frame)

        with endpoint.open_receiver(verify=verify) as receiver:
            got = await receive_beside(send, lambda: receiver.areceive(timeout=self.timeout))
        assert isinstance(got, ReceivedFrame), f"decoded into {type(got).__name__}"
        assert got.buffers == [bytes(b) for b in frame.views()]
        want = checksum and verify
        assert got.verified is want, (
            "sent with checksums and read with verify=True, the step arrived unverified: "
            "the sink dropped the checksums, or its source did not check them (or does "
            "not set Frame.verified once it did)"
            if want
            else f"the step arrived said verified, sent with checksum={checksum} and "
            f"read with verify={verify}"
        )
