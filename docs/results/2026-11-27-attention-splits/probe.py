# ruff: noqa  (the script as run, kept with its results)
"""The decode/verify attention at the step's real shapes (8B heads, a 1024-token cache holding 512 committed
tokens, rotary and the KV write fused in as the runtime lowers it), d710d40's kernel against today's, and
today's under other launch configs. Each timing is one CUDA graph of ROTATE x LAYERS launches, each on a
different (slot set, layer), so no launch finds its keys in L2; the figure is per launch.

    python docs/results/2026-11-27-attention-splits/probe.py [--quick]
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarks import common
from graphspec.kernels import attention as new
from graphspec.kernels.common import config_for, sm_count

QH, KVH, D = 32, 8, 128
DT = torch.bfloat16


def old_attention():
    """kernels/attention.py as committed at d710d40 (the same file at 4cac85a, which the device's stale
    checkout may be at), beside today's common.py and rms_norm.py, as a package of its own."""
    import importlib, subprocess, tempfile

    repo = Path(__file__).resolve().parents[3]
    for rev in ("d710d40", "4cac85a"):
        found = subprocess.run(["git", "show", f"{rev}:kernels/attention.py"], cwd=repo, capture_output=True, text=True)
        if found.returncode == 0:
            break
    print("old attention from", rev)
    root = Path(tempfile.mkdtemp(prefix="old_attention_"))
    (root / "old_kernels").mkdir()
    (root / "old_kernels" / "__init__.py").write_text("")
    sources = {
        "attention": found.stdout,
        "common": (repo / "kernels" / "common.py").read_text(),
        "rms_norm": (repo / "kernels" / "rms_norm.py").read_text(),
    }
    for name, source in sources.items():
        source = source.replace("graphspec.kernels.", "old_kernels.").replace("from graphspec import library\n", "")
        if "@library.op(" in source:
            source = source[: source.index("@library.op(")]
        (root / "old_kernels" / f"{name}.py").write_text(source)
    sys.path.insert(0, str(root))
    return importlib.import_module("old_kernels.attention")


def inputs(batch, t, capacity, context, layers, rotate, norm):
    slots = batch * rotate
    cache = torch.randn(layers, 2, slots, KVH, capacity, D, dtype=DT, device="cuda")
    q = torch.randn(batch, t, QH, D, dtype=DT, device="cuda").transpose(1, 2)
    k = torch.randn(batch, t, KVH, D, dtype=DT, device="cuda").transpose(1, 2)
    v = torch.randn(batch, t, KVH, D, dtype=DT, device="cuda").transpose(1, 2)
    cos = torch.rand(batch, t, D, device="cuda").to(DT)
    sin = torch.rand(batch, t, D, device="cuda").to(DT)
    slot_sets = [torch.arange(r * batch, (r + 1) * batch, device="cuda") for r in range(rotate)]
    start = torch.full((batch,), context - t, dtype=torch.int64, device="cuda")
    qk = (torch.rand(D, device="cuda").to(DT) + 0.5, torch.rand(D, device="cuda").to(DT) + 0.5, 1e-6) if norm else None
    return cache, q, (k, v, cos, sin), slot_sets, start, qk


def run(module, case, config, causal):
    cache, q, rotary, slot_sets, start, qk = case
    layers = cache.shape[0]

    def fn():
        for slots in slot_sets:
            for layer in range(layers):
                module.attention(
                    q, cache, layer, slots, start, D**-0.5, rotary=rotary, qk_norm=qk, causal=causal, **config
                )

    ms = common.time_fn(fn, "cuda", reps=20, warmup=2)["ms"]
    out = module.attention(
        q, cache, 0, slot_sets[0], start, D**-0.5, rotary=rotary, qk_norm=qk, causal=causal, **config
    )
    return ms * 1e3 / (layers * len(slot_sets)), out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--variants", default=None, help="comma-separated subset of the config variants")
    args = parser.parse_args()
    old = old_attention()
    major, minor = torch.cuda.get_device_capability()
    base = dict(config_for(new.CONFIGS, major * 10 + minor))
    print(torch.cuda.get_device_name(), "sm", major * 10 + minor, "SMs", sm_count(torch.device("cuda")), "config", base)
    variants = {
        "warps8": {"num_warps": 8},
        "stages2": {"num_stages": 2},
        "pps1": {"programs_per_sm": 1},
        "pps4": {"programs_per_sm": 4},
        "bn32": {"block_n": 32},
        "bn128": {"block_n": 128},
    }
    if args.variants is not None:
        variants = {name: variants[name] for name in args.variants.split(",") if name}
    # (label, batch, T, capacity, context, causal, qk_norm)
    shapes = [(f"B{b} T{t}", b, t, 1024, 512, True, False) for b in (1, 4, 16, 64) for t in (1, 5, 8, 16)]
    shapes += [
        ("B1 T1 cap4096", 1, 1, 4096, 512, True, False),
        ("B1 T5 cap4096", 1, 5, 4096, 512, True, False),
        ("B16 T5 cap4096", 16, 5, 4096, 512, True, False),
        ("B1 T5 32k full", 1, 5, 32768, 32768, True, False),
        ("B16 T5 8k full", 16, 5, 8192, 8192, True, False),
        ("dflash B1 T8", 1, 8, 1024, 512, False, True),
        ("dflash B1 T16", 1, 16, 1024, 512, False, True),
    ]
    if args.quick:
        shapes = shapes[:2]
    header = f"{'shape':>16} {'splits':>6} {'old us':>8} {'new us':>8} {'new/old':>8} same-bits " + " ".join(
        f"{v:>8}" for v in variants
    )
    print(header)
    for label, batch, t, capacity, context, causal, norm in shapes:
        row_bytes = 2 * KVH * capacity * D * 2  # one row's K and V of one layer
        layers = max(2, min(32, (64 << 20) // (batch * row_bytes) or 2))
        rotate = max(1, min(4, (256 << 20) // (layers * batch * row_bytes)))
        case = inputs(batch, t, capacity, context, layers, rotate, norm)
        cache0 = case[0].clone()
        old_us, old_out = run(old, case, base, causal)
        case[0].copy_(cache0)
        new_us, new_out = run(new, case, base, causal)
        same = torch.equal(old_out.view(torch.int16), new_out.view(torch.int16))
        m_blocks = -(-QH // KVH * t // 128) or 1
        splits = new.num_splits(
            batch,
            KVH,
            max(1, -(-(QH // KVH * t) // 128)),
            capacity,
            base["block_n"],
            base["programs_per_sm"],
            sm_count(torch.device("cuda")),
        )
        cells = []
        for name, change in variants.items():
            try:
                us, _ = run(new, case, {**base, **change}, causal)
                cells.append(f"{us:8.2f}")
            except Exception as error:
                cells.append(f"{'fail':>8}")
                print("  ", name, type(error).__name__, str(error)[:200], file=sys.stderr)
        print(
            f"{label:>16} {splits:6d} {old_us:8.2f} {new_us:8.2f} {new_us / old_us:8.3f} {str(same):>9} "
            + " ".join(cells),
            flush=True,
        )
        del case, cache0
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
