"""Step time of a hybrid (Gated DeltaNet) target with its own MTP head and with the n-gram drafter, next to
the target's decode and verify forwards, in one run.

On a random bf16 checkpoint shaped like a small dense Qwen3.5 (SHAPES["qwen3_5-small"]; the shape is
assumed, check it against the public config before quoting numbers) with one random MTP layer (mtp.*),
or the tiny stand-in with --preset tiny, this compiles the greedy step for every drafter in --drafters
(K, buckets --batch-sizes) and times one captured step per bucket with every row real at committed
length about --context. Next to them, per bucket, graphspec's own target forwards, traced and lowered
the way the step is (same passes and kernels) and captured:
- decode: one token per row (the verify-form forward at T = 1, then the state selection at index 0:
  what a target-only decode step does to the linear-attention state);
- verify: the same over K+1 tokens per row (the selection at index K).
Random weights accept almost nothing, so step time is what this compares.

    python benchmarks/bench_hybrid.py --json hybrid.json                      # on the H200
    python benchmarks/bench_hybrid.py --preset tiny --device cpu --replays 3   # smoke test of this script
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import save_file
from torch.fx.experimental.proxy_tensor import make_fx

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common
from benchmarks.bench_step import time_drafter_steps, time_replays
from benchmarks.target_only import DECODE_PASSES
from graphspec import ops
from graphspec.compiled import device_sm
from graphspec.config import PassContext
from graphspec.drafters.mtp import MtpHead, layer_names
from graphspec.input_names import weight_input_names
from graphspec.models.decoder import checkpoint_shapes, checkpoint_state
from graphspec.models.hybrid import HybridLM
from graphspec.models.loading import build_model
from graphspec.models.target import target_forward
from graphspec.state import snapshot_name
from graphspec.trace import model_inputs, name_graph

DRAFTERS = ("mtp", "ngram")
SHAPES = {
    # Assumed small dense Qwen3.5 (about 0.8B parameters): 18 GDN + 6 gated-attention layers (3:1).
    "qwen3_5-small": dict(
        vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
        num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16, tie_word_embeddings=True,
    ),
    "tiny": dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, tie_word_embeddings=True,
    ),
}  # fmt: skip


def write_checkpoint(directory: Path, shape: str, device: str, seed: int) -> Path:
    """config.json + model.safetensors (target and one MTP layer in the mtp.* layout) with N(0, 0.02)
    bf16 weights; zero-centred norms are N(0, 0.02), the gated output norm 1 + N(0, 0.02)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = transformers.Qwen3_5TextConfig(
        **SHAPES[shape], max_position_embeddings=32768, mtp_num_hidden_layers=1, bos_token_id=1,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    config.save_pretrained(directory)
    model = build_model(config)
    head = MtpHead(model, 1)
    own = {name: tuple(t.shape) for name, t in checkpoint_state(head).items() if name.startswith("layers.")}
    stored = layer_names("qwen3_next", 0, config.num_hidden_layers, list(own))
    shapes = {**checkpoint_shapes(model), **{stored[name]: size for name, size in own.items()}}
    generator = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, size in shapes.items():
        weight = torch.randn(size, generator=generator, device=device, dtype=torch.bfloat16).mul_(0.02)
        state[name] = (weight.add_(1.0) if name.endswith("linear_attn.norm.weight") else weight).cpu()
    save_file(state, str(directory / "model.safetensors"))
    return directory


def trace_forward(model: HybridLM, batch: int, positions: int, max_seq_len: int, device: str) -> Any:
    """(params..., tokens [B, T], start [B], slots [B], states...) -> greedy tokens [B, T]: the target's
    verify-form forward, then every snapshot state selected at index T - 1; lowered, in place."""
    params = model_inputs(model)
    names = list(params)
    declared = model.states(batch, max_seq_len, positions - 1, next(model.parameters()).dtype)

    def program(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        bound = dict(zip(names, flat[: len(names)], strict=True))
        tokens, start, slots, *values = flat[len(names) :]
        states = {state.name: value for state, value in zip(declared, values, strict=True)}
        logits, after = target_forward(model, bound, tokens, start, slots, states, "logits", snapshots=True)
        last = torch.full_like(start, positions - 1)
        for state in declared:
            if state.rollback == "snapshot":
                after[state.name] = ops.select_update(after[state.name], slots, after[snapshot_name(state.name)], last)
        return (logits.argmax(dim=-1), *(after[state.name] for state in declared))

    example = [
        torch.zeros((batch, positions), dtype=torch.int64, device=device),
        torch.zeros(batch, dtype=torch.int64, device=device),
        torch.arange(batch, device=device),
        *(state.allocate(device, zeroed=False) for state in declared),
    ]
    gm = make_fx(program, tracing_mode="fake")(*params.values(), *example)
    # named as the step names its inputs (the registry's GEMVs take only target.* / draft.* weights)
    name_graph(gm, (*weight_input_names(names), "tokens", "start", "slots", *(s.name for s in declared)))
    dtype = next(model.parameters()).dtype
    ctx = PassContext(k=0, batch=batch, mode="greedy", sm=device_sm(device), device=device, dtype=str(dtype))
    for step in DECODE_PASSES:
        gm = step.run(gm, ctx).gm
    return gm, example


def time_target_forward(
    model: HybridLM, batch: int, positions: int, args: argparse.Namespace, profiles: dict[str, Any] | None = None
) -> float:
    """Median ms of the target's forward over `positions` tokens per row, captured on CUDA, rows at
    committed length about args.context, states random. With `profiles` and batch == args.profile,
    profiles["decode" or "verify"] gets the kernels of one replay (common.kernel_profile)."""
    gm, example = trace_forward(model, batch, positions, args.max_seq_len, args.device)
    weights = list(model_inputs(model).values())
    tokens, start, slots, *states = example
    tokens.random_(0, model.spec.vocab_size)
    start.fill_(args.context)
    for state in states:
        state.normal_()

    def step() -> None:
        gm(*weights, tokens, start, slots, *states)

    if profiles is not None and batch == args.profile and common.is_cuda(args.device):
        run = common.capture(step, args.device).replay
        profiles["decode" if positions == 1 else "verify"] = common.kernel_profile(run, 3, top=15)
    return time_replays(step, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(SHAPES), default="qwen3_5-small")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("-k", "--k", type=int, default=3)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--drafters", default=",".join(DRAFTERS))
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--context", type=int, default=512, help="committed length of the timed rows")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", type=int, default=None, metavar="B", help="print the kernels of each at batch B")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_hybrid: CUDA is not available; pass --device cpu for a smoke run", file=sys.stderr)
        return 2
    buckets = tuple(int(b) for b in args.batch_sizes.split(","))
    drafters = tuple(name for name in args.drafters.split(",") if name)
    unknown = sorted(set(drafters) - set(DRAFTERS))
    if unknown:
        parser.error(f"unknown drafter(s) {unknown}; choose from {DRAFTERS}")
    if args.profile is not None and args.profile not in buckets:
        parser.error(f"--profile {args.profile} is not one of --batch-sizes {args.batch_sizes}")
    report: dict[str, Any] = {"device": common.device_name(args.device), "args": vars(args), "rows": []}
    options = dict(k=args.k, dtype="bfloat16", device=args.device, max_seq_len=args.max_seq_len, modes=("greedy",))
    with tempfile.TemporaryDirectory(dir=common.checkpoint_dir(0)) as workdir:
        target_dir = write_checkpoint(Path(workdir) / "target", args.preset, args.device, seed=1)
        steps: dict[str, dict[int, float]] = {}
        profiles: dict[str, Any] = {}
        target = None
        for name in drafters:
            steps[name], target = time_drafter_steps(target_dir, name, buckets, args, name, profiles, **options)
        decode = {b: time_target_forward(target, b, 1, args, profiles) for b in buckets}
        verify = {b: time_target_forward(target, b, args.k + 1, args, profiles) for b in buckets}
    header = f"{'B':>4} {'target decode':>14} {'verify K+1':>11}" + "".join(f" {n + ' step':>12}" for n in drafters)
    ratios = "".join(f" {n + ' /decode':>12}" for n in drafters)
    lines = [f"{args.preset}, K={args.k}, context {args.context}, {report['device']}, median ms per captured step"]
    lines.append(header + ratios)
    for b in buckets:
        row = {"batch": b, "target_decode_ms": decode[b], "verify_ms": verify[b], "steps_ms": {}}
        text = f"{b:>4} {decode[b]:>14.3f} {verify[b]:>11.3f}"
        for name in drafters:
            row["steps_ms"][name] = steps[name][b]
            text += f" {steps[name][b]:>12.3f}"
        text += "".join(f" {steps[name][b] / decode[b]:>12.2f}" for name in drafters)
        lines.append(text)
        report["rows"].append(row)
    print("\n".join(lines))
    for label, profile in profiles.items():
        common.print_kernel_profile(f"kernels of one captured {label} at batch {args.profile}", profile)
    report["profiles"] = profiles
    if args.json:
        common.write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
