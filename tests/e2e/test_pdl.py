"""Programmatic dependent launch (the default; kernels/common.pdl_launch) end to end on a GPU: the captured
steps launch the one- and few-row GEMVs, the SwiGLU GEMV, attention and its reduce with PDL, and generate the same
tokens as in plain stream order (PDL changes when a kernel may start, never what it computes)."""

from __future__ import annotations

import random

import pytest
import torch

import graphspec

pytestmark = pytest.mark.gpu
HEADS_64 = dict(num_attention_heads=2, num_key_value_heads=1)
OPTIONS = dict(k=4, batch_sizes=(1, 2), dtype="bfloat16", device="cuda", max_seq_len=256, modes=("greedy",))


def test_pdl_changes_no_token(checkpoint_factory, monkeypatch):
    # Imported here, not at collection: the CPU suite's kernel tests import the kernel modules only once the Triton
    # interpreter is on (tests/kernels/conftest.py), and collection runs in every worker.
    from graphspec.kernels import attention, gemv

    target = checkpoint_factory("llama", 0, hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    draft = checkpoint_factory("llama", 1, hidden_size=128, intermediate_size=256, num_hidden_layers=2, **HEADS_64)
    rng = random.Random(0)
    prompts = [[rng.randrange(128) for _ in range(rng.randrange(5, 40))] for _ in range(2)]  # the checkpoints' vocab
    outputs, launches = {}, {}
    real = {module: module.pdl_launch for module in (gemv, attention)}
    for setting in ("0", "1"):
        monkeypatch.setenv("GRAPHSPEC_PDL", setting)
        seen = launches[setting] = []
        for module, launch in real.items():  # the launchers look pdl_launch up at each launch: record what it says
            monkeypatch.setattr(
                module, "pdl_launch", lambda device, f=launch, seen=seen: seen.append(f(device)) or seen[-1]
            )
        runtime = graphspec.Runtime.from_pretrained(target, draft, **OPTIONS)
        outputs[setting] = [list(r.token_ids) for r in runtime.generate(prompts, max_new_tokens=48, stop_token_ids=())]
        del runtime
    assert outputs["1"] == outputs["0"]
    assert launches["0"] and not any(launch["USE_PDL"] for launch in launches["0"])
    pdl_possible = torch.cuda.get_device_capability()[0] >= 9
    assert all(launch["USE_PDL"] is pdl_possible for launch in launches["1"]), launches["1"][:3]
