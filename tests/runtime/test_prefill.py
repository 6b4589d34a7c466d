"""The compiled prefill chunk programs against the reference prefill (fp32, CPU): logits, first tokens
and every live cache/state entry, for mixed prompt lengths, chunk boundaries mid-prompt, a one-token
prompt and a prompt that fills the cache; and the program itself (passes, chunk sizes, bad input)."""

from __future__ import annotations

import pytest
import torch

import graphspec
from graphspec import ops, trace_prefill
from graphspec.errors import InputError
from graphspec.runtime.graphs import HostRecorder
from graphspec.runtime.prefill import PrefillProgram
from graphspec.trace import TARGET_CACHE
from tests.checkpoints import make_mtp_checkpoint

MAX_SEQ_LEN = 64
K = 2
# 16 tokens per chunk over the bucket: bucket 1 runs 16 positions per row, bucket 4 runs 4.
PREFILL_TOKENS = 16


def compile_pair(target, draft, **options) -> graphspec.Runtime:
    return graphspec.Runtime.from_pretrained(
        target,
        draft,
        k=K,
        batch_sizes=(1, 4),
        dtype="float32",
        device="cpu",
        max_seq_len=MAX_SEQ_LEN,
        prefill_tokens=PREFILL_TOKENS,
        **options,
    )


@pytest.fixture(scope="module")
def runtime(checkpoint_factory) -> graphspec.Runtime:
    return compile_pair(checkpoint_factory("llama", 0), checkpoint_factory("qwen3", 1, num_hidden_layers=1))


@pytest.fixture(scope="module")
def ngram_runtime(checkpoint_factory) -> graphspec.Runtime:
    return compile_pair(checkpoint_factory("llama", 0), "ngram")


@pytest.fixture(scope="module", params=[1, 2], ids=["1_layer", "2_layers"])
def mtp_runtime(request, tmp_path_factory) -> graphspec.Runtime:
    directory = make_mtp_checkpoint(
        tmp_path_factory.mktemp("mtp_prefill"), "deepseek_v3", seed=7, mtp_layers=request.param
    )
    return compile_pair(directory, "mtp")


@pytest.fixture(scope="module")
def dflash_runtime(checkpoint_factory, tmp_path_factory) -> graphspec.Runtime:
    from tests.dflash_oracle import make_dflash_drafter

    target = checkpoint_factory("llama", 0)
    drafter = make_dflash_drafter(tmp_path_factory.mktemp("dflash_prefill"), target, seed=3, block_size=K + 1)
    return compile_pair(target, drafter, modes=("greedy",))


def greedy_params(rows: int) -> dict[str, torch.Tensor]:
    return {
        "temperature": torch.zeros(rows),
        "top_k": torch.zeros(rows, dtype=torch.int64),
        "top_p": torch.ones(rows),
        "seed": torch.zeros(rows, dtype=torch.int64),
        "step_counter": torch.zeros(rows, dtype=torch.int64),
    }


def random_prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def run_both(runtime: graphspec.Runtime, prompts, slots, params=None):
    """(compiled first tokens, compiled state, reference first tokens, reference state), each from
    state poisoned with NaN (and -1 ids) first, so an entry either prefill forgot stays visible."""
    params = params or greedy_params(len(prompts))
    results = []
    for run in (runtime.prefill, runtime.reference_prefill):
        for tensor in runtime.state.values():
            tensor.fill_(float("nan") if tensor.dtype.is_floating_point else -1)
        first = run(prompts, slots, params)
        results += [first.clone(), {name: tensor.clone() for name, tensor in runtime.state.items()}]
    return results


def live_kv(cache: torch.Tensor, slot: int, length: int) -> torch.Tensor:
    return cache[:, :, slot, :, :length]  # [L, 2, Hkv, length, D]


def assert_prefills_equal(runtime, prompts, slots) -> None:
    first, state, reference_first, reference_state = run_both(runtime, prompts, slots)
    assert first.tolist() == reference_first.tolist()
    for name in runtime.state:
        if not name.endswith("cache"):
            continue
        for slot, prompt in zip(slots, prompts, strict=True):
            compiled, reference = (
                live_kv(state[name], slot, len(prompt)),
                live_kv(reference_state[name], slot, len(prompt)),
            )
            assert torch.isfinite(compiled).all(), f"{name} slot {slot}: a live entry was not written"
            torch.testing.assert_close(compiled, reference, rtol=1e-5, atol=1e-5, msg=f"{name} slot {slot}")


