"""bf16 parity of graphspec's decoder with transformers on a Llama-3.1-8B-shaped random checkpoint.

Builds the random model directly on the GPU in bf16, saves it with save_pretrained, then loads the
checkpoint twice (transformers, then graphspec.models.load_model) one after the other, so only one
16 GB copy of the weights is ever resident. Both run the same prompts of different lengths: graphspec
as one right-padded batch (as the runtime prefills), transformers one unpadded row at a time.

Reports, per run: cosine similarity and max abs difference of the last-position logits, and argmax
agreement over every prompt position, overall and outside near-ties (positions where the top-2 logits
are closer than --tie-rel times the top logit's magnitude, where bf16 rounding may legitimately flip
the argmax).

How much argmax agreement bf16 allows is measured, not assumed: transformers also runs the checkpoint
in fp32, and both bf16 implementations are scored against that fp32 truth. graphspec passes when its
cosine with transformers-bf16 is > --min-cosine and its fp32 agreement outside near-ties is no worse
than transformers-bf16's own minus --agreement-slack. (Two bf16 implementations can agree with each
other less than either agrees with fp32: each rounds differently.)

    python scripts/gpu_parity.py                 # H200: 8B shape, bf16, cuda (a few minutes, 16 GB disk)
    python scripts/gpu_parity.py --small         # the same code on a tiny config on CPU (seconds)
    python scripts/gpu_parity.py --out D --reuse # keep the checkpoint in D and reuse it next time
    python scripts/gpu_parity.py --device cpu --layers 2 --lengths 64,37,16,1   # 8B widths, 2 layers, CPU
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

# Make `graphspec` importable when the script runs from a source checkout without installing it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common
from graphspec.models import load_model

# The Llama-3.1-8B shape is benchmarks/common.py's "llama-8b"; --small shrinks it to a CPU self-test.
SMALL_OVERRIDES = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)
# 0.02 * sqrt(4096 / 64): gives the tiny model the 8B's activation scales, so attention is as sharp
# and position-sensitive as there (at 0.02 a 64-wide model attends almost uniformly).
SMALL_INIT_RANGE = 0.16
FULL_PROMPT_LENGTHS = (512, 37, 300, 129, 1, 256, 200, 64)
SMALL_PROMPT_LENGTHS = (40, 7, 25, 1)


@dataclass
class Logits:
    last: torch.Tensor  # [B, V] float32 on CPU: logits at each prompt's last position
    top2: list[torch.Tensor]  # per prompt [T, 2] float32 values of the two largest logits
    argmax: list[torch.Tensor]  # per prompt [T] int64


def parity_config(small: bool, layers: int | None) -> transformers.PretrainedConfig:
    fields = dict(common.SHAPES["llama-8b"])
    if small:
        fields.update(SMALL_OVERRIDES, rope=dict(fields["rope"], original_max_position_embeddings=64))
    if layers:
        fields["num_hidden_layers"] = layers
    config = common.make_config(fields)
    if small:
        config.initializer_range = SMALL_INIT_RANGE
    return config


def build_checkpoint(directory: Path, config: transformers.PretrainedConfig, device: str, seed: int) -> None:
    """Random Llama weights created on `device` in bf16 (no fp32 copy), saved with save_pretrained."""
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # parameters are born bf16: 16 GB, not 32 GB then a cast
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        # Norm weights start at exactly one; perturb them so a mis-loaded norm cannot go unnoticed.
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(directory)
    del model
    free_memory()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def load_transformers(directory: Path, device: str, dtype: torch.dtype) -> transformers.PreTrainedModel:
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, device_map=device)
    except (ImportError, ValueError):  # device_map needing accelerate on some versions: load, then move
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device)
    return model.eval()


def summarize(per_prompt_logits: list[torch.Tensor]) -> Logits:
    """Keep only what the comparison needs, on CPU, so the model can be freed before the next loads."""
    last = torch.stack([logits[-1].float().cpu() for logits in per_prompt_logits])
    top2 = [logits.float().topk(2, dim=-1).values.cpu() for logits in per_prompt_logits]
    argmax = [logits.float().argmax(dim=-1).cpu() for logits in per_prompt_logits]
    return Logits(last, top2, argmax)


@torch.inference_mode()
def run_transformers(directory: Path, prompts: list[torch.Tensor], device: str, dtype: torch.dtype) -> Logits:
    model = load_transformers(directory, device, dtype)
    outputs = [model(prompt[None].to(device)).logits[0] for prompt in prompts]  # each [T, V]
    result = summarize(outputs)
    del model, outputs
    free_memory()
    return result


@torch.inference_mode()
def run_graphspec(directory: Path, prompts: list[torch.Tensor], device: str) -> Logits:
    model = load_model(directory, dtype="bfloat16", device=device).model
    rows, longest = len(prompts), max(len(p) for p in prompts)
    tokens = torch.zeros((rows, longest), dtype=torch.int64, device=device)  # right-padded [B, T]
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt.to(device)
    cache = model.new_cache(rows, longest, torch.bfloat16, device)
    start = torch.zeros(rows, dtype=torch.int64, device=device)
    hidden, _ = model(tokens, start, torch.arange(rows, device=device), cache, in_place=True)  # [B, T, hidden]
    # One row at a time keeps the [T, V] logits small (a [B, T, V] tensor would be several GB).
    outputs = [model.logits(hidden[row, : len(prompt)]) for row, prompt in enumerate(prompts)]
    result = summarize(outputs)
    del model, cache, hidden, outputs
    free_memory()
    return result


def compare(ours: Logits, reference: Logits, tie_rel: float) -> dict[str, float]:
    cosine = torch.nn.functional.cosine_similarity(ours.last, reference.last, dim=-1)  # [B]
    agree = torch.cat([a == b for a, b in zip(ours.argmax, reference.argmax, strict=True)])
    top2 = torch.cat(reference.top2)  # [positions, 2]
    # bf16 keeps 8 significant bits, so rounding noise scales with the logits' magnitude.
    clear = top2[:, 0] - top2[:, 1] > tie_rel * top2[:, 0].abs()
    return {
        "cosine_min": cosine.min().item(),
        "cosine_mean": cosine.mean().item(),
        "max_abs_diff": (ours.last - reference.last).abs().max().item(),
        "reference_logit_absmax": reference.last.abs().max().item(),
        "positions": agree.numel(),
        "agree_all": agree.float().mean().item(),
        "near_ties": int((~clear).sum()),
        "agree_outside_ties": agree[clear].float().mean().item() if clear.any() else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="tiny config on CPU (a self-test of this script)")
    parser.add_argument("--out", type=Path, help="checkpoint directory (default: a temporary one, deleted)")
    parser.add_argument("--reuse", action="store_true", help="reuse the checkpoint in --out if it has one")
    parser.add_argument("--device", help="default: cuda, or cpu with --small")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tie-rel", type=float, default=0.01, help="top-2 gap, relative to |top-1 logit|, below which a flip is a tie"
    )
    parser.add_argument("--min-cosine", type=float, default=0.99)
    parser.add_argument(
        "--agreement-slack",
        type=float,
        default=0.01,
        help="graphspec's fp32 agreement outside near-ties may trail transformers-bf16's by this much",
    )
    parser.add_argument("--layers", type=int, help="override num_hidden_layers (a cheaper run at full widths)")
    parser.add_argument("--lengths", help="comma list of prompt lengths (default: 8 prompts of 1..512 tokens)")
    args = parser.parse_args(argv)

    device = args.device or ("cpu" if args.small else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device; use --small (or --device cpu) to run on CPU")
    config = parity_config(args.small, args.layers)
    lengths = SMALL_PROMPT_LENGTHS if args.small else FULL_PROMPT_LENGTHS
    if args.lengths:
        lengths = tuple(int(n) for n in args.lengths.split(","))
    generator = torch.Generator().manual_seed(args.seed + 1)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=generator) for n in lengths]

    temporary = None if args.out else tempfile.TemporaryDirectory(prefix="gpu_parity_")
    directory = args.out or Path(temporary.name)
    timings: dict[str, float] = {}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        if args.reuse and (directory / "config.json").is_file():
            print(f"reusing checkpoint in {directory}")
        else:
            build_checkpoint(directory, config, device, args.seed)
        timings["build+save"] = time.perf_counter() - start

        start = time.perf_counter()
        reference = run_transformers(directory, prompts, device, torch.bfloat16)
        timings["transformers bf16"] = time.perf_counter() - start
        start = time.perf_counter()
        exact = run_transformers(directory, prompts, device, torch.float32)
        timings["transformers fp32"] = time.perf_counter() - start
        start = time.perf_counter()
        ours = run_graphspec(directory, prompts, device)
        timings["graphspec"] = time.perf_counter() - start
    finally:
        if temporary is not None:
            temporary.cleanup()

    result = compare(ours, reference, args.tie_rel)
    ours_fp32 = compare(ours, exact, args.tie_rel)
    theirs_fp32 = compare(reference, exact, args.tie_rel)
    bar = theirs_fp32["agree_outside_ties"] - args.agreement_slack
    failures = []
    if not result["cosine_min"] > args.min_cosine:
        failures.append(f"cosine_min {result['cosine_min']:.5f} <= {args.min_cosine}")
    if not ours_fp32["agree_outside_ties"] >= bar:
        failures.append(
            f"fp32 agreement outside ties {ours_fp32['agree_outside_ties']:.4f} < transformers-bf16's "
            f"{theirs_fp32['agree_outside_ties']:.4f} - {args.agreement_slack}"
        )

    shape = "small (CPU self-test)" if args.small else "Llama-3.1-8B shape"
    if args.layers:
        shape += f", {args.layers} layers"
    device_name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    print()
    print(
        f"graphspec vs transformers, bf16, {shape}, {device_name}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}"
    )
    print(f"prompts: {len(prompts)} of lengths {list(lengths)} (graphspec: one right-padded batch)")
    rows = [
        ("cosine (last pos, min)", f"{result['cosine_min']:.6f}", f"> {args.min_cosine}"),
        ("cosine (last pos, mean)", f"{result['cosine_mean']:.6f}", ""),
        (
            "max |diff| (last pos)",
            f"{result['max_abs_diff']:.4f}",
            f"logit absmax {result['reference_logit_absmax']:.2f}",
        ),
        ("argmax agree (all)", f"{result['agree_all']:.4f}", f"{result['positions']} positions"),
        ("near-ties", f"{result['near_ties']}", f"top-2 gap <= {args.tie_rel} * |top-1|"),
        ("argmax agree (no ties)", f"{result['agree_outside_ties']:.4f}", "graphspec-bf16 vs transformers-bf16"),
        ("fp32 agree, graphspec", f"{ours_fp32['agree_outside_ties']:.4f}", f">= {bar:.4f} (outside fp32 ties)"),
        ("fp32 agree, transformers", f"{theirs_fp32['agree_outside_ties']:.4f}", "transformers-bf16 vs fp32"),
        ("fp32 cosine, graphspec", f"{ours_fp32['cosine_min']:.6f}", "min over prompts"),
        ("fp32 cosine, transformers", f"{theirs_fp32['cosine_min']:.6f}", "min over prompts"),
        *((f"time {name}", f"{seconds:.1f} s", "") for name, seconds in timings.items()),
    ]
    width = max(len(name) for name, _, _ in rows)
    print("-" * (width + 40))
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>12}  {note}")
    print("-" * (width + 40))
    print("FAIL: " + "; ".join(failures) if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
