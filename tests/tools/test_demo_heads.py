"""tools/demo_heads.py: the training-side MTP and EAGLE-3 heads compute, in one teacher-forced unroll, the
same drafts as running the head one pair at a time with transformers' own Llama layers (the inference
order: catch-up pairs, then the chain feeding its own output); they write the checkpoint layouts the
loaders expect; and the MTP head drafts what graphspec's MTP drafter drafts, step for step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import demo_heads  # noqa: E402
import measure_acceptance  # noqa: E402

DRAFTS = 3


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and far faster on a shared, busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_target(vocab_size: int = 64, seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True, rope_theta=10000.0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights everywhere, norms included (unit norms would hide a swapped norm)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn_like(parameter) * (0.3 if parameter.ndim > 1 else 0.2) + (parameter.ndim == 1))
    return module.eval()


def causal(length: int) -> torch.Tensor:
    return torch.full((length, length), float("-inf")).triu(1)[None, None]


def chain_one_pair_at_a_time(run_layer, first_pairs, tokens, embed, start, drafts):
    """The oracle: drafts of the chain at pair `start`, as inference makes them. Pairs (embedded token,
    hidden, rotary position) of the catch-up (0..start), then each chained draft appends the pair (its
    token, the previous draft's chain output); every draft re-runs the whole pair sequence causally."""
    pairs = list(first_pairs[: start + 1])
    outputs = []
    for draft in range(drafts):
        chain, normed = run_layer(pairs)
        outputs.append(normed)
        token = tokens[start + 2 + draft]
        pairs.append((embed(token[None])[0], chain, pairs[-1][2] + 1))
    return outputs


def test_mtp_unroll_equals_transformers_layers_one_pair_at_a_time():
    target = tiny_target()
    head = randomize(demo_heads.MtpHead(target.config), seed=1)
    layer = LlamaDecoderLayer(target.config, layer_idx=0).eval()
    layer.load_state_dict(
        {k: v for k, v in head.state_dict().items() if k.split(".")[0] in dict(layer.named_children())}
    )
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(target.config)
    tokens = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(2))
    embed = target.get_input_embeddings()
    with torch.no_grad():
        features = target(input_ids=tokens, output_hidden_states=True).hidden_states[-1]
        unrolled = head.unroll(target, tokens, features, DRAFTS)

        def run_layer(pairs):  # eh_proj over [enorm(e), hnorm(h)], transformers' decoder layer, shared_head.norm
            e, h = (torch.stack([p[i] for p in pairs])[None] for i in (0, 1))
            x = head.eh_proj(torch.cat((head.enorm(e), head.hnorm(h)), -1))
            cos_sin = rotary(x, torch.tensor([[p[2] for p in pairs]]))
            out = head.shared_head.norm(layer(x, attention_mask=causal(x.shape[1]), position_embeddings=cos_sin))
            return out[0, -1], out[0, -1]

        first = [(embed(tokens[0, t + 1])[None][0], features[0, t], t + 1) for t in range(19)]
        for start in (0, 5, 14):
            expected = chain_one_pair_at_a_time(run_layer, first, tokens[0], embed, start, DRAFTS)
            for draft in range(DRAFTS):
                torch.testing.assert_close(
                    unrolled[draft][0, start], target.lm_head(expected[draft]), rtol=1e-4, atol=1e-4
                )


class OracleEagle3Layer(torch.nn.Module):
    """vLLM's llama_eagle3 decoder layer from transformers' pieces: LlamaAttention with q/k/v reading 2H."""

    def __init__(self, head: demo_heads.Eagle3Head) -> None:
        super().__init__()
        config = head.config
        config._attn_implementation = "eager"
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm, self.hidden_norm = LlamaRMSNorm(hidden, eps), LlamaRMSNorm(hidden, eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, torch.nn.Linear(2 * hidden, old.out_features, bias=False))
        self.post_attention_layernorm, self.mlp = LlamaRMSNorm(hidden, eps), LlamaMLP(config)
        self.load_state_dict(head.midlayer.state_dict())

    def forward(self, embedded, hidden, cos_sin):
        x = torch.cat((self.input_layernorm(embedded), self.hidden_norm(hidden)), -1)
        attended, _ = self.self_attn(x, position_embeddings=cos_sin, attention_mask=causal(x.shape[1]))
        residual = hidden + attended
        return residual + self.mlp(self.post_attention_layernorm(residual))


