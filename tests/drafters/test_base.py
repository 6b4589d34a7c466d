"""The drafter seam's shared pieces (graphspec/drafters/base.py)."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import ops
from graphspec.drafters.base import StepView, rows_at


def test_pick_positions_takes_every_position_in_one_call_or_picks_each():
    """A block drafter's K positions: greedy (one argmax launch) gives the tokens pick
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
    together = StepView({}, 4, pick, greedy=True).pick_positions(logits)
    assert seen == [0, 1, 2, 3]  # one argmax launch, no per-position call
    assert torch.equal(together, looped) and together.shape == (3, 4) and together[1, 2] == 7


def test_pick_mapped_greedy_is_the_full_rows_first_maximum_without_the_full_row():
    """Reduced logits over ascending target ids: greedy maps the first maximum over the map's columns, the
    full row's torch.argmax (ties included); sampling picks from the full row (-inf off the map), which
    both modes return as the drafts' q."""
    vocab, ids = 40, torch.tensor([1, 4, 9, 16, 25, 36])
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    logits[2, [1, 4]] = 5.0  # a tie between ids 4 and 25: the first wins
    full = torch.full((3, vocab), float("-inf")).index_copy(1, ids, logits)
    drafts, q = StepView({}, 4, pick=None, greedy=True).pick_mapped(logits, ids, vocab, 0)
    assert torch.equal(q, full)
    assert torch.equal(drafts, full.argmax(-1)) and drafts[2] == 4
    seen = []

    def pick(row_logits, index):  # a sampler's stand-in: records what it was given
        seen.append((row_logits, index))
        return ops.argmax(row_logits)

    drafts, q = StepView({}, 4, pick).pick_mapped(logits, ids, vocab, 2)
    assert torch.equal(q, full) and len(seen) == 1 and torch.equal(seen[0][0], full) and seen[0][1] == 2
    # Every position at once (a block drafter's [B, K, N]) and the unmapped case (ids None: full already).
    block = logits.view(3, 2, 3)
    drafts, _ = StepView({}, 2, pick=None, greedy=True).pick_mapped(block, ids[:3], vocab)
    assert torch.equal(drafts, ids[:3][block.argmax(-1)])
    drafts, q = StepView({}, 4, pick, greedy=False).pick_mapped(full, None, vocab, 1)
    assert q is full and torch.equal(drafts, full.argmax(-1))


def test_rows_at_is_each_rows_entry_at_its_index_by_one_gather():
    """rows_at(index, *xs) == x[arange(B), index] for every x (one T), as an index_select of the flat view,
    which is what the lowering turns into one row-gather launch (the advanced index would be aten.index)."""
    g = torch.Generator().manual_seed(0)
    out, prenorm = torch.randn(4, 5, 8, generator=g), torch.randn(4, 5, 8, generator=g)
    index = torch.tensor([0, 4, 2, 4])
    got = rows_at(index, out, prenorm)
    rows = torch.arange(4)
    assert len(got) == 2
    assert torch.equal(got[0], out[rows, index]) and torch.equal(got[1], prenorm[rows, index])
    gm = make_fx(lambda i, x: rows_at(i, x)[0])(index, out)
    targets = {node.target for node in gm.graph.nodes if node.op == "call_function"}
    assert torch.ops.aten.index_select.default in targets and torch.ops.aten.index.Tensor not in targets
