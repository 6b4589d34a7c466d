"""counters.timed: host seconds by named phase, process-wide."""

import pytest

from graphspec.counters import PHASE_SECONDS, timed


def test_timed_adds_each_block_to_its_phase_even_when_the_block_raises():
    before = PHASE_SECONDS["test.phase"]
    with timed("test.phase"):
        sum(range(10_000))
    once = PHASE_SECONDS["test.phase"]
    assert once > before
    with pytest.raises(RuntimeError), timed("test.phase"):
        sum(range(10_000))
        raise RuntimeError("the block failed")
    assert PHASE_SECONDS["test.phase"] > once