def make_eagle3(target, seed: int = 3, draft_vocab: int = 40) -> demo_heads.Eagle3Head:
    counts = torch.randint(0, 1000, (target.config.vocab_size,), generator=torch.Generator().manual_seed(seed))
    d2t = demo_heads.frequent_tokens_d2t(counts, draft_vocab)
    config = demo_heads.eagle3_config(target.config)
    layers = demo_heads.default_aux_layers(target.config.num_hidden_layers)
    return randomize(demo_heads.Eagle3Head(config, target.config.hidden_size, layers, d2t), seed)


def test_eagle3_unroll_equals_transformers_layers_one_pair_at_a_time():
    target = tiny_target()
    head = make_eagle3(target)
    oracle = OracleEagle3Layer(head).eval()
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(target.config)
    tokens = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(4))
    embed = target.get_input_embeddings()
    with torch.no_grad():
        states = target(input_ids=tokens, output_hidden_states=True).hidden_states
        # vLLM's aux layers for 4 layers: the inputs of layers 2, 2 and 1 (transformers' hidden_states[i]).
        assert head.aux_layer_ids == [2, 2, 1]
        features = torch.cat([states[i] for i in head.aux_layer_ids], -1)
        unrolled = head.unroll(target, tokens, features, DRAFTS)
        fused = head.fc(features[0])

        def run_layer(pairs):
            e, h = (torch.stack([p[i] for p in pairs])[None] for i in (0, 1))
            prenorm = oracle(e, h, rotary(e, torch.tensor([[p[2] for p in pairs]])))
            return prenorm[0, -1], head.norm(prenorm[0, -1])

        first = [(embed(tokens[0, t + 1])[None][0], fused[t], t) for t in range(19)]  # vLLM: the feature's position
        for start in (0, 7, 13):
            expected = chain_one_pair_at_a_time(run_layer, first, tokens[0], embed, start, DRAFTS)
            for draft in range(DRAFTS):
                torch.testing.assert_close(
                    unrolled[draft][0, start], head.lm_head(expected[draft]), rtol=1e-4, atol=1e-4
                )
    proposals = head.to_target_ids(unrolled[0][0].argmax(-1))
    assert head.t2d[proposals].all()  # drafted ids always lie in the draft vocabulary


def tensors_of(path: Path) -> dict[str, tuple[list[int], str]]:
    with safe_open(path, "pt") as handle:
        return {
            name: (list(handle.get_slice(name).get_shape()), handle.get_slice(name).get_dtype())
            for name in handle.keys()
        }


def test_mtp_head_saves_the_standalone_nextn_layout(tmp_path):
    target = tiny_target()
    head = randomize(demo_heads.MtpHead(target.config), seed=5)
    head.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMNextN"] and config["num_nextn_predict_layers"] == 1
    assert config["hidden_size"] == 32 and config["vocab_size"] == 64 and config["num_hidden_layers"] == 4
    stored = tensors_of(tmp_path / "model.safetensors")
    layer = "model.layers.0."
    expected = {
        "enorm.weight": [32], "hnorm.weight": [32], "eh_proj.weight": [32, 64], "shared_head.norm.weight": [32],
        "input_layernorm.weight": [32], "post_attention_layernorm.weight": [32],
        "self_attn.q_proj.weight": [32, 32], "self_attn.k_proj.weight": [16, 32], "self_attn.v_proj.weight": [16, 32],
        "self_attn.o_proj.weight": [32, 32], "mlp.gate_proj.weight": [64, 32], "mlp.up_proj.weight": [64, 32],
        "mlp.down_proj.weight": [32, 64],
    }  # fmt: skip
    assert stored == {layer + name: (shape, "F16") for name, shape in expected.items()}
    loaded = demo_heads.MtpHead.load(tmp_path)
    for name, tensor in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor.half().float())


