"""The receiver's words: last_step, wait_next / await_next, and validate= as the sender's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import make_batch

import rlwire


@pytest.mark.anyio
async def test_last_step_and_wait_next_with_their_deprecated_names(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(1))
    with rlwire.open_receiver(tmp_path) as receiver:
        assert receiver.last_step is None
        assert receiver.wait_next(timeout=5) and await receiver.await_next(timeout=0)
        receiver.receive(timeout=5)
        assert receiver.last_step == 0
        with pytest.warns(DeprecationWarning, match="use receiver.last_step"):
            assert receiver.step == 0
        with pytest.warns(DeprecationWarning, match=r"use receiver.wait_next\(\)"):
            assert not receiver.wait(timeout=0.01)


@pytest.mark.anyio
async def test_receiver_validates_values_with_checks(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        await sender.send({"reward": np.array([1.0, np.nan])})
        await sender.send({"reward": np.array([1.0])})
    with rlwire.open_receiver(tmp_path, type=dict, validate=False) as receiver:
        assert np.isnan(receiver.receive(timeout=5)["reward"][1])
    checks = rlwire.Checks(finite=("reward",))
    with rlwire.open_receiver(tmp_path, type=dict, validate=checks) as receiver:
        with pytest.raises(rlwire.SchemaError, match=r"reward.*not finite") as info:
            receiver.receive(timeout=5)
        assert info.value.step == 0
        receiver.skip()
        assert receiver.receive(timeout=5)["reward"].tolist() == [1.0]
    wrong = rlwire.Checks(finite=("no_such_field",))
    with rlwire.open_receiver(tmp_path, type=dict, validate=wrong) as receiver:
        with pytest.raises(rlwire.ConfigError, match="no_such_field"):
            receiver.receive(timeout=5)
    with pytest.raises(rlwire.ConfigError, match="validate must be True, False or a rlwire"):
        rlwire.open_receiver(tmp_path, validate="yes")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_timeout_that_is_not_a_number_is_a_config_error(tmp_path: Path) -> None:
    # NaN never compares as passed: a wait for a step not sent yet never ended.
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(1))
    with rlwire.open_receiver(tmp_path) as receiver:
        for timeout in (float("nan"), "1", True):
            match = rf"timeout must be a number of seconds or None, got {timeout!r}"
            with pytest.raises(rlwire.ConfigError, match=match):
                receiver.receive(timeout=timeout)  # type: ignore[arg-type]
            with pytest.raises(rlwire.ConfigError, match=match):
                await receiver.areceive(timeout=timeout)  # type: ignore[arg-type]
            with pytest.raises(rlwire.ConfigError, match=match):
                receiver.wait_next(timeout=timeout)  # type: ignore[arg-type]
            with pytest.raises(rlwire.ConfigError, match=match):
                await receiver.await_next(timeout=timeout)  # type: ignore[arg-type]
            with pytest.raises(rlwire.ConfigError, match=match):
                next(receiver.parts(timeout=timeout))  # type: ignore[arg-type]
            with pytest.raises(rlwire.ConfigError, match=match):
                await receiver.aparts(timeout=timeout).__anext__()  # type: ignore[arg-type]
        assert receiver.receive(timeout=5) is not None and receiver.last_step == 0


@pytest.mark.anyio
async def test_a_timeout_beyond_any_float_waits_as_inf_does(tmp_path: Path) -> None:
    """An int too large for a float (10**400) raised Python's OverflowError; it is a
    wait without end, as ``math.inf`` (or an immediate timeout, when negative)."""
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(1))
    with rlwire.open_receiver(tmp_path) as receiver:
        assert receiver.wait_next(timeout=10**400)
        assert await receiver.await_next(timeout=10**400)
        assert receiver.receive(timeout=10**400) is not None and receiver.last_step == 0
        with pytest.raises(rlwire.ReceiveTimeout):
            receiver.receive(timeout=-(10**400))
        with pytest.raises(rlwire.ReceiveTimeout):
            await receiver.areceive(timeout=-(10**400))
