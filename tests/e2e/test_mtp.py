"""The MTP drafter end to end on a tiny Qwen3 target with an MTP head (CPU, fp32): lossless against
transformers' greedy generate, transformers' own MTP assisted generation accepting exactly as much
at every step (K = the number of MTP layers: one, and two), dead head state never read (tightly: one
entry more is read), and an artifact round trip; the same with a reduced draft vocabulary (a token
map), whose copy the artifact carries."""

import json
import shutil

import pytest
import torch
import transformers

import graphspec
from graphspec.drafters.token_map import write_token_map
from graphspec.errors import ArtifactError
from tests.checkpoints import load_hf, make_mtp_checkpoint, split_nextn_head
from tests.e2e.seeded_sampling import assert_seeded_sampling_repeats_and_top_k_1_is_greedy
from tests.engine_hooks import between_steps

MAX_SEQ = 128
LENGTHS = [2, 9, 30, 5, 17]  # five prompts over buckets (1, 4): padding rows and a split batch


def prompts(seed: int, lengths=LENGTHS, vocab: int = 8) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory):
    # A small vocabulary so a random head still gets drafts accepted now and then.
    return make_mtp_checkpoint(tmp_path_factory.mktemp("mtp_e2e"), "deepseek_v3", seed=7, vocab_size=8)


def runtimes_by_k(directory, **options):
    """make(k): the MTP runtime over `directory` for K = k (buckets 1 and 4, fp32, CPU), built once per k."""
    cache = {}

    def make(k: int) -> graphspec.Runtime:
        if k not in cache:
            cache[k] = graphspec.Runtime.from_pretrained(
                directory, "mtp", k=k, batch_sizes=(1, 4), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
                **options,
            )  # fmt: skip
        return cache[k]

    return make


@pytest.fixture(scope="module")
def mtp_runtime(mtp_dir):
    return runtimes_by_k(mtp_dir, modes=("greedy", "sample"))


def hf_greedy(model, prompt: list[int], new_tokens: int, **options) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, eos_token_id=None, pad_token_id=0, **options,
    )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def assert_gpu_run_is_lossless(runtime: graphspec.Runtime, checkpoint, batch: list[list[int]], vocab: int) -> None:
    """A GPU runtime's greedy output equals transformers' greedy generate of the target on the same
    device (24 tokens per prompt; the batch has padding rows), and sampling emits valid ids."""
    model = load_hf(checkpoint).to("cuda")
    results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
    assert [r.token_ids for r in results] == [hf_greedy(model, prompt, 24) for prompt in batch]
    sampled = runtime.generate(batch, max_new_tokens=16, temperature=0.8, seed=3, stop_token_ids=[])
    assert all(len(r.token_ids) == 16 and all(0 <= t < vocab for t in r.token_ids) for r in sampled)


@pytest.mark.parametrize("k", [1, 4, 6])  # one draft, the usual four, more (k=2 runs in the tests below)
def test_greedy_is_lossless_against_transformers(mtp_dir, mtp_runtime, k):
    model = load_hf(mtp_dir)
    runtime = mtp_runtime(k)
    batch = prompts(seed=k)
    results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, 24)
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0  # drafts were accepted, and rolled back


def test_accepted_counts_equal_transformers_mtp_generation(mtp_dir, mtp_runtime, monkeypatch):
    """transformers' generate(use_mtp=True) drafts one token per step with the same head; its accepted
    count per step (recorded where its assisted loop reports it) equals graphspec's at K = 1."""
    from transformers.generation.candidate_generator import MTPCandidateGenerator

    monkeypatch.setattr(transformers.Qwen3ForCausalLM, "_keys_to_ignore_on_load_unexpected", [r"model\.layers\.2\..*"])
    model = load_hf(mtp_dir)
    trace: list[int] = []
    monkeypatch.setattr(
        MTPCandidateGenerator,
        "update_candidate_strategy",
        lambda self, ids, logits, n: trace.append(int(n)),
        raising=False,
    )
    runtime = mtp_runtime(1)
    total = 0
    for prompt in prompts(seed=21, lengths=[6, 19, 11, 3]):
        trace.clear()
        expected = hf_greedy(model, prompt, 30, use_mtp=True)
        result = runtime.generate([prompt], max_new_tokens=30, stop_token_ids=[])[0]
        assert result.token_ids == expected
        # transformers' first iteration drafts nothing (its MTP needs the prompt's hidden states first)
        # and emits the token graphspec's prefill emits; its later iterations are graphspec's steps.
        # Its last iteration drafts nothing when one token is left to max_new_tokens (graphspec's step
        # does not know the request's limit and drafts anyway), so the last step is left out.
        assert trace[0] == 0
        steps = len(result.stats.accepted_per_step)
        assert len(trace) == steps + 1
        assert result.stats.accepted_per_step[:-1] == trace[1:steps]
        total += sum(trace[1:steps])
    assert total > 0  # some drafts were accepted, so the comparison is not all zeros


