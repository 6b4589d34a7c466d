"""The drafter seam's shared pieces (graphspec/drafters/base.py)."""

import torch

from graphspec import ops
from graphspec.drafters.base import StepView


def test_pick_positions_takes_every_position_in_one_call_or_picks_each():
    """A block drafter's K positions: with pick_all (greedy: one argmax launch) the tokens are those pick
    gives position by position (ties go to the first index either way); without it, pick runs per
    position with that position's index (its sampling lane)."""
    logits = torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(0))
    logits[1, 2, [7, 30]] = 9.0  # a tie: the first index wins
    seen = []

    def pick(row_logits, index):
        seen.append(index)
        return ops.argmax(row_logits)

    looped = StepView({}, 4, pick).pick_positions(logits)
    assert seen == [0, 1, 2, 3]
    together = StepView({}, 4, pick, pick_all=ops.argmax).pick_positions(logits)
    assert seen == [0, 1, 2, 3]  # pick_all alone, no per-position call
    assert torch.equal(together, looped) and together.shape == (3, 4) and together[1, 2] == 7