def test_eagle3_head_saves_the_public_layout(tmp_path):
    target = tiny_target()
    head = make_eagle3(target)
    head.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (config["vocab_size"], config["draft_vocab_size"], config["target_hidden_size"]) == (64, 40, 32)
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2, 2, 1]}
    stored = tensors_of(tmp_path / "model.safetensors")
    expected = {
        "fc.weight": ([32, 96], "F16"), "norm.weight": ([32], "F16"), "lm_head.weight": ([40, 32], "F16"),
        "d2t": ([40], "I64"), "t2d": ([64], "BOOL"),
        "midlayer.input_layernorm.weight": ([32], "F16"), "midlayer.hidden_norm.weight": ([32], "F16"),
        "midlayer.post_attention_layernorm.weight": ([32], "F16"),
        "midlayer.self_attn.q_proj.weight": ([32, 64], "F16"), "midlayer.self_attn.k_proj.weight": ([16, 64], "F16"),
        "midlayer.self_attn.v_proj.weight": ([16, 64], "F16"), "midlayer.self_attn.o_proj.weight": ([32, 32], "F16"),
        "midlayer.mlp.gate_proj.weight": ([64, 32], "F16"), "midlayer.mlp.up_proj.weight": ([64, 32], "F16"),
        "midlayer.mlp.down_proj.weight": ([32, 64], "F16"),
    }  # fmt: skip
    assert stored == expected
    # d2t: the draft id d is target id d + d2t[d], ascending; t2d marks exactly those target ids.
    target_ids = torch.arange(40) + head.d2t
    assert (target_ids.diff() > 0).all() and head.t2d.sum() == 40 and head.t2d[target_ids].all()
    loaded = demo_heads.Eagle3Head.load(tmp_path)
    assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)


def test_replay_of_one_teacher_forced_pass_equals_drafting_step_by_step():
    """The premise of measuring heads with one unroll: while a chain's drafts match the target's tokens,
    the draft model's greedy chain equals its teacher-forced argmax. Checked on a draft model, where the
    step-by-step chain (measure_acceptance.DraftModel) is the reference."""

    class TeacherForced:
        def __init__(self, model):
            self.model = model

        def proposer(self, full, k):
            with torch.no_grad():
                predicted = self.model(input_ids=torch.tensor([full])).logits[0].argmax(-1).tolist()
            return lambda length: predicted[length - 1 : length - 1 + k]

    target, draft = randomize(tiny_target(vocab_size=6), 6), randomize(tiny_target(vocab_size=6), 7)
    prompts = [
        (f"p{i}", torch.randint(0, 6, (9,), generator=torch.Generator().manual_seed(i)).tolist()) for i in range(4)
    ]
    sequential = measure_acceptance.measure(target, draft, prompts, k=4, new_tokens=24, eos=set())
    parallel = measure_acceptance.measure(target, TeacherForced(draft), prompts, k=4, new_tokens=24, eos=set())
    assert sequential == parallel
    assert 0 < sequential.mean_accepted < 4  # drafts both accepted and rejected: the comparison means something


