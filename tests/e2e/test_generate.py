"""Runtime.generate end to end on tiny real checkpoints (CPU, fp32): lossless, stats, rollback,
stop tokens, sampling reproducibility, and bad input refused before any work. The lossless and rollback
tests run both CPU attention paths: torch's per-row attention, the C++ loop (kernels/attention_cpu_native.py)."""

import numpy as np
import pytest
import torch
from graphspec.kernels import attention_cpu_native

import graphspec
from graphspec import ops
from graphspec.counters import COUNTERS
from graphspec.errors import InputError
from graphspec.op_nodes import positional_args
from graphspec.reference import reference_generate
from tests.e2e.conftest import MAX_SEQ
from tests.e2e.seeded_sampling import assert_seeded_sampling_repeats_and_top_k_1_is_greedy
from tests.engine_hooks import between_steps

# Mixed prompt lengths 1..64; five prompts with buckets (1, 4) also exercise padding and splitting.
PROMPT_LENGTHS = [1, 7, 64, 3, 20]


def prompts(seed: int = 0, lengths=PROMPT_LENGTHS) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(params=["torch", "cpp"])
def cpu_attention(request, monkeypatch):
    """The CPU attention path a test runs: torch's (as where the C++ loop did not build) or the C++ loop
    (what a compile_cpu step builds; prefill chunks longer than its MAX_QUERIES still take torch's)."""
    if request.param == "torch":
        monkeypatch.setattr(attention_cpu_native, "_compiled", [None])
    else:
        assert attention_cpu_native.build()
    ran = []
    attend = attention_cpu_native.attend

    def spy(*args, **kwargs):
        out = attend(*args, **kwargs)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(attention_cpu_native, "attend", spy)
    yield request.param
    assert ran and any(ran) == (request.param == "cpp")


@pytest.mark.usefixtures("cpu_attention")
@pytest.mark.parametrize(
    ("pair", "k"),
    [("unrelated", 1), ("unrelated", 4), ("unrelated", 7), ("self", 2), ("mixed_family", 4), ("qwen2", 7)],
)
def test_greedy_is_lossless_against_transformers(runtime_for, hf_greedy, pair, k):
    runtime = runtime_for(pair, k)
    batch = prompts(seed=k)
    results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
    reference = reference_generate(runtime.target, batch, 24, max_seq_len=MAX_SEQ)
    for prompt, result, plain in zip(batch, results, reference, strict=True):
        assert result.token_ids == hf_greedy(pair, prompt, 24, []) == plain
        assert result.finish_reason == "length"


@pytest.mark.parametrize(("pair", "k"), [("unrelated", 4), ("self", 3), ("qwen2", 7)])
def test_folded_norms_are_lossless_against_transformers(runtime_for, hf_greedy, pair, k):
    """Target and draft with their norms folded into the projections (models/fold_norms.py): the step's residual
    adds are addmms written in place, its SwiGLUs scaled_silu_mul, and the draft's one-token forwards scale q/k/v
    in their attention (fuse_row_scale; not Qwen2's, whose q/k/v have biases); greedy output is transformers' token
    for token, and a draft equal to the target still accepts every draft."""
    runtime = runtime_for(pair, k, fold_norms=True)
    step = runtime.compiled.graphs[("greedy", 4)]
    targets = {node.target for node in step.graph.nodes if node.op == "call_function"}
    assert {torch.ops.aten.addmm_.default, ops.OPS["scaled_silu_mul"]} <= targets
    assert ops.OPS["silu_mul"] not in targets and ops.OPS["row_scale"] not in targets
    attentions = step.graph.find_nodes(op="call_function", target=ops.OPS["rotary_kv_attention"])
    row_scaled = [node for node in attentions if positional_args(node)[14] is not None]
    assert bool(row_scaled) == (pair != "qwen2")
    runtime.stats = type(runtime.stats)(runtime.k)
    batch = prompts(seed=k + 20)
    results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy(pair, prompt, 24, [])
        if pair == "self":
            assert set(result.stats.accepted_per_step[:-1]) == {k}


