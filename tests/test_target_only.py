"""benchmarks/target_only.py: the traced, lowered target-only decoder generates exactly what the reference
decoder generates (fp32, CPU), and its graph holds in-place cache writes only."""

from __future__ import annotations

import torch

from benchmarks import target_only
from graphspec.models import load_model
from graphspec.ops import OPS
from graphspec.reference import reference_generate
from tests.checkpoints import make_checkpoint


def test_traced_decoder_matches_reference_greedy(tmp_path) -> None:
    model = load_model(make_checkpoint(tmp_path / "target", "llama")).model
    prompts = torch.randint(3, model.spec.vocab_size, (3, 7), generator=torch.Generator().manual_seed(0)).tolist()
    result = target_only.generate(model, prompts, new_tokens=9, max_seq_len=32)
    assert result.tokens == reference_generate(model, prompts, 9, max_seq_len=32)
    assert not result.captured and result.decode_ms_per_token > 0


def test_decode_graph_writes_the_cache_in_place(tmp_path) -> None:
    model = load_model(make_checkpoint(tmp_path / "target", "qwen3")).model
    gm = target_only.trace_decode(model, batch=2, max_seq_len=16, sm=None)
    targets = [node.target for node in gm.graph.nodes if node.op == "call_function"]
    # fused with rotary and attention, in place
    assert targets.count(OPS["rotary_kv_attention"]) == model.spec.num_layers
    assert not {OPS["kv_write"], OPS["rotary"], OPS["rotary_kv_write"], OPS["attention"]} & set(targets)
    assert OPS["kv_update"] not in targets  # no whole-cache copies left
