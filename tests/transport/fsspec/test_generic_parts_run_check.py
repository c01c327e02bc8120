"""On a generic fsspec store (here ``memory://``, whose reads are whole objects), the
checks that a step's parts are all of one run read part 0's first bytes, never part 0
whole again: a receiver waiting part way through a step (it checks at most every
second) fetched a 16 MB part 0 six times for one step."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import numpy as np
import pytest

import rlwire
from rlwire.transport.fsspec._generic import GenericStore


def test_waiting_for_a_part_reads_part_0_whole_once(monkeypatch: pytest.MonkeyPatch) -> None:
    whole: list[str] = []
    get = GenericStore.get

    def counted(self: GenericStore, path: str, size: int | None = None) -> Any:
        data = get(self, path, size)
        if data is not None and len(data) > 1 << 20:
            whole.append(path.rsplit("/", 1)[-1])
        return data

    monkeypatch.setattr(GenericStore, "get", counted)
    url = f"memory://{uuid.uuid4().hex}/run"
    producer = rlwire.open_sync_sender(url)
    writer = producer.open_step()
    writer.__enter__()
    writer.put([{"token_ids": np.arange(2_000_000)}], key="a")  # 16 MB

    def later() -> None:
        time.sleep(2.5)  # the receiver waits for part 1, checking part 0 twice or more
        writer.put([{"token_ids": np.arange(4)}], key="b")
        writer.__exit__(None, None, None)
        producer.close()

    thread = threading.Thread(target=later)
    thread.start()
    try:
        with rlwire.open_receiver(url, type=list, record_consumed=False) as receiver:
            got = [part.index for part in receiver.parts(timeout=20)]
    finally:
        thread.join()
    assert got == [0, 1]
    assert whole == ["step-00000000.rank-0000.part-000000.rlw"]