def test_ngram_proposals_follow_the_earliest_longest_match():
    propose = measure_acceptance.NGram(1, 3).proposer([5, 1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], k=4)
    assert propose(12) == [9, 1, 2, 3]  # suffix 1 2 3 first occurs at 1..3; 9 1 2 3 follow
    assert propose(4) == []  # 5 1 2 3: nothing earlier matches 3, 2 3 or 1 2 3
    assert propose(7) == [3, 9, 1, 2]  # suffix 9 1 2 never occurred before; 1 2 first at 1..2
    short = measure_acceptance.NGram(1, 3).proposer([1, 2, 1], k=4)
    assert short(3) == [2, 1]  # fewer than K: only committed tokens follow a match


def test_mtp_head_drafts_what_graphspecs_mtp_drafter_drafts(tmp_path):
    """The saved head, placed in the target checkpoint in DeepSeek-V3's layout (model.layers.{L}.*, which
    graphspec's MTP drafter reads today), accepts in graphspec's runtime exactly what the one-pass replay
    says at every step: the training convention (pairs, rotary positions, chaining) is the inference one.
    A vocabulary of 6 lets random weights get drafts both accepted and rejected."""
    from safetensors.torch import load_file, save_file

    import graphspec

    target = randomize(tiny_target(vocab_size=6, seed=8), 8)
    head = randomize(demo_heads.MtpHead(target.config), 9)
    target.save_pretrained(tmp_path / "target")
    head.save(tmp_path / "mtp", dtype=torch.float32)
    layers = target.config.num_hidden_layers
    weights = load_file(tmp_path / "target" / "model.safetensors")
    for name, tensor in load_file(tmp_path / "mtp" / "model.safetensors").items():
        weights[name.replace("model.layers.0.", f"model.layers.{layers}.", 1)] = tensor
    save_file(weights, tmp_path / "target" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "target" / "config.json").read_text())
    (tmp_path / "target" / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))

    k, new_tokens = 3, 20
    prompts = [torch.randint(0, 6, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 11)]
    runtime = graphspec.Runtime.from_pretrained(
        tmp_path / "target", "mtp", k=k, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=64,
        modes=("greedy",),
    )  # fmt: skip
    drafter = measure_acceptance.Head("mtp", target, head.eval())
    accepted = []
    for prompt in prompts:
        result = runtime.generate([prompt], max_new_tokens=new_tokens, stop_token_ids=[])[0]
        tokens, _ = measure_acceptance.continuation(target, prompt, k, new_tokens, set())
        assert result.token_ids == tokens[:new_tokens]
        full = prompt + tokens
        # graphspec's prefill commits the target's first token; its steps start one token later.
        expected = measure_acceptance.replay(drafter.proposer(full, k), full, len(prompt) + 1, new_tokens - 1, k)
        assert result.stats.accepted_per_step == expected
        accepted += expected
    assert 0 < sum(accepted) < k * len(accepted)


def test_ngram_replay_accepts_what_graphspecs_ngram_drafter_accepts(tmp_path):
    """measure_acceptance.NGram's proposals replayed give graphspec's n-gram runtime's accepted counts."""
    import graphspec

    target = randomize(tiny_target(vocab_size=5, seed=10), 10)
    target.save_pretrained(tmp_path / "target")
    k, new_tokens = 4, 24
    runtime = graphspec.Runtime.from_pretrained(
        tmp_path / "target", "ngram", k=k, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=64,
        modes=("greedy",),
    )  # fmt: skip
    accepted = []
    for length in (6, 13):
        prompt = torch.randint(0, 5, (length,), generator=torch.Generator().manual_seed(length)).tolist()
        result = runtime.generate([prompt], max_new_tokens=new_tokens, stop_token_ids=[])[0]
        tokens, _ = measure_acceptance.continuation(target, prompt, k, new_tokens, set())
        assert result.token_ids == tokens[:new_tokens]
        full = prompt + tokens
        propose = measure_acceptance.NGram(1, 3).proposer(full, k)
        expected = measure_acceptance.replay(propose, full, len(prompt) + 1, new_tokens - 1, k)
        assert result.stats.accepted_per_step == expected
        accepted += expected
    assert 0 < sum(accepted) < k * len(accepted)