def test_compiled_prefill_matches_reference_mixed_lengths(runtime):
    """Four rows in bucket 4 (4 positions per chunk): lengths 1, 5 (a boundary mid-prompt), 8 (ends
    exactly on one), 13, in slots out of order."""
    prompts = random_prompts([1, 5, 8, 13], runtime.vocab_size)
    assert runtime.compiled.prefill_chunks(4) == (4,)
    assert_prefills_equal(runtime, prompts, [2, 0, 3, 1])


def test_compiled_prefill_logits_match_reference(runtime):
    """The first token's distribution, not just its argmax: sampled first tokens agree for every seed."""
    prompts = random_prompts([3, 17, 30], runtime.vocab_size, seed=1)
    params = greedy_params(3)
    params["temperature"] = torch.full((3,), 1.0)
    for seed in range(8):
        params["seed"] = torch.full((3,), seed, dtype=torch.int64)
        first, _, reference_first, _ = run_both(runtime, prompts, [0, 1, 2], params)
        assert first.tolist() == reference_first.tolist()


@pytest.fixture(scope="module")
def sized_runtime(checkpoint_factory) -> graphspec.Runtime:
    """Bucket 1 with two chunk programs: 128 and 32 positions per row (on the CPU sizes step by 4)."""
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("qwen3", 1, num_hidden_layers=1)
    return graphspec.Runtime.from_pretrained(
        target, draft, k=K, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=256, prefill_tokens=128
    )


@pytest.mark.parametrize("length", [200, 40])
def test_compiled_prefill_mixes_chunk_sizes(sized_runtime, length):
    """200 positions: one 128-position chunk, then three of 32 (from position 128 on); 40: two of 32."""
    assert sized_runtime.compiled.prefill_chunks(1) == (128, 32)
    assert trace_prefill.chunk_plan(length, (128, 32)) == {200: [128, 32, 32, 32], 40: [32, 32]}[length]
    assert_prefills_equal(sized_runtime, random_prompts([length], sized_runtime.vocab_size, seed=length), [0])


@pytest.mark.parametrize(
    ("positions", "plan"),
    [(1, [16]), (16, [16]), (17, [16, 16]), (130, [128, 16]), (300, [128, 128, 16, 16, 16]), (2, [16])],
)
def test_chunk_plan_whole_chunks_then_the_tail_in_the_largest_size_that_fits(positions, plan):
    assert trace_prefill.chunk_plan(positions, (128, 16)) == plan


def test_chunk_sizes_are_eighths_down_to_16_positions():
    assert trace_prefill.chunk_sizes(1, 8192, 4096, "cuda") == (4096, 512, 64)
    assert trace_prefill.chunk_sizes(8, 8192, 4096, "cuda:1") == (512, 64)
    assert trace_prefill.chunk_sizes(4, 64, 16, "cuda") == (4,)
    assert trace_prefill.chunk_sizes(1, 1000, 512, "cuda") == (500,)  # 500 is not a multiple of 8


def test_chunk_sizes_on_the_cpu_are_quarters_down_to_16_positions():
    assert trace_prefill.chunk_sizes(1, 8192, 4096, "cpu") == (4096, 1024, 256)
    assert trace_prefill.chunk_sizes(4, 512, 2048, "cpu") == (512, 128, 32)
    assert trace_prefill.chunk_sizes(8, 512, 2048, "cpu") == (256, 64, 16)
    assert trace_prefill.chunk_sizes(1, 96, 2048, "cpu") == (96, 24)  # a quarter of 24 is under 16


def test_compiled_prefill_one_token_prompt(runtime):
    assert_prefills_equal(runtime, [[5]], [3])


def test_compiled_prefill_prompt_filling_the_cache(runtime):
    """The longest prompt a step still fits after (max_seq_len - k - 1 tokens), alone (bucket 1, 16
    positions per chunk: its last chunk ends at the cache's end)."""
    prompts = random_prompts([MAX_SEQ_LEN - K - 1], runtime.vocab_size, seed=2)
    assert runtime.compiled.prefill_chunks(1) == (16,)
    assert_prefills_equal(runtime, prompts, [1])


