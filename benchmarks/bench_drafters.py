"""Step time per drafter next to graphspec's own target-only forwards, in one run.

On random bf16 checkpoints shaped like Llama-3.1-8B (target, with one random MTP layer in the
DeepSeek-V3 layout), Llama-3.2-1B (draft model), a random EAGLE-3 head at the target's shapes (for
Llama-3.1-8B those of the public EAGLE-3 heads: hidden 4096, 32 heads, 8 kv heads, intermediate 14336,
draft_vocab_size 32000) and random DFlash drafters (z-lab layout: DFLASH_LAYERS Qwen3-style layers at the
target's width, heads and MLP size, target_layer_ids spread over the target as z-lab's
build_target_layer_ids does, one per block size in --dflash-blocks, each drafting K = block - 1), or the
tiny stand-ins with --preset tiny-llama, this compiles the speculation step for every drafter in
--drafters (greedy, K, buckets --batch-sizes) and times one captured step per bucket with every row
real at committed length about --context. Next to them, per bucket:
- the target-only decode step: graphspec's target forward over one token per row, same passes and
  kernels, captured (benchmarks/target_only.py);
- the target's verify forward alone: the same over K+1 tokens per row (for DFlash, its block size),
  greedy picks included; "/verify" is a drafter's step over that (issue 17 asks <= 1.2 for DFlash at B 1).
Below the table, issue 16's floors from the copy rate measured in the same run (weights read once a step: the
target without its input embedding for the decode, plus K x the draft's for a draft model's step) and each
bucket's ratio to them; then how many products each target forward left to torch (0 for a batch-1 decode on sm_90,
whose projections run graphspec's GEMVs; the JSON's "lowering" has every forward's kernels by name).
Random weights accept almost nothing, so step time is what this compares; tokens per step depends on
the text (see tools/measure_acceptance.py for the demo pair's).
--token-map-sizes N[,N...] adds, for every drafter column that takes a token map (MTP, EAGLE-3, DFlash), a
column `<column>_hot<N>` per size: the same drafter drafting over N random distinct target ids (a token map,
drafters/token_map.py; FR-Spec / SGLang's hot vocabulary; for EAGLE-3, N of its head's own draft ids, when
N is below its draft vocabulary), so its step with and without a reduced lm_head sit side by side in one run.
--k-by-bucket B:K,... compiles every column with those buckets drafting their own K (compile's k_by_bucket;
the state laid out for the largest), each bucket's /verify taken over its own K + 1.

    python benchmarks/bench_drafters.py --json drafters.json             # on the H200 (~3 minutes)
    python benchmarks/bench_drafters.py --drafters dflash --batch-sizes 1,4,16 --json dflash.json   # DFlash b8, b16
    python benchmarks/bench_drafters.py --preset tiny-llama --device cpu --max-seq-len 256 --context 64   # smoke test
    python benchmarks/bench_drafters.py --drafters mtp,dflash --token-map-sizes 32768,16384 --batch-sizes 1,4,16
    python benchmarks/bench_drafters.py --batch-sizes 1,16,64 --k-by-bucket 16:2,64:1   # fewer drafts at large B
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common, target_only
from benchmarks.bench_step import (
    PRESETS,
    copy_bandwidth,
    time_drafter_steps,
    time_replays,
    weight_bytes,
    write_checkpoint,
)
from graphspec import pipeline
from graphspec.cli import bucket_ks
from graphspec.compiled import device_sm
from graphspec.config import FOLD_NORMS
from graphspec.drafters.dflash import DFlashHead
from graphspec.drafters.eagle3 import Eagle3Head, aux_layers
from graphspec.drafters.mtp import MtpHead, layer_names
from graphspec.drafters.token_map import write_token_map
from graphspec.models.decoder import checkpoint_state
from graphspec.models.loading import build_model, load_config
from graphspec.models.spec import ModelSpec, rope_frequencies
from graphspec.trace import model_inputs

DRAFTERS = ("draft_model", "ngram", "mtp", "eagle3", "dflash")
# Without --drafters: DFlash's two blocks are left to their own run (scripts/gpu_check.sh keeps its time).
DEFAULT_DRAFTERS = ("draft_model", "ngram", "mtp", "eagle3")
EAGLE3_DRAFT_VOCAB = 32000  # the public Llama-3.1-8B EAGLE-3 heads'
DFLASH_LAYERS = 5  # z-lab's 8B DFlash drafters (e.g. Qwen3-8B-DFlash-b16) have five layers


def add_mtp_head(directory: Path, device: str, seed: int) -> None:
    """Give the target checkpoint one random MTP layer in the DeepSeek-V3 layout (model.layers.{L}.*)
    and num_mtp_layers = 1 in its config, as a checkpoint that ships an MTP head has."""
    config = transformers.AutoConfig.from_pretrained(directory)
    config.num_mtp_layers = 1
    config.save_pretrained(directory)
    head = MtpHead(build_model(config), 1)
    own = [name for name in checkpoint_state(head) if name.startswith("layers.")]
    names = layer_names("deepseek_v3", 0, config.num_hidden_layers, own)
    state = load_file(str(directory / "model.safetensors"))
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, tensor in checkpoint_state(head).items():
        if name in names:
            weight = torch.randn(tensor.shape, generator=generator, device=device, dtype=torch.bfloat16).mul_(0.02)
            state[names[name]] = (weight.add_(1.0) if name.endswith("norm.weight") else weight).cpu()
    save_file(state, str(directory / "model.safetensors"))


def write_eagle3_head(directory: Path, target_dir: Path, device: str, seed: int) -> Path:
    """A random EAGLE-3 head directory for the target in the public layout: the target's width, heads,
    MLP size and rope, draft_vocab_size min(32000, V) mapped by a random sorted d2t, the target's
    embedding (no embed_tokens.weight of its own). Written before the target's MTP layer is added."""
    directory.mkdir(parents=True, exist_ok=True)
    raw = json.loads((target_dir / "config.json").read_text())
    target_config = load_config(target_dir)
    vocab = target_config.vocab_size
    draft_vocab = min(EAGLE3_DRAFT_VOCAB, vocab)
    raw.update(
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        draft_vocab_size=draft_vocab,
        target_hidden_size=target_config.hidden_size,
        tie_word_embeddings=False,
    )
    layers = target_config.num_hidden_layers
    if layers < 4:  # the default aux layers (2, L // 2, L - 3) need 4: tiny presets pin their own
        raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, layers // 2, layers - 1]}
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    config = load_config(directory)
    features = len(aux_layers(raw, directory, target_config.num_hidden_layers)) * target_config.hidden_size
    shared = build_model(target_config).model.embed_tokens  # meta: the names and shapes are what matter
    head = Eagle3Head(ModelSpec.from_config(config), features, draft_vocab, shared, False, *rope_frequencies(config))
    used = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:draft_vocab].sort().values
    state = {"d2t": used - torch.arange(draft_vocab)}
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, tensor in checkpoint_state(head).items():
        if name != "embed_tokens.weight":
            weight = torch.randn(tensor.shape, generator=generator, device=device, dtype=torch.bfloat16).mul_(0.02)
            state[name] = (weight.add_(1.0) if name.endswith("norm.weight") else weight).cpu()
    save_file(state, str(directory / "model.safetensors"))
    return directory


