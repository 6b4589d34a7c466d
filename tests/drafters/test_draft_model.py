"""The draft-model drafter (graphspec/drafters/draft_model.py) on its own: its chained drafts follow the
distribution its proposal reports. (Its losslessness and rollback run end to end in tests/e2e.)"""

import torch

from graphspec.drafters.base import PrefillView
from graphspec.drafters.draft_model import DraftModel
from graphspec.models.loading import load_model
from tests.drafters.rejection import assert_drafts_follow_their_logits


def test_chained_drafts_follow_the_distribution_their_proposal_reports(checkpoint_factory):
    """Draft 2 is the draft model's next token after draft 1: each draft must follow the distribution
    its proposal reports (rejection.assert_drafts_follow_their_logits)."""
    drafter = DraftModel(load_model(checkpoint_factory("llama", 1, num_hidden_layers=1)))
    prompt = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(5))
    state = {s.name: s.allocate("cpu") for s in drafter.states(1, 64, 2, torch.float32)}
    empty = torch.empty(0)
    drafter.prefill(PrefillView(prompt[:, :-1], torch.tensor([0]), torch.tensor([8]), empty, empty), state)
    # The step's catch-up runs the last two committed tokens (positions 7 and 8) again.
    assert_drafts_follow_their_logits(drafter, state, prompt[0, -2:], 9, k=2, temperature=0.02)