def test_compiled_prefill_leaves_other_slots_alone(runtime):
    for tensor in runtime.state.values():
        tensor.fill_(7)
    runtime.prefill(random_prompts([6, 10], runtime.vocab_size), [1, 3], greedy_params(2))
    for name, tensor in runtime.state.items():
        for slot in (0, 2):
            assert (tensor[:, :, slot] == 7).all() if tensor.dim() == 6 else (tensor[slot] == 7).all(), name


def test_ngram_history_matches_reference(ngram_runtime):
    prompts = random_prompts([7, 1, 12], ngram_runtime.vocab_size, seed=4)
    first, state, reference_first, reference_state = run_both(ngram_runtime, prompts, [0, 2, 1])
    assert first.tolist() == reference_first.tolist()
    for slot, prompt in zip([0, 2, 1], prompts, strict=True):
        assert state["token_history"][slot, : len(prompt)].tolist() == prompt
        assert torch.equal(
            state["token_history"][slot, : len(prompt)], reference_state["token_history"][slot, : len(prompt)]
        )
    assert_prefills_equal(ngram_runtime, prompts, [0, 2, 1])


def assert_mtp_prefills_equal(runtime: graphspec.Runtime, prompts: list[list[int]], slots: list[int]) -> None:
    """The MTP head's state after the compiled prefill equals the reference prefill's on every live entry:
    layer j's KV of the pairs whose tokens the prompt holds (L - 1 - j of them), the first step's
    catch-up row, and with several layers the prior rows (positions L - n .. L - 2)."""
    first, state, reference_first, reference_state = run_both(runtime, prompts, slots)
    assert first.tolist() == reference_first.tolist()
    layers = state["mtp_cache"].shape[0]
    verify_rows = state["mtp_hidden"].shape[1] - (layers - 1)
    for slot, prompt in zip(slots, prompts, strict=True):
        live = [(TARGET_CACHE, slice(None), len(prompt))]
        live += [("mtp_cache", slice(j, j + 1), max(len(prompt) - 1 - j, 0)) for j in range(layers)]
        for name, layer, length in live:
            compiled = live_kv(state[name][layer], slot, length)
            reference = live_kv(reference_state[name][layer], slot, length)
            assert torch.isfinite(compiled).all(), f"{name} slot {slot}: a live entry was not written"
            torch.testing.assert_close(compiled, reference, rtol=1e-5, atol=1e-5, msg=f"{name} slot {slot}")
        prior = [verify_rows + i for i in range(layers - 1) if len(prompt) - layers + i >= 0]
        rows = [0, *prior]
        assert torch.equal(state["mtp_start"][slot], reference_state["mtp_start"][slot])
        assert torch.equal(state["mtp_tokens"][slot, rows], reference_state["mtp_tokens"][slot, rows])
        assert torch.isfinite(state["mtp_hidden"][slot, rows]).all()
        torch.testing.assert_close(state["mtp_hidden"][slot, rows], reference_state["mtp_hidden"][slot, rows])


def test_mtp_head_state_matches_reference(mtp_runtime):
    """Across chunk boundaries (bucket 4, 4 positions per chunk), with a one-token prompt."""
    assert_mtp_prefills_equal(mtp_runtime, random_prompts([6, 1, 13, 2], mtp_runtime.vocab_size, seed=7), [1, 0, 2, 3])


def test_mtp_head_state_matches_reference_for_a_prompt_filling_the_cache(mtp_runtime):
    """The longest prompt a step still fits after, alone: its last chunk (and with several layers the
    window reaching past it) ends at the cache's end."""
    assert_mtp_prefills_equal(mtp_runtime, random_prompts([MAX_SEQ_LEN - K - 1], mtp_runtime.vocab_size, seed=2), [1])


