"""The shipped demo pair (graphspec/examples/demo_pair): intact, loadable by transformers and by
graphspec with the same numbers, and still a pair whose drafts the target accepts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import transformers

from graphspec.examples import DEMO_DRAFT, DEMO_PAIR_DIR, DEMO_TARGET, file_sha256, load_metadata
from graphspec.models import load_model

REPO = Path(__file__).resolve().parents[2]
PROMPT = '''def parse_header(line):
    """Split a header line into its name and value."""
    name, _, value = line.partition(":")
'''
# Measured with tools/measure_acceptance.py on the shipped pair (metadata.json "acceptance" and the demo
# README hold the numbers). The floors leave room for other Python versions' held-out files; a trained
# head's chance level is about 1/4096 per draft.
ACCEPTANCE_FLOOR = 1.5
HEAD_ACCEPTANCE_FLOOR = 1.0
# The DFlash drafter trained in 10 CPU minutes accepts about 0.26 drafts per step on the 20 held-out
# prompts (metadata.json); the floor only says it drafts far above chance.
DFLASH_ACCEPTANCE_FLOOR = 0.1


def measure_acceptance_module():
    spec = importlib.util.spec_from_file_location("measure_acceptance", REPO / "tools" / "measure_acceptance.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return sys.modules[spec.name]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: one thread is fastest, and far faster on a shared, busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_pair():
    load = transformers.AutoModelForCausalLM.from_pretrained
    return load(DEMO_TARGET, dtype=torch.float32).eval(), load(DEMO_DRAFT, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def graphspec_pair():
    return load_model(DEMO_TARGET, "float32", "cpu"), load_model(DEMO_DRAFT, "float32", "cpu")


def test_files_match_metadata_sha256():
    metadata = load_metadata()
    shipped = sorted(p.relative_to(DEMO_PAIR_DIR).as_posix() for p in DEMO_PAIR_DIR.glob("*/*") if p.is_file())
    assert shipped == sorted(metadata["sha256"])
    for name, digest in metadata["sha256"].items():
        assert file_sha256(DEMO_PAIR_DIR / name) == digest, name
    # The budget: target + draft at most 40 MB together; no head larger than the draft model, so the
    # drafters are compared at comparable sizes (the 3-layer DFlash drafter is the largest head, 10.3 MB).
    sizes = {part: 0 for part in ("target", "draft", "mtp", "eagle3", "dflash")}
    for name, size in metadata["bytes"].items():
        sizes[name.split("/")[0]] += size
    assert sizes["target"] + sizes["draft"] <= 40e6, sizes
    assert all(sizes[head] <= sizes["draft"] for head in ("mtp", "eagle3", "dflash")), sizes


def test_pair_shares_vocab_and_tokenizer(graphspec_pair):
    target, draft = graphspec_pair
    assert file_sha256(DEMO_TARGET / "tokenizer.json") == file_sha256(DEMO_DRAFT / "tokenizer.json")
    assert target.config.vocab_size == draft.config.vocab_size == len(target.tokenizer)
    assert target.eos_token_ids == draft.eos_token_ids == [target.tokenizer.eos_token_id]
    ids = target.tokenizer(PROMPT)["input_ids"]
    assert ids[0] == target.tokenizer.bos_token_id
    assert target.tokenizer.decode(ids, skip_special_tokens=True) == PROMPT


def graphspec_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    cache = model.new_cache(1, tokens.shape[1], torch.float32, "cpu")
    zero = torch.zeros(1, dtype=torch.int64)
    logits, _ = model(tokens, zero, zero, cache, output="logits", in_place=True)
    return logits


@pytest.mark.parametrize("which", [0, 1], ids=["target", "draft"])
def test_graphspec_logits_match_transformers(hf_pair, graphspec_pair, which):
    hf, ours = hf_pair[which], graphspec_pair[which].model
    tokens = torch.tensor([graphspec_pair[0].tokenizer(PROMPT)["input_ids"]])
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        actual = graphspec_logits(ours, tokens)
    assert ((actual - expected).norm() / expected.norm()).item() < 1e-4


def graphspec_greedy(model, prompt: list[int], new_tokens: int, eos: list[int]) -> list[int]:
    """Plain greedy decoding with graphspec's model and its KV cache, stopping after EOS."""
    cache = model.new_cache(1, len(prompt) + new_tokens, torch.float32, "cpu")
    slot = torch.zeros(1, dtype=torch.int64)
    logits, _ = model(torch.tensor([prompt]), slot, slot, cache, output="last_logits", in_place=True)
    out = list(prompt)
    for _ in range(new_tokens):
        out.append(int(logits[0].argmax()))
        if out[-1] in eos:
            break
        position = torch.tensor([len(out) - 1])
        logits, _ = model(torch.tensor([[out[-1]]]), position, slot, cache, output="last_logits", in_place=True)
    return out