def test_sampling_is_reproducible_and_greedy_at_top_k_1(mtp_runtime):
    runtime = mtp_runtime(2)
    batch = prompts(seed=4, lengths=[6, 9, 3])
    assert_seeded_sampling_repeats_and_top_k_1_is_greedy(runtime, batch)


def test_artifact_round_trip_keeps_the_head(mtp_dir, mtp_runtime, tmp_path):
    compiled = graphspec.compile(
        mtp_dir, "mtp", k=2, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        modes=("greedy",), out=tmp_path / "art",
    )  # fmt: skip
    loaded = graphspec.Runtime.load(tmp_path / "art")
    assert loaded.drafter.describe() == {"kind": "mtp", "layers": 1, "layout": "deepseek_v3"}
    batch = prompts(seed=8, lengths=[7, 12])
    expected = graphspec.Runtime(compiled).generate(batch, max_new_tokens=12, stop_token_ids=[])
    got = loaded.generate(batch, max_new_tokens=12, stop_token_ids=[])
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]


def test_nextn_head_directory_is_lossless_and_round_trips(mtp_dir, tmp_path):
    """The same head moved to a standalone NextN directory beside a target without MTP weights: the
    kind is read from its config, greedy output equals transformers', and the artifact keeps the head
    directory as its draft checkpoint."""
    target_dir, head_dir = split_nextn_head(mtp_dir, tmp_path / "target", tmp_path / "head")
    graphspec.compile(
        target_dir, head_dir, k=3, batch_sizes=(1, 4), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        modes=("greedy",), out=tmp_path / "art",
    )  # fmt: skip
    runtime = graphspec.Runtime.load(tmp_path / "art")
    assert runtime.drafter.describe() == {"kind": "mtp", "layers": 1, "layout": "deepseek_v3"}
    model = load_hf(target_dir)
    batch = prompts(seed=13)
    results = runtime.generate(batch, max_new_tokens=20, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, 20)
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0


# --- several MTP layers (DeepSeek-V3 layout, model.layers.{L + i}.*) ----------------------------------

DEEP = 2  # MTP layers


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory):
    return make_mtp_checkpoint(
        tmp_path_factory.mktemp("mtp_deep"), "deepseek_v3", seed=9, mtp_layers=DEEP, vocab_size=8
    )


@pytest.fixture(scope="module")
def deep_runtime(deep_dir):
    # 16 prefill tokens per chunk: prompts cross chunk boundaries, where the window's prior rows carry over.
    return runtimes_by_k(deep_dir, modes=("greedy",), prefill_tokens=16)


@pytest.mark.parametrize("k", [1, DEEP, DEEP + 3])  # fewer drafts than layers, one per layer, a chain past them
def test_several_layers_are_lossless_against_transformers(deep_dir, deep_runtime, k):
    runtime = deep_runtime(k)
    assert runtime.drafter.describe() == {"kind": "mtp", "layers": DEEP, "layout": "deepseek_v3"}
    model = load_hf(deep_dir)
    batch = prompts(seed=50 + k, lengths=[1, *LENGTHS])
    results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, 24)
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0


def test_several_layers_accept_as_transformers_mtp_generation(deep_dir, deep_runtime, monkeypatch):
    """transformers' MTP generation drafts one token per layer (K = layers); after a step that accepted
    fewer than layers - 1 it crops every layer's cache and recomputes. graphspec's window recomputes the
    same rows every step: the accepted count per step must be transformers' at every step."""
    from transformers.generation.candidate_generator import MTPCandidateGenerator

    layers = [rf"model\.layers\.{2 + index}\..*" for index in range(DEEP)]
    monkeypatch.setattr(transformers.Qwen3ForCausalLM, "_keys_to_ignore_on_load_unexpected", layers)
    model = load_hf(deep_dir)
    trace: list[int] = []
    monkeypatch.setattr(
        MTPCandidateGenerator,
        "update_candidate_strategy",
        lambda self, ids, logits, n: trace.append(int(n)),
        raising=False,
    )
    runtime = deep_runtime(DEEP)
    accepted = []
    # No 1-token prompt: transformers 5.24's recompute branch then slices fewer hidden rows than tokens
    # and raises (graphspec's window starts at position 0 there: the lossless test above runs one).
    for prompt in prompts(seed=22, lengths=[6, 19, 11, 3, 2]):
        trace.clear()
        expected = hf_greedy(model, prompt, 30, use_mtp=True)
        result = runtime.generate([prompt], max_new_tokens=30, stop_token_ids=[])[0]
        assert result.token_ids == expected
        # As at one layer: transformers' first iteration drafts nothing, and its last runs short of
        # max_new_tokens, so the last step is left out.
        assert trace[0] == 0
        steps = len(result.stats.accepted_per_step)
        assert result.stats.accepted_per_step[:-1] == trace[1:steps]
        accepted += trace[1:steps]
    # Both branches of transformers' cache handling ran: steps that accepted fewer than layers - 1
    # drafts (it crops and recomputes) and steps that accepted more.
    assert min(accepted) < DEEP - 1 <= max(accepted)