def test_dflash_context_matches_reference(dflash_runtime):
    """The DFlash drafter's context K/V of every prompt position across chunk boundaries, and the first
    step's feature row (the prompt's last position) and start."""
    prompts = random_prompts([6, 1, 21], dflash_runtime.vocab_size, seed=8)
    slots = [1, 0, 2]
    first, state, reference_first, reference_state = run_both(dflash_runtime, prompts, slots)
    assert first.tolist() == reference_first.tolist()
    for slot, prompt in zip(slots, prompts, strict=True):
        for name in (TARGET_CACHE, "dflash_cache"):
            compiled, reference = (
                live_kv(state[name], slot, len(prompt)),
                live_kv(reference_state[name], slot, len(prompt)),
            )
            assert torch.isfinite(compiled).all(), f"{name} slot {slot}: a live entry was not written"
            torch.testing.assert_close(compiled, reference, rtol=1e-5, atol=1e-5, msg=f"{name} slot {slot}")
        assert torch.equal(state["dflash_start"][slot], reference_state["dflash_start"][slot])
        torch.testing.assert_close(state["dflash_features"][slot, 0], reference_state["dflash_features"][slot, 0])


def test_generate_is_unchanged_by_the_compiled_prefill(runtime):
    """generate() prefills through the compiled programs; the tokens are the reference's greedy ones
    (the e2e tests compare those with transformers)."""
    prompts = random_prompts([3, 21], runtime.vocab_size, seed=5)
    compiled = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=6, stop_token_ids=[])]
    prefiller, runtime.prefiller = runtime.prefiller, None  # the reference path
    try:
        reference = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=6, stop_token_ids=[])]
    finally:
        runtime.prefiller = prefiller
    assert compiled == reference


# --------------------------------------------------------------------------------------------------
# The program
# --------------------------------------------------------------------------------------------------


def test_prefill_program_fuses_every_layers_attention(runtime):
    """Every target layer but the last: one prefill_attention. The target's last layer writes its K/V (a
    bare kv_write) and attends for each row's last position alone (one decode attention): the first token
    needs nothing else, and tracing dropped the full pass, which no draft model reads. The draft model's
    last layer keeps its bare kv_write: its attention fed only the draft's hidden states, which nothing
    reads either (the draft's single layer here)."""
    gm = runtime.compiled.prefill_graphs[(4, 4)]
    targets = [node.target for node in gm.graph.nodes if node.op == "call_function"]
    draft_layers = runtime.drafter.model.spec.num_layers
    assert targets.count(ops.OPS["prefill_attention"]) == runtime.target.spec.num_layers - 1 + draft_layers - 1
    assert targets.count(ops.OPS["kv_write"]) == 2
    assert targets.count(ops.OPS["attention"]) == 1 and ops.OPS["kv_update"] not in targets


def assert_last_layer_widths(runtime: graphspec.Runtime, full_last_layer: bool) -> None:
    """The first token needs the target's last layer at each row's last position alone (SwiGLU over one
    row per prompt, in the first token's part of the program). The full pass over the chunk stays only
    for a drafter that reads every position's final hidden state (MTP)."""
    gm = runtime.compiled.prefill_graphs[(4, 4)]
    widths = [node.args[0].meta["val"].shape[1] for node in gm.graph.nodes if node.target is ops.OPS["silu_mul"]]
    layers = runtime.target.spec.num_layers
    assert widths[: layers - 1] == [4] * (layers - 1)  # the chunk's 4 positions through every other layer
    assert widths[layers - 1 :].count(1) == 1  # the last layer at the last position
    assert (widths[layers - 1 :].count(4) >= 1) is full_last_layer
    program = runtime.prefiller.programs[(4, 4)]
    first = [n.args[0].meta["val"].shape[1] for n in program.first_part.graph.nodes if "silu_mul" in str(n.target)]
    assert first == [4] * (layers - 1) + [1]  # the full last layer's MLP, if any, waits for the token


def test_the_targets_last_layer_runs_at_the_last_position_alone(ngram_runtime):
    assert_last_layer_widths(ngram_runtime, full_last_layer=False)


def test_the_targets_full_last_layer_stays_for_mtp_behind_the_first_token(mtp_runtime):
    assert_last_layer_widths(mtp_runtime, full_last_layer=True)