def dflash_layer_ids(target_layers: int, draft_layers: int) -> list[int]:
    """z-lab's build_target_layer_ids: the middle layer for one drafter layer, else evenly from 1 to
    L - 3 (tiny targets: spread over what there is)."""
    if draft_layers == 1:
        return [target_layers // 2]
    start, end = (1, target_layers - 3) if target_layers >= 4 + draft_layers else (0, target_layers - 1)
    ids = [round(start + index * (end - start) / (draft_layers - 1)) for index in range(draft_layers)]
    return sorted(set(ids))


def write_dflash_drafter(directory: Path, target_dir: Path, block: int, device: str, seed: int) -> Path:
    """A random DFlash drafter directory for the target in the z-lab layout (Qwen3 config with
    architectures ["DFlashDraftModel"], block_size, dflash_config; fc, hidden_norm, layers, norm; no
    embedding or lm_head). Written before the target's MTP layer is added."""
    directory.mkdir(parents=True, exist_ok=True)
    raw = json.loads((target_dir / "config.json").read_text())
    target_config = load_config(target_dir)
    layers = min(DFLASH_LAYERS, target_config.num_hidden_layers)
    ids = dflash_layer_ids(target_config.num_hidden_layers, layers)
    raw.update(
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        num_hidden_layers=layers,
        tie_word_embeddings=False,
        block_size=block,
        num_target_layers=target_config.num_hidden_layers,
        dflash_config={"target_layer_ids": ids, "mask_token_id": target_config.vocab_size - 1},
    )
    raw.pop("layer_types", None)
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    config = load_config(directory)
    spec = ModelSpec.from_config(config)
    head = DFlashHead(spec, len(ids) * target_config.hidden_size, build_model(target_config), *rope_frequencies(config))
    state = {}
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, tensor in checkpoint_state(head).items():
        if name not in ("embed_tokens.weight", "lm_head.weight"):
            weight = torch.randn(tensor.shape, generator=generator, device=device, dtype=torch.bfloat16).mul_(0.02)
            state[name] = (weight.add_(1.0) if name.endswith("norm.weight") else weight).cpu()
    save_file(state, str(directory / "model.safetensors"))
    return directory


TOKEN_MAP_KINDS = ("mtp", "eagle3", "dflash")  # the drafters that take a token map


def hot_column(column: str, size: int) -> str:
    """The column name of `column`'s drafter with a random token map of `size` ids: mtp_hot32k, dflash_b8_hot1000."""
    return f"{column}_hot{size // 1024}k" if size % 1024 == 0 else f"{column}_hot{size}"


def write_random_token_map(path: Path, ids: torch.Tensor, size: int, device: str, seed: int) -> Path:
    """`size` distinct random ids of `ids` (a permutation drawn on `device`) as a token-map file."""
    generator = torch.Generator(device=device).manual_seed(seed)
    chosen = ids[torch.randperm(ids.numel(), generator=generator, device=device)[:size].cpu()]
    return write_token_map(path, chosen)


def head_target_ids(head_dir: Path) -> torch.Tensor:
    """The target ids an EAGLE-3 head directory drafts (d + d2t[d]); reads d2t alone, not the head's weights."""
    with safe_open(str(head_dir / "model.safetensors"), framework="pt") as handle:
        d2t = handle.get_tensor("d2t")
    return torch.arange(d2t.numel()) + d2t


def time_target_forward(
    model: torch.nn.Module,
    batch: int,
    positions: int,
    args: argparse.Namespace,
    profiles: dict[str, Any] | None = None,
    census: dict[str, dict[str, int]] | None = None,
) -> float:
    """Median ms of the target's forward over `positions` tokens per row (argmax of every position),
    captured on CUDA, with every row at committed length about args.context. With `profiles` and
    batch == args.profile, profiles["target_<positions>"] gets the kernels of one forward; `census`["B=<batch>
    T=<positions>"] gets how its ops were lowered (target_only.lowering_census)."""
    device = args.device
    gm = target_only.trace_decode(model, batch, args.max_seq_len, device_sm(device), positions, skip=args.skip_passes)
    if census is not None:
        census[f"B={batch} T={positions}"] = target_only.lowering_census(gm)
    weights = list(model_inputs(model).values())
    parameter = next(model.parameters())
    cache = model.new_cache(batch, args.max_seq_len, parameter.dtype, device)
    cache.normal_()
    tokens = torch.randint(0, model.spec.vocab_size, (batch, positions), device=device)
    start = torch.full((batch,), args.context, dtype=torch.int64, device=device)
    slots = torch.arange(batch, device=device)

    def step() -> None:
        gm(*weights, tokens, start, slots, cache)

    if profiles is not None and batch == args.profile and common.is_cuda(args.device):
        profiles[f"target_{positions}"] = common.kernel_profile(common.capture(step, args.device).replay, 3, top=10)
    return time_replays(step, args)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens per step when each draft is accepted with probability `acceptance` given the earlier ones
    (Leviathan et al. 2023): 1 + a + ... + a^K."""
    return sum(acceptance**i for i in range(k + 1))


def best_k_lines(
    columns: dict[str, tuple[str, str, int]],
    k_at: dict[tuple[str, int], int],
    steps: dict[str, dict[int, float]],
    decode: dict[int, float],
    buckets: tuple[int, ...],
    acceptances: tuple[float, ...],
) -> list[str]:
    """Per drafter kind, bucket and acceptance: the measured K (k_at: a column's K at a bucket) whose step
    gives the most tokens per ms under expected_tokens, and that rate over the target-only decode's (one
    token per decode step). `columns`: those of one configuration per K (no token-map variants)."""
    lines = ["", "modelled: best K per bucket (tokens per ms over target-only decode) at per-draft acceptance A"]
    lines.append(f"{'drafter':>12} {'A':>5}" + "".join(f" {'B=' + str(b):>14}" for b in buckets))
    kinds = dict.fromkeys(kind for kind, _, _ in columns.values() if kind != "dflash")
    for kind in kinds:
        own = [column for column, (other, _, _) in columns.items() if other == kind]
        for acceptance in acceptances:
            text, best_k = f"{kind:>12} {acceptance:>5.2f}", {}
            for b in buckets:
                rate = {k_at[c, b]: expected_tokens(acceptance, k_at[c, b]) / steps[c][b] for c in own}
                best_k[b] = max(rate, key=rate.get)
                text += f" {f'K={best_k[b]} {rate[best_k[b]] * decode[b]:.2f}x':>14}"
            # as compile options: the largest best K as -k, the buckets that draft fewer as --k-by-bucket
            k = max(best_k.values())
            fewer = ",".join(f"{b}:{best_k[b]}" for b in buckets if best_k[b] < k)
            lines.append(f"{text}   -k {k}" + (f" --k-by-bucket {fewer}" if fewer else ""))
    return lines


def floor_lines(
    bytes_per_s: float,
    target_bytes: int,
    embedding_bytes: int,
    draft_columns: dict[str, tuple[int, int]],
    decode: dict[int, float],
    steps: dict[str, dict[int, float]],
    buckets: tuple[int, ...],
) -> tuple[list[str], dict[str, Any]]:
    """Issue 16's floors from this run's copy rate: the target-only decode reads the target's weights once
    (target_bytes, its input embedding left out: a step reads only its tokens' rows), a draft model's step those
    and K x its draft's (draft_columns: column -> (draft bytes, K)); KV reads are not counted. Issue 16's step
    floor ("about 6.0 ms") also counts the target's untied input embedding (embedding_bytes): a draft column's
    ratio to that one follows in brackets. The lines print each floor and each bucket's ratios; the dict is the
    JSON record."""
    to_ms = lambda nbytes: nbytes / bytes_per_s * 1e3
    floors = {"target_decode": to_ms(target_bytes)}
    floors.update({column: to_ms(target_bytes + k * draft) for column, (draft, k) in draft_columns.items()})
    counted = {column: floors[column] + to_ms(embedding_bytes) for column in draft_columns}
    text = f"target decode {floors['target_decode']:.3f} ms ({target_bytes / 1e9:.2f} GB)"
    for column, (draft, k) in draft_columns.items():
        text += f", {column} step {floors[column]:.3f} ms (+ {k} x {draft / 1e9:.2f} GB; {counted[column]:.3f}"
        text += " with the target's input embedding)"
    lines = ["", f"floors (weights read once a step / this run's copy rate, {bytes_per_s / 1e12:.2f} TB/s): {text}"]
    for b in buckets:
        ratios = [f"target_decode {decode[b] / floors['target_decode']:.2f}x"]
        ratios += [f"{c} {steps[c][b] / floors[c]:.2f}x ({steps[c][b] / counted[c]:.2f}x)" for c in draft_columns]
        lines.append(f"{b:>4} over the floor: {', '.join(ratios)}")
    record = {
        "copy_bytes_per_s": bytes_per_s,
        "target_bytes": target_bytes,
        "floors_ms": floors,
        "floors_with_target_embedding_ms": counted,
    }
    return lines, record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "-k",
        "--k",
        type=lambda text: tuple(int(k) for k in text.split(",")),
        default=(4,),
        metavar="K[,K...]",
        help="drafts per step; several: one column per K (<drafter>_k<K>) for every drafter but DFlash",
    )
    parser.add_argument(
        "--acceptance",
        type=lambda text: tuple(float(a) for a in text.split(",")),
        default=(),
        metavar="A[,A...]",
        help="with several -k: per drafter and bucket, the K of the most tokens per ms if each draft is accepted "
        "with probability A given the ones before it ((1 - A^(K+1)) / (1 - A) tokens per step; a model, not a "
        "measurement)",
    )
    parser.add_argument("--batch-sizes", default="1,4,16,64")
    parser.add_argument("--drafters", default=",".join(DEFAULT_DRAFTERS), help=f"any of {','.join(DRAFTERS)}")
    parser.add_argument("--dflash-blocks", default="8,16", help="DFlash block sizes (each drafts block - 1)")
    parser.add_argument(
        "--token-map-sizes",
        default="",
        help="comma-separated sizes N: for each MTP and DFlash column one more, <column>_hot<N>, drafting over N "
        "random target ids",
    )
    parser.add_argument(
        "--k-by-bucket",
        type=bucket_ks,
        default=[],
        metavar="B:K,...",
        help="these buckets draft their own K (compile's k_by_bucket, e.g. 64:1) in every column whose K is larger; "
        "their /verify is over that K + 1",
    )
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--context", type=int, default=512, help="committed length of the timed rows")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--profile", type=int, default=None, metavar="B", help="print the kernels of each step at batch B"
    )
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--skip-passes",
        type=lambda text: tuple(name for name in text.split(",") if name),
        default=(),
        metavar="PASS[,PASS]",
        help="compile every step and target-only forward without these passes (the A/B of a pass)",
    )
    parser.add_argument(
        "--fold-norms",
        choices=sorted(FOLD_NORMS),
        default="auto",
        help="fold the norms into the projections they feed (compile's fold_norms; auto: on CUDA) (A/B runs)",
    )
    args = parser.parse_args(argv)
    unknown_passes = sorted(set(args.skip_passes) - set(pipeline.PASS_NAMES))
    if unknown_passes:
        parser.error(f"--skip-passes: unknown {unknown_passes}; passes are {', '.join(pipeline.PASS_NAMES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_drafters: CUDA is not available; pass --device cpu for a smoke run", file=sys.stderr)
        return 2
    if args.acceptance and len(args.k) < 2:
        parser.error("--acceptance compares several K: give -k a list (e.g. -k 1,2,3,4)")
    if not all(0 <= a < 1 for a in args.acceptance):
        parser.error(f"--acceptance: each value must be in [0, 1), got {args.acceptance}")
    buckets = tuple(int(b) for b in args.batch_sizes.split(","))
    if len(dict(args.k_by_bucket)) != len(args.k_by_bucket):
        parser.error(f"--k-by-bucket names a bucket twice: {args.k_by_bucket}")
    args.k_by_bucket = dict(args.k_by_bucket)
    if args.profile is not None and args.profile not in buckets:
        parser.error(f"--profile {args.profile} is not one of --batch-sizes {args.batch_sizes}")
    drafters = tuple(name for name in args.drafters.split(",") if name)
    unknown = sorted(set(drafters) - set(DRAFTERS))
    if unknown:
        parser.error(f"unknown drafter(s) {unknown}; choose from {DRAFTERS}")
    hot_sizes = tuple(int(n) for n in args.token_map_sizes.split(",") if n)
    target_shape, draft_shape = PRESETS[args.preset]
    vocab_size = common.make_config(target_shape).vocab_size
    if any(not 1 <= n <= vocab_size for n in hot_sizes):
        parser.error(f"--token-map-sizes: each size must be in 1..{vocab_size} (the target's vocabulary)")
    if hot_sizes and not set(drafters) & set(TOKEN_MAP_KINDS):
        parser.error(f"--token-map-sizes needs a drafter that takes a token map in --drafters: {TOKEN_MAP_KINDS}")
    # args.warmup/replays double as bench_step.time_step's warmup/iteration counts
    report: dict[str, Any] = {"device": common.device_name(args.device), "args": vars(args), "rows": []}
    options = dict(k=max(args.k), dtype="bfloat16", device=args.device, max_seq_len=args.max_seq_len, modes=("greedy",))
    options["skip"] = args.skip_passes
    options["fold_norms"] = FOLD_NORMS[args.fold_norms]
    with tempfile.TemporaryDirectory(dir=common.checkpoint_dir(0)) as workdir:
        target_dir = write_checkpoint(Path(workdir) / "target", target_shape, args.device, seed=1)
        draft_dir = write_checkpoint(Path(workdir) / "draft", draft_shape, args.device, seed=2)
        eagle3_dir = Path(workdir) / "eagle3"
        if "eagle3" in drafters:  # before the MTP layer: the head copies the target's config
            write_eagle3_head(eagle3_dir, target_dir, args.device, seed=4)
        # column -> (drafter kind, its checkpoint or name, K): DFlash once per block size, K = block - 1.
        columns: dict[str, tuple[str, str, int]] = {}
        column_options: dict[str, dict[str, Any]] = {}  # extra compile options of a column
        for name in drafters:
            if name != "dflash":  # "ngram", "mtp": no checkpoint of their own
                draft = {"draft_model": str(draft_dir), "eagle3": str(eagle3_dir)}.get(name, name)
                for k in args.k:
                    columns[name if len(args.k) == 1 else f"{name}_k{k}"] = (name, draft, k)
                continue
            for block in (int(b) for b in args.dflash_blocks.split(",") if b):
                directory = write_dflash_drafter(Path(workdir) / f"dflash_b{block}", target_dir, block, args.device, 5)
                columns[f"dflash_b{block}"] = (name, str(directory), block - 1)
        # EAGLE-3's maps are drawn from the ids its head drafts, so that its vocabulary shrinks to `size` of them.
        eagle3_ids = head_target_ids(eagle3_dir) if "eagle3" in drafters and hot_sizes else None
        for size in hot_sizes:  # beside each plain column: same drafter, same seed, a reduced lm_head
            path = Path(workdir) / f"token_map_{size}.safetensors"
            token_map = write_random_token_map(path, torch.arange(vocab_size), size, args.device, 6)
            if eagle3_ids is not None:
                eagle3_map = write_random_token_map(
                    Path(workdir) / f"eagle3_token_map_{size}.safetensors", eagle3_ids, size, args.device, 6
                )
            for column, (kind, draft, k) in list(columns.items()):
                if kind in TOKEN_MAP_KINDS and column_options.get(column) is None:
                    if kind == "eagle3" and size >= eagle3_ids.numel():
                        continue  # no smaller than the head's own vocabulary: nothing to compare
                    columns[hot_column(column, size)] = (kind, draft, k)
                    column_options[hot_column(column, size)] = {
                        "token_map": eagle3_map if kind == "eagle3" else token_map
                    }
        # each column's --k-by-bucket entries below its own K (a column drafting fewer already keeps its K there)
        schedules = {c: {b: n for b, n in args.k_by_bucket.items() if n < k} for c, (_, _, k) in columns.items()}
        if "mtp" in drafters:
            add_mtp_head(target_dir, args.device, seed=3)
        steps: dict[str, dict[int, float]] = {}
        profiles: dict[str, Any] = {}
        draft_bytes: dict[str, int] = {}
        target = None
        for column, (kind, draft, k) in columns.items():
            extra = {**options, "k": k, **column_options.get(column, {})}
            if schedules[column]:
                extra["k_by_bucket"] = schedules[column]
            sizes = draft_bytes if kind == "draft_model" else None  # the floor a draft model's step has
            steps[column], target = time_drafter_steps(
                target_dir, draft, buckets, args, column, profiles, sizes, **extra
            )
        census: dict[str, dict[str, int]] = {}  # how each target forward was lowered
        decode = {b: time_target_forward(target, b, 1, args, profiles, census) for b in buckets}
        k_at = {(c, b): schedules[c].get(b, k) for c, (_, _, k) in columns.items() for b in buckets}
        widths = sorted({k + 1 for k in k_at.values()})
        needed = sorted({(b, k + 1) for (_, b), k in k_at.items()})
        verify = {(b, w): time_target_forward(target, b, w, args, profiles, census) for b, w in needed}
        bandwidth = copy_bandwidth(args.device, 4.0 if common.is_cuda(args.device) else 0.0625)["bytes_per_s"]
        target_bytes = weight_bytes(target, read_only=True)
        embedding_bytes = weight_bytes(target) - target_bytes
    header = f"{'B':>4} {'target decode':>14}" + "".join(f" {'verify ' + str(w):>11}" for w in widths)
    header += "".join(f" {c + ' step':>16} {'/decode':>8} {'/verify':>8}" for c in columns)
    lines = [
        f"K={','.join(map(str, args.k))} (DFlash: block - 1), context {args.context}, {report['device']}, median "
        f"ms per captured step; /verify: over the verify forward of the column's K+1 tokens",
        header,
    ]
    if args.k_by_bucket:
        schedule = ", ".join(f"bucket {b}: K={k}" for b, k in sorted(args.k_by_bucket.items()))
        lines.insert(1, f"k_by_bucket: {schedule} in every column of a larger K (its step and /verify at that K)")
    for b in buckets:
        row = {
            "batch": b,
            "target_decode_ms": decode[b],
            "verify_ms": {w: verify[b, w] for w in widths if (b, w) in verify},
        }
        row["steps_ms"], row["k"] = {}, {}
        text = f"{b:>4} {decode[b]:>14.3f}" + "".join(
            f" {verify[b, w]:>11.3f}" if (b, w) in verify else f" {'-':>11}" for w in widths
        )
        for column in columns:
            step, k = steps[column][b], k_at[column, b]
            row["steps_ms"][column], row["k"][column] = step, k
            text += f" {step:>16.3f} {step / decode[b]:>8.2f} {step / verify[b, k + 1]:>8.2f}"
        lines.append(text)
        report["rows"].append(row)
    if args.acceptance:
        plain = {column: spec for column, spec in columns.items() if column not in column_options}
        lines += best_k_lines(plain, k_at, steps, decode, buckets, args.acceptance)
    # a draft model's floor is defined at one K: columns with --k-by-bucket schedules are left out
    fixed = {c: (draft_bytes[c], columns[c][2]) for c in draft_bytes if not schedules[c]}
    more, report["floors"] = floor_lines(bandwidth, target_bytes, embedding_bytes, fixed, decode, steps, buckets)
    lines += more
    # what would show a target forward that lost its kernels (as the decode column did from e6bddf6 to 35f6a4e)
    left = ", ".join(f"{forward} {counts.get('torch products', 0)}" for forward, counts in census.items())
    lines.append(f"target forwards' products left to torch (cuBLAS): {left}")
    report["lowering"] = census
    print("\n".join(lines))
    for column, profile in profiles.items():
        what = f"forward over {column[7:]} tokens per row" if column.startswith("target_") else f"{column} step"
        common.print_kernel_profile(f"kernels of one captured {what} at batch {args.profile}", profile)
    report["profiles"] = profiles
    if args.json:
        common.write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