# Dead verify rows get finite garbage, not NaN: the catch-up runs them beside the live rows, and though
# a live row gives their keys exactly zero attention weight, zero times NaN is NaN; finite garbage that
# a live row read would still change its drafts, which the test compares.
GARBAGE = 1e4


@pytest.mark.parametrize("layers", [1, DEEP], ids=["1_layer", f"{DEEP}_layers"])
def test_dead_head_state_is_never_read(request, layers):
    """After every step: NaN into every layer's KV from the next catch-up window's first position on
    (start - layers, start being where the last verify began: the window rewrites all of it before
    reading, and poisoning one entry earlier changes the drafts), garbage into the verify rows past
    the accepted count, ids no model has into their tokens, and NaN into the spare slot: the output and
    every step's accepted count are unchanged. (With several layers the prior rows are live.)"""
    runtime = request.getfixturevalue("mtp_runtime" if layers == 1 else "deep_runtime")(layers + 3)
    k = runtime.k
    batch = prompts(seed=3, lengths=[4, 17, 1])
    clean = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    assert any(0 < a for r in clean for a in r.stats.accepted_per_step)
    state = runtime.state

    def poison(slots: list[int], lengths: list[int]) -> None:
        for slot, length in zip(slots, lengths, strict=True):
            start = int(state["mtp_start"][slot, 0])
            accepted = length - 1 - start
            state["mtp_cache"][:, :, slot, :, max(start - layers, 0) :] = float("nan")
            state["mtp_hidden"][slot, accepted + 1 : k + 1] = GARBAGE
            state["mtp_tokens"][slot, accepted + 1 : k + 1] = 10**9
        for name in ("mtp_cache", "mtp_hidden"):
            state[name].select(2 if name == "mtp_cache" else 0, -1).fill_(float("nan"))
        state["mtp_tokens"][-1] = 5  # padding rows embed these: wrong but valid ids

    with between_steps(runtime, poison):
        poisoned = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    assert [r.token_ids for r in poisoned] == [r.token_ids for r in clean]
    # Greedy verify would emit the same tokens from any drafts: the drafts themselves must not change.
    assert [r.stats.accepted_per_step for r in poisoned] == [r.stats.accepted_per_step for r in clean]


def test_several_layers_keep_each_request_its_tokens_as_requests_come_and_go(deep_runtime):
    """Twelve requests of mixed lengths through four slots: requests join (prefilled beside running
    ones) and leave between steps, and slots are reused, so prior rows and head KV of one request sit
    where the next one starts. Each gets exactly the tokens (and accepted counts) it gets alone."""
    from graphspec.runtime.requests import SamplingParams

    runtime = deep_runtime(DEEP + 1)
    generator = torch.Generator().manual_seed(70)
    lengths = torch.randint(1, 30, (12,), generator=generator).tolist()
    batch = prompts(seed=70, lengths=lengths)
    params = [
        SamplingParams(max_tokens=int(n), stop_token_ids=()) for n in torch.randint(2, 25, (12,), generator=generator)
    ]
    alone = [runtime.engine.submit(prompt, p).result() for prompt, p in zip(batch, params, strict=True)]
    handles = runtime.engine.submit_all(
        [(prompt, p, i) for i, (prompt, p) in enumerate(zip(batch, params, strict=True))]
    )
    together = [handle.result() for handle in handles]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [r.stats.accepted_per_step for r in together] == [r.stats.accepted_per_step for r in alone]


def test_several_layers_round_trip_an_artifact(deep_dir, deep_runtime, tmp_path):
    graphspec.compile(
        deep_dir, "mtp", k=3, batch_sizes=(1, 4), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        modes=("greedy",), prefill_tokens=16, out=tmp_path / "art",
    )  # fmt: skip
    loaded = graphspec.Runtime.load(tmp_path / "art")
    assert loaded.drafter.describe() == {"kind": "mtp", "layers": DEEP, "layout": "deepseek_v3"}
    assert loaded.state["mtp_cache"].shape[0] == DEEP and loaded.state["mtp_hidden"].shape[1] == 3 + DEEP
    batch = prompts(seed=61)
    got = loaded.generate(batch, max_new_tokens=16, stop_token_ids=[])
    expected = deep_runtime(3).generate(batch, max_new_tokens=16, stop_token_ids=[])
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert [r.stats.accepted_per_step for r in got] == [r.stats.accepted_per_step for r in expected]