def test_cpu_prefill_program_runs_the_cpu_table_copy_and_keeps_the_compiled_graph(runtime):
    """On the CPU each program runs its own copy with the CPU table's kernels (prefill attention over
    each row's visible prefix); the compiled graph, what an artifact stores, keeps the reference ops.
    The equality tests above run that copy against reference_prefill."""
    program = runtime.prefiller.programs[(4, 4)]
    compiled = runtime.compiled.prefill_graphs[(4, 4)]
    assert program.gm is not compiled and program.cpu_kernels > 0
    targets = [node.target for node in program.gm.graph.nodes if node.op == "call_function"]
    # Every fused layer (test_prefill_program_fuses_every_layers_attention); the target's last position
    # attends through the CPU table's attention.
    layers = runtime.target.spec.num_layers - 1 + runtime.drafter.model.spec.num_layers - 1
    assert targets.count(torch.ops.graphspec.prefill_attention_cpu.default) == layers
    assert targets.count(torch.ops.graphspec.attention_cpu.default) == 1
    assert ops.OPS["prefill_attention"] not in targets and ops.OPS["attention"] not in targets
    compiled_targets = [node.target for node in compiled.graph.nodes if node.op == "call_function"]
    assert compiled_targets.count(ops.OPS["prefill_attention"]) == layers


@pytest.mark.parametrize("which", ["runtime", "ngram_runtime", "dflash_runtime"])
def test_every_drafters_prefill_runs_after_the_targets_part(which, request):
    """Each program runs as two parts (runtime/prefill_split.py): the first token's part touches no drafter
    state (and reads no weight of a draft model), the drafter's part touches no target state. The tests
    above compare what the two parts leave with the reference prefill."""
    assert_split_at_the_drafter(request.getfixturevalue(which))


def test_mtp_prefill_runs_after_the_targets_part(mtp_runtime):
    assert_split_at_the_drafter(mtp_runtime)


def assert_split_at_the_drafter(runtime: graphspec.Runtime) -> None:
    target_states = set(runtime.target_state_names)
    drafter_states = set(runtime.state) - target_states
    own_weights = "draft." if runtime.drafter.kind == "draft_model" else None  # others share the target's
    for program in runtime.prefiller.programs.values():
        assert program.rest_part is not None
        first, rest = (used_inputs(part) for part in (program.first_part, program.rest_part))
        assert first & target_states and not first & drafter_states
        assert rest & drafter_states and not rest & target_states
        assert not own_weights or not [name for name in first if name.startswith(own_weights)]
        # A draft model's and n-gram's parts read only the chunk's inputs: every chunk's waits for the first token.
        assert program.rest_reads_inputs_only == (runtime.drafter.kind in ("draft_model", "ngram"))


def used_inputs(gm) -> set[str]:
    return {node.meta["gs_input"] for node in gm.graph.find_nodes(op="placeholder") if node.users}


def test_prefill_records_every_pass(runtime):
    names = [record.name for record in runtime.compiled.records["prefill_b1_c16"]]
    assert names == ["defunctionalize_kv", "addmm_in_place", "fuse_prefill_attention", "lower_kernels"]


@pytest.mark.parametrize(
    ("bucket", "max_seq_len", "tokens", "chunk"),
    [(1, 1024, 2048, 1024), (8, 1024, 2048, 256), (3, 1024, 2048, 512), (1, 1000, 512, 500), (4, 64, 2, 1)],
)
def test_chunk_size_divides_the_cache_within_the_budget(bucket, max_seq_len, tokens, chunk):
    assert trace_prefill.chunk_size(bucket, max_seq_len, tokens) == chunk


def test_prefill_refuses_bad_input_before_any_work(runtime):
    before = runtime.state[TARGET_CACHE].clone()
    params = greedy_params(1)
    with pytest.raises(InputError, match="room for one step"):
        runtime.prefill([[1] * (MAX_SEQ_LEN - K)], [0], params)
    with pytest.raises(InputError, match="1 to max_seq_len"):
        runtime.prefill([[]], [0], params)
    with pytest.raises(InputError, match=r"slot ids must be distinct ints in \[0, 4\)"):
        runtime.prefill([[1], [2]], [0, 0], greedy_params(2))
    with pytest.raises(InputError, match="one slot id per prompt"):
        runtime.prefill([[1], [2]], [0], greedy_params(2))
    # NaN-aware: the module's runtime may hold a poisoned slot from another test of this file
    torch.testing.assert_close(runtime.state[TARGET_CACHE], before, rtol=0, atol=0, equal_nan=True)


