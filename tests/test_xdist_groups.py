"""The suite's groups hold: under ``--dist loadgroup`` (the test command's), pytest-xdist
sends every test of one ``xdist_group`` to one worker, which it does by appending
``@group`` to the test's id. If that stops (pytest-xdist#1386, with pytest 9.2), the Ray
cluster and the chaos campaign run once per worker, and the suite outgrows its time."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("grouping")
def test_a_grouped_test_carries_its_group_under_loadgroup(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest-xdist's --dist loadgroup (python3 tasks.py test)")
    assert request.node.nodeid.endswith("@grouping"), request.node.nodeid


def test_the_ray_tests_carry_their_group_under_loadgroup(
    request: pytest.FixtureRequest, ray_url: str
) -> None:
    """The group tests/conftest.py gives every test on the Ray cluster reaches
    pytest-xdist (its hook must run before xdist's reads the groups)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest-xdist's --dist loadgroup (python3 tasks.py test)")
    assert request.node.nodeid.endswith("@ray"), request.node.nodeid
