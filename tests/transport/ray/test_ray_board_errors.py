"""ray:// errors of the board's calls, against what a thirtieth session's review found:
a seal that differs from the committed parts is named in a message bounded whatever
the number of parts (it listed every key of both: megabytes for a seal of 16,500
parts)."""

from __future__ import annotations

import pytest

from rlwire import Frame, StepExistsError
from rlwire.abc import PartInfo, Seal, SinkOptions
from rlwire.aio import run_sliced
from rlwire.transport import parse_url
from rlwire.transport.ray import RaySink

#: Parts in the seal of the test below: a large step's, as a real run's.
PARTS = 16_500


def _frame() -> Frame:
    return Frame(b"header", (memoryview(bytearray(64)),))


def test_a_seal_that_differs_is_named_in_a_bounded_message(ray_url: str) -> None:
    """Three parts committed, a seal listing 16,500 keys whose second differs: the
    error names the first differing parts and how many differ, in a few hundred
    characters (it was every key of both lists: 154 kB here)."""
    sink = RaySink.from_url(parse_url(ray_url), SinkOptions())
    try:
        sink.open("overwrite")
        for index, key in enumerate(["k0", "k1", "k2"]):
            part = PartInfo(rank=0, index=index, key=key, cost=1.0)
            run_sliced(sink.stage_part(0, part, _frame())).commit()
        keys = ["k0", "other", *(f"k{i}" for i in range(2, PARTS))]
        seal = Seal(step=0, keys=(tuple(keys),), costs=((1.0,) * PARTS,))
        with pytest.raises(StepExistsError) as caught:
            sink.seal(seal)
        message = str(caught.value)
        assert len(message) < 1000, len(message)
        assert "rank 0 of step 0" in message
        assert "3 parts" in message and f"the seal lists {PARTS}" in message
        assert "part 1 is 'k1'" in message and "'other'" in message
        assert f"{PARTS - 2} parts differ" in message
    finally:
        sink.close()