def test_captured_prefill_equals_eager(runtime):
    """A captured program (HostRecorder: the CUDA-graph contract on the CPU, outputs poisoned until
    replay) gives what the eager one gives, chunk after chunk, the draft's parts after the first token."""
    compiled = runtime.compiled
    program = PrefillProgram(
        compiled.prefill_graphs[(4, 4)], 4, runtime.params, runtime.state, 4,
        compiled.slots - 1, capture=True, recorder=HostRecorder,
    )  # fmt: skip
    program.warm_up_and_capture()
    prompts = random_prompts([5, 9, 2, 12], runtime.vocab_size, seed=6)
    _, _, reference_first, reference_state = run_both(runtime, prompts, [0, 1, 2, 3])
    eager_programs = runtime.prefiller.programs
    runtime.prefiller.programs = {(4, 4): program}
    try:
        first, state, _, _ = run_both(runtime, prompts, [0, 1, 2, 3])
    finally:
        runtime.prefiller.programs = eager_programs
    assert first.tolist() == reference_first.tolist()
    for name in (TARGET_CACHE, "draft_cache"):  # the draft's parts ran from copies of each chunk's inputs
        torch.testing.assert_close(
            live_kv(state[name], 3, 12), live_kv(reference_state[name], 3, 12), rtol=1e-5, atol=1e-5, msg=name
        )


# --------------------------------------------------------------------------------------------------
# GPU: the Triton prefill kernels, and nothing compiled or captured while serving
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_pair(checkpoint_factory):
    """Head dim 64 (the kernels' smallest tested one; the tiny checkpoints' 16 keeps the references)."""
    return (
        checkpoint_factory("llama", 0, hidden_size=256, intermediate_size=256),
        checkpoint_factory("qwen3", 1, num_hidden_layers=1, head_dim=64),
    )


@pytest.mark.gpu
def test_gpu_compiled_prefill_matches_reference(cuda_pair):
    """fp32 on CUDA with the Triton kernels (prefill attention included) against the reference prefill."""
    runtime = graphspec.Runtime.from_pretrained(
        *cuda_pair, k=K, batch_sizes=(1, 4), dtype="float32", device="cuda", max_seq_len=MAX_SEQ_LEN,
        prefill_tokens=PREFILL_TOKENS,
    )  # fmt: skip
    kernels = [n.meta.get("gs_kernel", {}).get("kernel") for n in runtime.compiled.prefill_graphs[(4, 4)].graph.nodes]
    assert "graphspec::prefill_attention_triton" in kernels
    prompts = random_prompts([1, 5, 8, 30], runtime.vocab_size, seed=8)
    slots = [2, 0, 3, 1]
    params = {name: value.cuda() for name, value in greedy_params(4).items()}
    first, state, reference_first, reference_state = run_both(runtime, prompts, slots, params)
    assert first.tolist() == reference_first.tolist()
    for slot, prompt in zip(slots, prompts, strict=True):
        compiled = live_kv(state[TARGET_CACHE], slot, len(prompt))
        torch.testing.assert_close(
            compiled, live_kv(reference_state[TARGET_CACHE], slot, len(prompt)), rtol=1e-4, atol=1e-4
        )


@pytest.mark.gpu
def test_gpu_requests_compile_and_capture_nothing(cuda_pair):
    """Building the Runtime warms up and captures every step and prefill program; then greedy and
    sampled requests of every bucket, with prompts of one and several chunks, compile no Triton kernel
    and capture no graph."""
    runtime = graphspec.Runtime.from_pretrained(
        *cuda_pair, k=K, batch_sizes=(1, 4), dtype="bfloat16", device="cuda", max_seq_len=MAX_SEQ_LEN,
        prefill_tokens=PREFILL_TOKENS,
    )  # fmt: skip
    assert all(graph.captured for graph in runtime.graphs.values())
    assert all(program.recorder is not None for program in runtime.prefiller.programs.values())
    # Start-up's throwaway requests (one per mode) leave no trace in the statistics.
    assert (runtime.stats.steps, runtime.stats.emitted, runtime.stats.graph_steps) == (0, 0, 0)
    for batch, temperature in ((1, 0.0), (3, 0.0), (4, 0.8), (1, 0.8)):
        prompts = random_prompts([1 + 13 * row for row in range(batch)], runtime.vocab_size, seed=batch)
        runtime.generate(prompts, max_new_tokens=8, temperature=temperature, seed=1, stop_token_ids=[])
    assert runtime.stats.triton_compiles_during_requests == 0
    assert runtime.stats.captures_during_requests == 0