@pytest.mark.gpu
def test_captured_gpu_steps_with_several_layers_are_lossless(deep_dir):
    """On the GPU (fp32, Triton kernels, CUDA graphs), two MTP layers and a chain past them: greedy
    output equals transformers' greedy generate on the same device, with padding rows."""
    runtime = graphspec.Runtime.from_pretrained(
        deep_dir, "mtp", k=DEEP + 2, batch_sizes=(1, 4), dtype="float32", device="cuda", max_seq_len=MAX_SEQ,
        modes=("greedy", "sample"), prefill_tokens=16,
    )  # fmt: skip
    assert_gpu_run_is_lossless(runtime, deep_dir, prompts(seed=43, lengths=[1, *LENGTHS]), vocab=8)


def test_qwen3_next_layout_with_several_layers_is_refused(tmp_path):
    directory = make_mtp_checkpoint(tmp_path / "next", "qwen3_next", seed=2)
    raw = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(
        json.dumps({**raw, "num_mtp_layers": 2, "mtp_layer_types": ["full_attention"] * 2})
    )
    with pytest.raises(graphspec.errors.InputError, match=r"2 MTP layers in the Qwen3-Next layout"):
        graphspec.compile(directory, "mtp", k=2, dtype="float32", device="cpu", max_seq_len=64)


# --- a reduced ("hot") draft vocabulary: drafters/token_map.py ---------------------------------------

HOT_IDS = [6, 3, 0, 4]  # of the 8 ids: the target's greedy tokens are often outside them


@pytest.fixture(scope="module")
def hot_map(tmp_path_factory):
    return write_token_map(tmp_path_factory.mktemp("hot") / "hot.safetensors", HOT_IDS)


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_with_a_token_map_is_lossless_against_transformers(mtp_dir, hot_map, k):
    runtime = graphspec.Runtime.from_pretrained(
        mtp_dir, "mtp", k=k, batch_sizes=(1, 4), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        modes=("greedy",), token_map=hot_map,
    )  # fmt: skip
    assert runtime.drafter.describe()["draft_vocab_size"] == len(HOT_IDS)
    model = load_hf(mtp_dir)
    batch = prompts(seed=30 + k)
    results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
    emitted = [token for result in results for token in result.token_ids]
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, 24)
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0  # drafts from the map were accepted
    assert set(emitted) - set(HOT_IDS)  # and the target's tokens off the map came out too


def test_artifact_with_a_token_map_reproduces_without_the_original_file(mtp_dir, hot_map, tmp_path):
    """The artifact carries the map (digest-checked): it loads and generates the same tokens after the
    original file is gone, the manifest names its copy and the draft vocabulary size, and an edited
    copy is refused."""
    source = shutil.copy(hot_map, tmp_path / "map.safetensors")
    compiled = graphspec.compile(
        mtp_dir, "mtp", k=2, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        out=tmp_path / "art", token_map=source,
    )  # fmt: skip
    (tmp_path / "map.safetensors").unlink()
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["drafter"] == {
        "kind": "mtp", "layers": 1, "layout": "deepseek_v3", "draft_vocab_size": 4,
        "token_map": "drafter/token_map.safetensors",
    }  # fmt: skip
    assert "drafter/token_map.safetensors" in manifest["files"]
    assert f"--token-map {tmp_path / 'map.safetensors'}" in manifest["command"]
    loaded = graphspec.Runtime.load(tmp_path / "art")
    assert loaded.drafter.describe()["draft_vocab_size"] == 4
    batch = prompts(seed=8, lengths=[7, 12])
    for options in ({}, {"temperature": 0.8, "seed": 3}):
        expected = graphspec.Runtime(compiled).generate(batch, max_new_tokens=12, stop_token_ids=[], **options)
        got = loaded.generate(batch, max_new_tokens=12, stop_token_ids=[], **options)
        assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    write_token_map(tmp_path / "art" / "drafter" / "token_map.safetensors", [6, 3, 0, 5])
    with pytest.raises(ArtifactError, match=r"drafter/token_map\.safetensors has another sha256"):
        graphspec.Runtime.load(tmp_path / "art")


@pytest.mark.gpu
def test_captured_gpu_steps_with_a_token_map_are_lossless(mtp_dir, hot_map):
    """On the GPU (fp32, Triton kernels, CUDA graphs) with a token map: greedy output equals
    transformers' greedy generate on the same device, with padding rows; sampling emits valid ids."""
    runtime = graphspec.Runtime.from_pretrained(
        mtp_dir, "mtp", k=4, batch_sizes=(1, 4), dtype="float32", device="cuda", max_seq_len=MAX_SEQ,
        modes=("greedy", "sample"), token_map=hot_map,
    )  # fmt: skip
    assert_gpu_run_is_lossless(runtime, mtp_dir, prompts(seed=41), vocab=8)
