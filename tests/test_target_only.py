"""benchmarks/target_only.py: the traced, lowered target-only decoder generates exactly what the reference
decoder generates (fp32, CPU), and its graph holds in-place cache writes only."""

from __future__ import annotations

import torch

from benchmarks import target_only
from graphspec.input_names import weight_input_names
from graphspec.models import load_model
from graphspec.ops import OPS
from graphspec.reference import reference_generate
from graphspec.trace import model_inputs
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


def test_decode_graph_lowers_its_projections_as_the_step_does(tmp_path) -> None:
    """Its weights are target.* inputs as in the step, so at batch 1 every projection takes the one-row GEMV
    (lowering/registry.py lowers a product to the GEMVs only where the weight operand is a model weight)."""
    model = load_model(make_checkpoint(tmp_path / "target", "llama")).model
    gm = target_only.trace_decode(model, batch=1, max_seq_len=16, sm=90)
    weights = {node.meta.get("gs_input") for node in gm.graph.find_nodes(op="placeholder")}
    assert set(weight_input_names(model_inputs(model))) <= weights
    census = target_only.lowering_census(gm)
    # per layer q/k/v, o, gate/up and down, then the lm_head (CPU: the norms are not folded into them)
    gemvs = sum(n for name, n in census.items() if name.endswith((":one_row", ":one_row_long_k")))
    assert gemvs == 4 * model.spec.num_layers + 1 and "torch products" not in census, census