@pytest.mark.parametrize("which", [0, 1], ids=["target", "draft"])
def test_graphspec_greedy_equals_transformers_generate(hf_pair, graphspec_pair, which):
    loaded = graphspec_pair[which]
    prompt = loaded.tokenizer(PROMPT)["input_ids"]
    with torch.no_grad():
        expected = (
            hf_pair[which]
            .generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                do_sample=False,
                max_new_tokens=24,
            )[0]
            .tolist()
        )
        actual = graphspec_greedy(loaded.model, prompt, 24, loaded.eos_token_ids)
    assert actual == expected


def test_acceptance_on_heldout_prompts_stays_above_floor(hf_pair, graphspec_pair):
    measure = measure_acceptance_module()
    target, draft = hf_pair
    prompts = measure.heldout_prompts(graphspec_pair[0].tokenizer, count=2, length=64)
    result = measure.measure(target, draft, prompts, k=4, new_tokens=32, eos=set(graphspec_pair[0].eos_token_ids))
    assert result.mean_accepted >= ACCEPTANCE_FLOOR, result


def test_speculative_runtime_on_the_pair_is_lossless_and_accepts(graphspec_pair):
    """The real compiled step on the shipped pair: greedy output equals target-only greedy decoding
    (fp32) and the runtime's own acceptance stays above the floor on held-out prompts."""
    import graphspec
    from graphspec.reference import reference_generate

    measure = measure_acceptance_module()
    target = graphspec_pair[0]
    prompts = [ids for _, ids in measure.heldout_prompts(target.tokenizer, count=2, length=64)]
    runtime = graphspec.Runtime.from_pretrained(
        DEMO_TARGET,
        DEMO_DRAFT,
        k=4,
        batch_sizes=(2,),
        dtype="float32",
        device="cpu",
        max_seq_len=160,
        modes=("greedy",),
    )
    results = runtime.generate(prompts, max_new_tokens=32)
    expected = reference_generate(target.model, prompts, 32, stop_token_ids=target.eos_token_ids, max_seq_len=160)
    assert [r.token_ids for r in results] == expected
    assert runtime.stats.mean_accepted >= ACCEPTANCE_FLOOR, runtime.stats


@pytest.mark.parametrize("name", ["mtp", "eagle3", "dflash"])
def test_head_acceptance_on_heldout_prompts_stays_above_floor(hf_pair, graphspec_pair, name):
    """The shipped heads (tools/demo_heads.py reads their files) and DFlash drafter (tools/demo_dflash.py)
    against the shipped target, with the replay rule the draft model is measured by."""
    metadata = load_metadata()
    if name not in metadata.get("heads", {}) and name not in metadata:
        pytest.skip(f"the shipped demo pair predates the {name} head (metadata.json lists no such head)")
    measure = measure_acceptance_module()
    target = hf_pair[0]
    drafter = measure.load_drafters([name], target, None, DEMO_PAIR_DIR, "cpu")[name]
    prompts = measure.heldout_prompts(graphspec_pair[0].tokenizer, count=2, length=64)
    result = measure.measure(target, drafter, prompts, k=4, new_tokens=32, eos=set(graphspec_pair[0].eos_token_ids))
    assert result.mean_accepted >= (DFLASH_ACCEPTANCE_FLOOR if name == "dflash" else HEAD_ACCEPTANCE_FLOOR), result


def test_dflash_runtime_on_the_demo_target_is_lossless_and_accepts(graphspec_pair):
    """The compiled step with the shipped DFlash drafter (graphspec/drafters/dflash.py reads dflash/):
    greedy output equals target-only greedy decoding (fp32) and drafts get accepted."""
    import graphspec
    from graphspec.examples import DEMO_DFLASH
    from graphspec.reference import reference_generate

    if "dflash" not in load_metadata():
        pytest.skip("the shipped demo pair predates the DFlash drafter (metadata.json has no 'dflash')")
    measure = measure_acceptance_module()
    target = graphspec_pair[0]
    prompts = [ids for _, ids in measure.heldout_prompts(target.tokenizer, count=2, length=64)]
    runtime = graphspec.Runtime.from_pretrained(
        DEMO_TARGET, DEMO_DFLASH, k=4, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=160,
        modes=("greedy",),
    )  # fmt: skip
    results = runtime.generate(prompts, max_new_tokens=32)
    expected = reference_generate(target.model, prompts, 32, stop_token_ids=target.eos_token_ids, max_seq_len=160)
    assert [r.token_ids for r in results] == expected
    assert runtime.stats.mean_accepted >= DFLASH_ACCEPTANCE_FLOOR, runtime.stats