@pytest.mark.parametrize("max_new_tokens", [1, 2, 64])
def test_greedy_is_lossless_for_any_length(runtime_for, hf_greedy, max_new_tokens):
    runtime = runtime_for("unrelated", 4)
    batch = prompts(seed=9, lengths=[5, 30])
    results = runtime.generate(batch, max_new_tokens=max_new_tokens, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy("unrelated", prompt, max_new_tokens, [])
        assert len(result.token_ids) == max_new_tokens


def test_self_draft_accepts_every_token(runtime_for, hf_greedy):
    runtime = runtime_for("self", 4)
    runtime.stats = type(runtime.stats)(runtime.k)
    batch = prompts(seed=1)
    results = runtime.generate(batch, max_new_tokens=21, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy("self", prompt, 21, [])
        assert result.stats.accepted_per_step == [4] * 4  # 1 prefill token + 4 steps x 5 tokens
    assert runtime.stats.acceptance_rate == 1.0
    assert runtime.stats.acceptance_by_position == [1.0] * 4
    assert runtime.stats.mean_tokens_per_step == 5.0


def test_stop_token_inside_an_accepted_block_ends_the_output(runtime_for, hf_greedy):
    runtime = runtime_for("self", 4)
    prompt = prompts(seed=2, lengths=[6])[0]
    free = hf_greedy("self", prompt, 30, [])
    # A token first seen in the middle of a step's block (prefill emits 1 token, steps emit 5 each).
    position = next(i for i, t in enumerate(free) if i % 5 not in (0,) and t not in free[:i])
    stop = free[position]
    result = runtime.generate([prompt], max_new_tokens=30, stop_token_ids=[stop])[0]
    assert result.token_ids == free[: position + 1] == hf_greedy("self", prompt, 30, [stop])
    assert result.finish_reason == "stop"


def test_default_stop_is_the_checkpoint_eos(runtime_for):
    runtime = runtime_for("unrelated", 4)  # the runtime the other tests use: the eos does not depend on k
    assert runtime.eos_token_ids == [2]


@pytest.mark.usefixtures("cpu_attention")
def test_kv_rollback_survives_poisoned_dead_slots(runtime_for):
    """After every step, NaN-poison every cache entry at or beyond what a row has committed (and the
    whole spare slot): later output is unchanged, so nothing ever reads dead KV."""
    runtime = runtime_for("unrelated", 4)
    batch = prompts(seed=3, lengths=[4, 11, 2])
    clean = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    assert any(a < 4 for r in clean for a in r.stats.accepted_per_step)  # rejections happened
    target, draft = runtime.state["target_cache"], runtime.state["draft_cache"]

    def poison(slots: list[int], lengths: list[int]) -> None:
        for slot, length in zip(slots, lengths, strict=True):
            # target KV is valid below committed_len - 1; the draft re-writes from committed_len - 2.
            target[:, :, slot, :, length - 1 :] = float("nan")
            draft[:, :, slot, :, length - 2 :] = float("nan")
        target[:, :, -1] = float("nan")
        draft[:, :, -1] = float("nan")

    with between_steps(runtime, poison):
        poisoned = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    assert [r.token_ids for r in poisoned] == [r.token_ids for r in clean]
    # Greedy verify would emit the same tokens from any drafts: the drafts themselves must not change.
    assert [r.stats.accepted_per_step for r in poisoned] == [r.stats.accepted_per_step for r in clean]


def test_sampling_is_reproducible_per_seed_and_batch_independent(runtime_for):
    runtime = runtime_for("unrelated", 3, modes=("greedy", "sample"))
    batch = prompts(seed=4, lengths=[5, 9, 2])
    first = assert_seeded_sampling_repeats_and_top_k_1_is_greedy(runtime, batch)
    alone = runtime.generate(batch[:1], max_new_tokens=16, temperature=0.9, seed=123)
    assert alone[0].token_ids == first[0].token_ids
    other = runtime.generate(batch, max_new_tokens=16, temperature=0.9, seed=124)
    assert [r.token_ids for r in other] != [r.token_ids for r in first]


def test_streaming_yields_every_token_then_the_result(runtime_for):
    runtime = runtime_for("unrelated", 4)
    batch = prompts(seed=5, lengths=[3, 8])
    events = list(runtime.stream(batch, max_new_tokens=10, stop_token_ids=[]))
    results = runtime.generate(batch, max_new_tokens=10, stop_token_ids=[])
    for index, result in enumerate(results):
        tokens = [item for i, item in events if i == index and isinstance(item, int)]
        finals = [item for i, item in events if i == index and not isinstance(item, int)]
        assert tokens == result.token_ids and len(finals) == 1


def test_token_ids_from_tensors_and_numpy_generate_the_same(runtime_for):
    runtime = runtime_for("unrelated", 4)
    rows = prompts(seed=11, lengths=[9, 9])

    def tokens(batch) -> list[list[int]]:
        return [r.token_ids for r in runtime.generate(batch, max_new_tokens=6, stop_token_ids=[])]

    expected = tokens(rows)
    assert tokens([np.array(rows[0]), torch.tensor(rows[1])]) == expected
    assert tokens(torch.tensor(rows)) == expected  # a 2-D tensor is one prompt per row


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda rt: rt.generate([[]]), "prompt 0 is empty"),
        (lambda rt: rt.generate([]), "non-empty list"),
        (lambda rt: rt.generate([[1, 2, 128]]), r"outside \[0, 128\)"),
        (lambda rt: rt.generate([[1, -1]]), r"outside \[0, 128\)"),
        (lambda rt: rt.generate([[1] * 150], max_new_tokens=10), "exceeds max_seq_len 160"),
        (lambda rt: rt.generate([[1]], max_new_tokens=0), "max_new_tokens must be an int >= 1"),
        (lambda rt: rt.generate(["hello"]), "no tokenizer"),
        (lambda rt: rt.generate([[1]], temperature=-1), "temperature"),
        (lambda rt: rt.generate([[1]], temperature=0.5), "without the 'sample' step"),
        (lambda rt: rt.generate([[1]], top_p=0.0), "top_p"),
        (lambda rt: rt.generate([[1]], stop_token_ids=["x"]), "stop_token_ids"),
        (lambda rt: rt.generate([[1.5]]), "int token ids"),
    ],
)
def test_bad_generate_input_is_refused_before_any_work(runtime_for, call, message):
    runtime = runtime_for("unrelated", 4)
    before = (COUNTERS.prefills, COUNTERS.eager_steps)
    with pytest.raises(InputError, match=message):
        call(runtime)
    assert (COUNTERS.prefills, COUNTERS.eager_steps) == before


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 0}, "k must be between 1 and"),
        ({"k": 2.0}, "k must be an int"),
        ({"k": 17}, "k must be between 1 and 16"),
        ({"batch_sizes": (0, 2)}, "batch_sizes must be positive ints"),
        ({"dtype": "int8"}, "dtype"),
        ({"numerics": "exact"}, "numerics must be one of default, invariant"),
        ({"numerics": "invariant"}, "numerics='invariant' needs the Triton kernels: device cuda"),
        ({"numerics": "invariant", "device": "cuda", "lowering": "reference"}, "lowering 'reference'"),
        ({"fold_norms": "yes"}, "fold_norms must be True or False"),
        ({"fold_norms": True, "numerics": "invariant", "device": "cuda"}, "not row-invariant"),
        (
            {"device": "cuda:0"} if not torch.cuda.is_available() else {"max_seq_len": 10**6},
            "CUDA is not available|max_seq_len",
        ),
    ],
)
def test_bad_compile_options_are_refused(pair_dirs, options, message):
    target, draft = pair_dirs("unrelated")
    base = dict(k=2, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=64)
    traces = COUNTERS.traces
    with pytest.raises(InputError, match=message):
        graphspec.compile(target, draft, **{**base, **options})
    assert COUNTERS.traces == traces


def test_mismatched_vocabularies_are_refused(checkpoint_factory, pair_dirs):
    target, _ = pair_dirs("unrelated")
    other_vocab = checkpoint_factory("llama", 7, vocab_size=96)
    with pytest.raises(InputError, match=r"vocabularies differ.*128.*96"):
        graphspec.compile(target, other_vocab, k=2, dtype="float32", device="cpu", max_seq_len=64)
