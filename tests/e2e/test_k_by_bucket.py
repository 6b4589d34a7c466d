"""Buckets with their own K (SpecConfig.k_by_bucket) for every drafter kind (CPU, fp32): a request that
runs alone (bucket 1, K = 4), then beside three newcomers (bucket 4, K = 1), then alone again, is lossless
against transformers' greedy generate, and every other request too: the drafter's state, laid out for the
largest K, carries over a change of K in both directions (a two-layer MTP head included, whose K = 1 steps
still run both layers). Then the artifact: a bucket's K travels and a manifest that gives it another is
refused."""

from __future__ import annotations

import json

import pytest

import graphspec
from graphspec.errors import ArtifactError, InputError
from graphspec.runtime.requests import SamplingParams
from tests.checkpoints import load_hf, make_mtp_checkpoint
from tests.e2e.test_mtp import hf_greedy, prompts

MAX_SEQ = 128
VOCAB = 12  # small, so random drafters still get drafts accepted now and then
K, K_BY_BUCKET = 4, {4: 1}
KINDS = ("draft_model", "ngram", "mtp", "eagle3", "dflash")


@pytest.fixture(scope="module")
def target_dir(checkpoint_factory):
    return checkpoint_factory("llama", seed=21, num_hidden_layers=6, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def case(target_dir, checkpoint_factory, tmp_path_factory):
    """kind -> (target dir, draft argument) for every drafter kind."""
    from tests.dflash_oracle import make_dflash_drafter
    from tests.eagle3_oracle import make_eagle3_head

    def make(kind: str):
        if kind == "draft_model":
            return target_dir, checkpoint_factory("llama", seed=22, num_hidden_layers=1, vocab_size=VOCAB)
        if kind == "ngram":
            return target_dir, "ngram"
        if kind == "mtp":  # two MTP layers: a K = 1 bucket drafts from the first and keeps both caches
            directory = make_mtp_checkpoint(tmp_path_factory.mktemp("mtp"), seed=7, vocab_size=VOCAB, mtp_layers=2)
            return directory, "mtp"
        if kind == "eagle3":
            return target_dir, make_eagle3_head(tmp_path_factory.mktemp("eagle3"), target_dir, seed=8, draft_vocab=8)
        return target_dir, make_dflash_drafter(
            tmp_path_factory.mktemp("dflash"), target_dir, seed=8, block_size=K + 1, layer_ids=(1, 3), mask_token_id=2
        )

    return make


def run_with_newcomers(
    runtime: graphspec.Runtime, batch: list[list[int]], after_long_accepts: int = 0
) -> tuple[list, list[int]]:
    """batch[0] alone (40 tokens); after its second step batch[1:] join (from the engine's thread, between
    steps), with fewer tokens each, so the batch shrinks back to one row. With after_long_accepts, also
    after each of up to that many steps of batch[0] alone that accepted >= 2 drafts, one more newcomer
    (2 tokens; cycling through batch[1:]) joins: the step after it drafts 1 and must catch up over
    every row the previous step accepted. Returns the requests' GenerationResults (batch[0]'s first,
    then batch[1:]'s) and the K of each step batch[0] took (its bucket's)."""
    engine = runtime.engine
    k_for = runtime.compiled.config.k_for
    handles, extra, first_k = [], [], []

    class Newcomers:
        def on_step(self, buffers, rows: int, accepted: list[int]) -> None:
            first_k.append(k_for(buffers.bucket))
            if len(first_k) == 2:
                for index, prompt in enumerate(batch[1:]):
                    handles.append(engine.submit(prompt, SamplingParams(max_tokens=6 + 4 * index, stop_token_ids=())))
            elif rows == 1 and accepted[0] >= 2 and len(extra) < after_long_accepts:
                prompt = batch[1 + len(extra) % (len(batch) - 1)]
                extra.append(engine.submit(prompt, SamplingParams(max_tokens=2, stop_token_ids=())))

        def on_finish(self, request) -> None:
            pass

    listener = Newcomers()
    engine.listeners.append(listener)
    try:
        first = engine.submit(batch[0], SamplingParams(max_tokens=40, stop_token_ids=())).result()
        results = [first, *(handle.result() for handle in handles)]
        for handle in extra:
            handle.result()
    finally:
        engine.listeners.remove(listener)
    return results, first_k[: len(first.stats.accepted_per_step)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_change_of_k_between_steps_is_lossless(case, kind):
    target, draft = case(kind)
    runtime = graphspec.Runtime.from_pretrained(
        target, draft, k=K, k_by_bucket=K_BY_BUCKET, batch_sizes=(1, 4), dtype="float32", device="cpu",
        max_seq_len=MAX_SEQ, modes=("greedy",),
    )  # fmt: skip
    assert runtime.compiled.config.k_by_bucket == ((4, 1),)
    batch = prompts(seed=5, lengths=[9, 3, 14, 6], vocab=VOCAB)
    results, first_k = run_with_newcomers(runtime, batch)
    tokens = [result.token_ids for result in results]
    model = load_hf(target)
    assert tokens == [hf_greedy(model, prompt, len(got)) for prompt, got in zip(batch, tokens, strict=True)]
    assert [len(t) for t in tokens] == [40, 6, 10, 14]
    # batch[0] stepped at K = 4, then at K = 1 beside the newcomers, then at K = 4 again
    changes = [k for index, k in enumerate(first_k) if index == 0 or k != first_k[index - 1]]
    assert changes == [4, 1, 4], first_k
    drafted = runtime.stats.drafted_at  # row-steps drafting each position: K = 1 steps draft position 1 only
    assert drafted[0] > drafted[1] == drafted[3] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_a_change_of_k_between_captured_gpu_steps_is_lossless(case, kind):
    """The same K = 4 -> 1 -> 4 run on the GPU (fp32, Triton kernels, each bucket's step captured at its
    own K): output equals transformers' greedy generate of the target on the same device."""
    target, draft = case(kind)
    runtime = graphspec.Runtime.from_pretrained(
        target, draft, k=K, k_by_bucket=K_BY_BUCKET, batch_sizes=(1, 4), dtype="float32", device="cuda",
        max_seq_len=MAX_SEQ, modes=("greedy",),
    )  # fmt: skip
    assert {bucket: graph.mode for (_, bucket), graph in runtime.graphs.items()} == {1: "full", 4: "full"}
    batch = prompts(seed=5, lengths=[9, 3, 14, 6], vocab=VOCAB)
    results, first_k = run_with_newcomers(runtime, batch)
    tokens = [result.token_ids for result in results]
    model = load_hf(target).to("cuda")
    assert tokens == [hf_greedy(model, prompt, len(got)) for prompt, got in zip(batch, tokens, strict=True)]
    changes = [k for index, k in enumerate(first_k) if index == 0 or k != first_k[index - 1]]
    assert changes == [4, 1, 4], first_k


def test_eagle3_accepted_counts_across_k_changes_equal_an_oracle_loop(case):
    """Lossless output alone would not notice a catch-up that reads the wrong rows after a change of K
    (the drafts would only get worse): the request's accepted count at every step equals that of EAGLE-3
    decoding with transformers' target and the oracle head recomputed from scratch, at that step's K."""
    import torch

    from tests.eagle3_oracle import load_oracle, oracle_drafts

    target, draft = case("eagle3")
    runtime = graphspec.Runtime.from_pretrained(
        target, draft, k=K, k_by_bucket=K_BY_BUCKET, batch_sizes=(1, 4), dtype="float32", device="cpu",
        max_seq_len=MAX_SEQ, modes=("greedy",),
    )  # fmt: skip
    # a prompt this random head drafts well for (4, 4, 0, 4, ... accepted alone), then the newcomers
    batch = prompts(seed=39, lengths=[6], vocab=VOCAB) + prompts(seed=7, lengths=[4, 12, 7], vocab=VOCAB)
    results, first_k = run_with_newcomers(runtime, batch, after_long_accepts=3)
    # the request drafted 1 right after a step of 4 that accepted >= 2 (the catch-up's hard case)
    steps = results[0].stats.accepted_per_step
    assert any(k == K and a >= 2 and after == 1 for k, a, after in zip(first_k, steps, first_k[1:], strict=False)), (
        first_k,
        steps,
    )
    hf_target = load_hf(target)
    oracle, ids, layers = load_oracle(draft, hf_target.config)
    oracle.embed_tokens = hf_target.model.embed_tokens
    sequence, counts = list(batch[0]), []
    with torch.no_grad():
        sequence.append(int(hf_target(torch.tensor([sequence])).logits[0, -1].argmax()))
        for k in first_k:
            drafts, _ = oracle_drafts((hf_target, oracle, ids, layers), sequence, k, VOCAB)
            verify = hf_target(torch.tensor([sequence + drafts])).logits[0, len(sequence) - 1 :].argmax(-1).tolist()
            accepted = next((i for i in range(k) if drafts[i] != verify[i]), k)
            sequence += [*drafts[:accepted], verify[accepted]]
            counts.append(accepted)
    first = results[0]
    assert sequence[len(batch[0]) :][: len(first.token_ids)] == first.token_ids
    assert first.stats.accepted_per_step == counts and sum(counts) > 0, (first.stats.accepted_per_step, counts)


def test_k_by_bucket_is_checked_before_any_work(target_dir, no_weight_loading):
    for bad, message in (
        ({8: 1}, r"k_by_bucket names bucket 8, not one of batch_sizes \(1, 4\)"),
        ({4: 5}, r"k_by_bucket gives bucket 4 K=5: it must be an int from 1 to k=4"),
        ({4: 0}, r"k_by_bucket gives bucket 4 K=0"),
    ):
        with pytest.raises(InputError, match=message):
            graphspec.compile(target_dir, "ngram", k=K, k_by_bucket=bad, batch_sizes=(1, 4), device="cpu")


def test_artifact_keeps_each_buckets_k_and_refuses_an_edited_one(case, tmp_path):
    target, draft = case("eagle3")
    out = tmp_path / "art"
    graphspec.compile(
        target, draft, k=K, k_by_bucket=K_BY_BUCKET, batch_sizes=(1, 4), dtype="float32", device="cpu",
        max_seq_len=MAX_SEQ, modes=("greedy",), out=out,
    )  # fmt: skip
    loaded = graphspec.Runtime.load(out)
    assert loaded.compiled.config.k_by_bucket == ((4, 1),) and loaded.k == K
    batch = prompts(seed=6, lengths=[5, 8], vocab=VOCAB)
    model = load_hf(target)
    results = loaded.generate(batch, max_new_tokens=12, stop_token_ids=[])
    assert [r.token_ids for r in results] == [hf_greedy(model, prompt, 12) for prompt in batch]
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for edit, message in (
        ({"k_by_bucket": [[4, 2]]}, r"config\.k_by_bucket gives bucket 4 k=2 but the graphs were compiled for k=1"),
        ({"k_by_bucket": []}, r"config\.k gives bucket 4 k=4 but the graphs were compiled for k=1"),
        ({"k": 6, "k_by_bucket": [[1, 4], [4, 1]]}, r"config \(k=6\) lays out state eagle3_features as \[5, 7, "),
    ):
        edited = {**manifest, "config": {**manifest["config"], **edit}}
        manifest_path.write_text(json.dumps(edited))
        with pytest.raises(ArtifactError, match=message):
            graphspec.Runtime.load(out)
    manifest_path.write_text(json.dumps(manifest))
