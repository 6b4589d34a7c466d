"""Tiny target/draft pairs compiled once per session, and transformers' greedy output as the oracle."""

from __future__ import annotations

import pytest
import torch

import graphspec
from tests.checkpoints import load_hf

# name -> (target (family, seed, overrides), draft (family, seed, overrides))
PAIRS = {
    "unrelated": (("llama", 0, {}), ("qwen3", 1, {})),
    "self": (("llama", 0, {}), ("llama", 0, {})),
    "mixed_family": (("mistral", 2, {}), ("llama", 3, {"num_hidden_layers": 1})),
    "qwen2": (("qwen2", 4, {}), ("qwen2", 5, {"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1})),
}
MAX_SEQ = 160


@pytest.fixture(scope="session")
def pair_dirs(checkpoint_factory):
    def make(name: str):
        (t_family, t_seed, t_over), (d_family, d_seed, d_over) = PAIRS[name]
        return checkpoint_factory(t_family, t_seed, **t_over), checkpoint_factory(d_family, d_seed, **d_over)

    return make


@pytest.fixture(scope="session")
def runtime_for(pair_dirs):
    cache = {}

    def make(name: str, k: int, batch_sizes=(1, 4), modes=("greedy",), fold_norms=False) -> graphspec.Runtime:
        key = (name, k, tuple(batch_sizes), tuple(modes), fold_norms)
        if key not in cache:
            target, draft = pair_dirs(name)
            cache[key] = graphspec.Runtime.from_pretrained(
                target,
                draft,
                k=k,
                batch_sizes=batch_sizes,
                dtype="float32",
                device="cpu",
                max_seq_len=MAX_SEQ,
                modes=modes,
                fold_norms=fold_norms,
            )
        return cache[key]

    return make


@pytest.fixture(scope="session")
def hf_greedy(pair_dirs):
    """transformers generate(do_sample=False) on the target, one prompt at a time, cut after EOS."""
    models, memo = {}, {}

    def run(name: str, prompt: list[int], max_new_tokens: int, eos: list[int]) -> list[int]:
        key = (name, tuple(prompt), max_new_tokens, tuple(eos))
        if key not in memo:
            target, _ = pair_dirs(name)
            if target not in models:
                models[target] = load_hf(target)
            ids = torch.tensor([prompt])
            out = (
                models[target]
                .generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=0,
                    do_sample=False,
                    eos_token_id=eos or None,
                    pad_token_id=0,
                )[0, len(prompt) :]
                .tolist()
            )
            for index, token in enumerate(out):
                if token in eos:
                    out = out[: index + 1]
                    break
            memo[key] = out
        return memo[key]

    return run
