"""tools/train_demo_dflash.py: a two-step run against the demo target on a tiny stand-in standard library
trains on train-split files only, writes a z-lab DFlash directory that graphspec loads and drafts from
(the same drafts as the training-side module), records itself in a metadata.json, and refuses bad flags."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from graphspec import ops
from graphspec.drafters.base import PrefillView, StepView
from graphspec.drafters.dflash import DFlash
from graphspec.examples import DEMO_TARGET, file_sha256
from graphspec.models.loading import load_model

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import demo_dflash  # noqa: E402
import train_demo_dflash  # noqa: E402

CODE = "def add(a, b):\n    return a + b\n\n\nclass Box:\n    def __init__(self, x):\n        self.x = x\n"


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def stdlib(tmp_path):
    """Two train files and two held-out ones (json, argparse) and a test of held-out code (in neither)."""
    root = tmp_path / "stdlib"
    for name, copies in (("alpha.py", 20), ("beta/__init__.py", 20), ("json/__init__.py", 30), ("argparse.py", 5)):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(CODE * copies)
    (root / "test" / "test_json.py").parent.mkdir()
    (root / "test" / "test_json.py").write_text(CODE)
    return root


def run(stdlib: Path, out: Path, *extra: str) -> dict:
    return train_demo_dflash.main([
        "--target", str(DEMO_TARGET), "--stdlib", str(stdlib), "--out", str(out), "--seq-len", "24",
        "--batch-size", "2", "--anchors", "3", "--steps", "2", "--eval-every", "1", "--eval-windows", "2",
        "--threads", "1", "--seconds", "120", *extra,
    ])  # fmt: skip


def test_smoke_run_saves_a_drafter_graphspec_loads_and_drafts_with(stdlib, tmp_path):
    pair = tmp_path / "pair"
    pair.mkdir()
    (pair / "metadata.json").write_text(json.dumps({"sha256": {}, "bytes": {}}))
    out = pair / "dflash"
    summary = run(stdlib, out, "--metadata", str(pair / "metadata.json"))
    assert summary["training"]["steps_done"] == 2 and len(summary["training"]["log"]) == 2
    assert summary["corpus"]["train_files_used"] == 2 and summary["corpus"]["heldout_files"] == 2
    assert summary["mask_token"] == {"token": "<|endoftext|>", "id": 0}
    assert summary["target_layer_ids"] == [1, 3, 5]  # z-lab's spread over the demo target's 8 layers
    metadata = json.loads((pair / "metadata.json").read_text())
    assert metadata["dflash"]["training"]["steps_done"] == 2
    assert sorted(metadata["sha256"]) == ["dflash/config.json", "dflash/model.safetensors"]
    assert all(file_sha256(pair / name) == digest for name, digest in metadata["sha256"].items())

    # graphspec reads the directory and drafts what the training-side module drafts (fp16-saved weights).
    target = load_model(DEMO_TARGET, "float32", "cpu")
    drafter = DFlash(out, target, torch.float32, "cpu")
    assert drafter.describe() == {"kind": "dflash", "block_size": 5, "target_layer_ids": [1, 3, 5], "mask_token_id": 0}
    hf_target = train_demo_dflash.AutoModelForCausalLM.from_pretrained(DEMO_TARGET, dtype=torch.float32).eval()
    trained = demo_dflash.DFlashDrafter.load(out)
    tokens = torch.tensor([target.tokenizer(CODE)["input_ids"][:12]])
    features, hidden = demo_dflash.target_features(hf_target, tokens, [1, 3, 5])
    anchor = tokens.shape[1] - 1
    with torch.no_grad():
        want = trained(hf_target, features, tokens, torch.tensor([[anchor]]))[0, 0]
    state = {s.name: s.allocate("cpu") for s in drafter.states(1, 64, 4, torch.float32)}
    prompt, slots, length = tokens[:, :anchor], torch.tensor([0]), torch.tensor([anchor])
    last = tokens[:, anchor]
    drafter.prefill(PrefillView(prompt, slots, length, hidden[:, :anchor], last, features[:, :anchor]), state)
    inputs = {"committed_len": length + 1, "slot_ids": slots, "last_tokens": torch.stack((prompt[:, -1], last), 1)}
    proposal = drafter.propose(drafter.params(), StepView(inputs, 4, lambda x, i: ops.argmax(x)), state)
    torch.testing.assert_close(proposal.logits[0], want, rtol=1e-4, atol=1e-4)
    assert proposal.tokens[0].tolist() == want.argmax(-1).tolist()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--block-size", "1"], "--block-size"),
        (["--target-layer-ids", "1,8"], "--target-layer-ids"),
        (["--gen-batch", "0"], "--gen-batch"),
    ],
)
def test_bad_flags_are_refused(stdlib, tmp_path, flags, named, capsys):
    with pytest.raises(SystemExit) as refused:
        run(stdlib, tmp_path / "out", *flags)
    assert named in capsys.readouterr().err + str(refused.value.code)
    assert not (tmp_path / "out").exists()


@pytest.mark.gpu
def test_smoke_run_on_the_gpu(stdlib, tmp_path):
    """--device cuda: streams, anchors, generation and the drafter on the GPU; the saved files load as on a CPU."""
    summary = run(stdlib, tmp_path / "dflash", "--device", "cuda", "--gen-sequences", "2", "--gen-prompt", "8")
    assert summary["device"] == "cuda" and summary["training"]["steps_done"] == 2
    assert demo_dflash.DFlashDrafter.load(tmp_path / "dflash").block_size == 5
