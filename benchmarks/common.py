"""Shared benchmark helpers: real-shape random-weight models built on the device, device timing, and
the two hardware ceilings (copy bandwidth, matrix rate) measured in the same process.

Usable from any script under benchmarks/ (`from benchmarks import common`, after `common.setup_path()`
or with the repository root on sys.path). Nothing here needs the hub or the network.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def setup_path() -> None:
    """Make `import graphspec` / `import benchmarks` work from a plain checkout (no pip install)."""
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)


setup_path()
from graphspec.cublas import use_no_workspace  # noqa: E402

# The benchmarks measure what graphspec's own processes run: cuBLAS without a workspace (graphspec/cublas.py).
# CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment measures torch's default instead; headers say which.
CUBLAS_WORKSPACE = use_no_workspace()


# --------------------------------------------------------------------------------------------------
# Provenance: which code a result came from.
# --------------------------------------------------------------------------------------------------


def _git(root: Path, args: list[str], env: dict[str, str] | None = None) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_info(root: Path = REPO_ROOT) -> dict[str, Any]:
    """The code and versions a result came from. "tree" is git's tree id of the working files as they ran
    (tracked and untracked, .gitignore applied), hashed through a scratch index so the checkout's own index is
    untouched: it names the code even where the checkout's .git is not the history it was copied from (the device
    tool copies the working tree; there `git log` can print an older commit). `git log --all --format='%H %T' | grep
    TREE` finds its commit. "commit" is HEAD as git sees it there, "matches_commit" whether the files are exactly
    that commit's."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(scratch, "index")}
        tree = _git(root, ["write-tree"], env) if _git(root, ["add", "-A"], env) is not None else None
    commit = _git(root, ["rev-parse", "HEAD"])
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    return {
        "tree": tree,
        "commit": commit,
        "matches_commit": tree is not None and tree == _git(root, ["rev-parse", "HEAD^{tree}"]),
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **versions,
    }


def write_json(path: str | Path, report: dict[str, Any] | list, indent: int = 2) -> None:
    """A benchmark's JSON, source_info() first (a list of rows becomes {"rows": [...]})."""
    body = report if isinstance(report, dict) else {"rows": report}
    Path(path).write_text(json.dumps({"source": source_info(), **body}, indent=indent, default=str) + "\n")


# --------------------------------------------------------------------------------------------------
# Model shapes. Real published shapes (no weights): configs are built locally, weights are random.
# --------------------------------------------------------------------------------------------------

LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}

SHAPES: dict[str, dict] = {
    # Llama-3.1-8B
    "llama-8b": dict(
        family="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope=dict(LLAMA3_ROPE, rope_theta=500000.0, factor=8.0, original_max_position_embeddings=8192),
    ),
    # Llama-3.2-1B
    "llama-1b": dict(
        family="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope=dict(LLAMA3_ROPE, rope_theta=500000.0, factor=32.0, original_max_position_embeddings=8192),
    ),
    # Qwen3-8B
    "qwen3-8b": dict(
        family="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope=dict(rope_type="default", rope_theta=1000000.0),
    ),
    # Qwen3-0.6B
    "qwen3-0.6b": dict(
        family="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope=dict(rope_type="default", rope_theta=1000000.0),
    ),
    # Tiny stand-ins with the same structure (GQA, llama3 rope scaling, tied draft, qk-norm), for CPU tests.
    "tiny-llama-target": dict(
        family="llama",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope=dict(LLAMA3_ROPE, rope_theta=500000.0, factor=8.0, original_max_position_embeddings=64),
    ),
    "tiny-llama-draft": dict(
        family="llama",
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope=dict(LLAMA3_ROPE, rope_theta=500000.0, factor=32.0, original_max_position_embeddings=64),
    ),
    "tiny-qwen3-target": dict(
        family="qwen3",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope=dict(rope_type="default", rope_theta=1000000.0),
    ),
    "tiny-qwen3-draft": dict(
        family="qwen3",
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope=dict(rope_type="default", rope_theta=1000000.0),
    ),
}

# (target shape, draft shape) per pair name, full size and --small.
PAIRS = {"llama": ("llama-8b", "llama-1b"), "qwen3": ("qwen3-8b", "qwen3-0.6b")}
SMALL_PAIRS = {"llama": ("tiny-llama-target", "tiny-llama-draft"), "qwen3": ("tiny-qwen3-target", "tiny-qwen3-draft")}


def make_config(shape: str | dict):
    """A transformers config for a SHAPES entry. EOS is unset so no system stops early on random weights."""
    import transformers

    fields = dict(SHAPES[shape] if isinstance(shape, str) else shape)
    family = fields.pop("family")
    rope = fields.pop("rope")
    config_class = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[family]
    common = dict(bos_token_id=1, eos_token_id=None, pad_token_id=0, initializer_range=0.02)
    try:  # transformers 5.x: rope settings live in rope_parameters
        config = config_class(**fields, **common, rope_parameters=dict(rope))
    except TypeError:  # older spelling
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        extra = {"rope_scaling": scaling} if scaling.get("rope_type", "default") != "default" else {}
        config = config_class(**fields, **common, rope_theta=rope["rope_theta"], **extra)
    with contextlib.suppress(Exception):
        config._attn_implementation = "sdpa"
    return config


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def init_random_(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Deterministic random weights, independent of the transformers version's own init: N(0, std) for
    matrices, 1 + N(0, std) for norm weights (never all-ones structure), zero-free."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    for _, parameter in sorted(model.named_parameters(), key=lambda item: item[0]):  # tied weights appear once
        if parameter.ndim >= 2:
            parameter.normal_(0.0, std, generator=generator)
        else:
            parameter.normal_(1.0, std, generator=generator)


def build_hf_model(shape: str | dict, device: str, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """A transformers *ForCausalLM of `shape`, allocated directly on `device` in `dtype`, random weights."""
    import transformers

    config = make_config(shape)
    model_class = {"llama": transformers.LlamaForCausalLM, "qwen3": transformers.Qwen3ForCausalLM}[config.model_type]
    with torch.device(device), default_dtype(dtype):
        model = model_class(config)
    # Cast parameters only: Module.to(dtype) would also round fp32 buffers (rotary inv_freq) to bf16,
    # which transformers' own from_pretrained(dtype=...) does not do.
    model = model.to(device=device)
    for parameter in model.parameters():
        if parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)
    if config.tie_word_embeddings:
        with contextlib.suppress(Exception):
            model.tie_weights()
    init_random_(model, seed)
    model.eval().requires_grad_(False)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def checkpoint_dir(nbytes: int, preferred: str | None = None) -> Path:
    """A fresh directory for a checkpoint of about `nbytes`: `preferred` if given, else /dev/shm when it
    has room (no disk I/O), else the system temp dir."""
    if preferred:
        path = Path(preferred)
        path.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=path))
    for base in ("/dev/shm", tempfile.gettempdir()):
        with contextlib.suppress(OSError):
            if shutil.disk_usage(base).free > 1.3 * nbytes + (2 << 30):
                return Path(tempfile.mkdtemp(prefix="gs_bench_", dir=base))
    return Path(tempfile.mkdtemp(prefix="gs_bench_"))


def save_checkpoint(model: torch.nn.Module, directory: Path) -> Path:
    """save_pretrained as safetensors, so graphspec loads it through its real loader."""
    model.save_pretrained(directory)  # transformers 5 writes safetensors by default
    if not any(Path(directory).glob("*.safetensors")):
        model.save_pretrained(directory, safe_serialization=True)  # older spelling
    return directory


def unique_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    seen: set[int] = set()
    out = []
    for name, parameter in model.named_parameters():
        if id(parameter) not in seen:
            seen.add(id(parameter))
            out.append((name, parameter))
    return out


@dataclass(frozen=True)
class ModelCost:
    """What one forward must move and compute, per token of batch."""

    weight_bytes: int  # bytes read per forward: every matrix once; an untied embedding only gathers rows
    matmul_params: int  # parameters in matrix products per token (embedding gather excluded)
    kv_bytes_per_token: int  # K+V bytes per cached token (all layers)
    attn_flops_per_ctx: int  # attention FLOPs per query token per context token (all layers)

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelCost:
        config = model.config
        params = unique_parameters(model)
        total = sum(p.numel() * p.element_size() for _, p in params)
        embed = model.get_input_embeddings().weight
        tied = any(p is embed for n, p in params if "lm_head" in n) or bool(
            getattr(config, "tie_word_embeddings", False)
        )
        embed_bytes = embed.numel() * embed.element_size()
        weight_bytes = total if tied else total - embed_bytes
        numel = sum(p.numel() for _, p in params if p.ndim >= 2)
        matmul_params = numel if tied else numel - embed.numel()
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        layers = config.num_hidden_layers
        kv = layers * 2 * kv_heads * head_dim * embed.element_size()
        attn = layers * 4 * heads * head_dim  # QK^T and PV, 2 FLOPs per MAC
        return cls(weight_bytes, matmul_params, kv, attn)


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def capture(step: Callable[[], None], device: str | torch.device) -> torch.cuda.CUDAGraph:
    """Warm `step` up once on a side stream (Triton compiles, cuBLAS handles), then capture it into a
    CUDA graph. Both run `step` once: reset what it advances before replaying."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def sync(device: str | torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


class Clock:
    """Marks on the device timeline (CUDA events) or the host clock (CPU); elapsed() in ms."""

    def __init__(self, device: str | torch.device) -> None:
        self.cuda = is_cuda(device)
        self.device = device
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        if len(self.marks) < 2:
            return []
        if self.cuda:
            sync(self.device)
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:], strict=False)]


def time_fn(
    fn: Callable[[], object], device: str | torch.device, reps: int = 20, warmup: int = 3, graph: bool = True
) -> dict:
    """Median time of fn() in ms. On CUDA, fn is captured into a CUDA graph when `graph` and it
    captures (so launch gaps do not count), else timed eagerly with events."""
    mode = "eager"
    run = fn
    cuda_graph = None
    if is_cuda(device):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        if graph:
            try:
                cuda_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(cuda_graph):
                    fn()
                run, mode = cuda_graph.replay, "cuda_graph"
            except Exception:
                cuda_graph = None
                torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) for s, e in times]
        del cuda_graph
    else:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
    return {"ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples), "mode": mode}


def measure_copy_bandwidth(device: str | torch.device, nbytes: int | None = None, reps: int = 10) -> dict:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written (GB/s, 1e9)."""
    nbytes = nbytes or ((1 << 30) if is_cuda(device) else (64 << 20))
    src = torch.randint(-128, 127, (nbytes,), dtype=torch.int8, device=device)  # never zeros
    dst = torch.empty_like(src)
    timing = time_fn(lambda: dst.copy_(src), device, reps=reps, warmup=2, graph=False)
    ok = bool(torch.equal(dst[:4096], src[:4096]))
    return {"gb_s": 2 * nbytes / (timing["ms"] * 1e-3) / 1e9, "bytes": nbytes, "ms": timing["ms"], "verified": ok}


def measure_matmul_rate(device: str | torch.device, dtype: torch.dtype, n: int | None = None, reps: int = 10) -> dict:
    """Dense matrix-product rate on random data (TFLOP/s)."""
    n = n or (8192 if is_cuda(device) else 256)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    timing = time_fn(lambda: torch.matmul(a, b, out=out), device, reps=reps, warmup=2, graph=False)
    return {"tflops": 2 * n**3 / (timing["ms"] * 1e-3) / 1e12, "n": n, "ms": timing["ms"]}


def device_name(device: str | torch.device) -> str:
    if is_cuda(device):
        return f"{torch.cuda.get_device_name(torch.device(device))} (CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE})"
    return f"cpu ({os.cpu_count()} cores)"


def greedy_params(rows: int, device: str) -> dict[str, torch.Tensor]:
    """Row parameters of `rows` greedy rows, as the engine builds them for Runtime.prefill."""
    return {
        "temperature": torch.zeros(rows, device=device),
        "top_k": torch.zeros(rows, dtype=torch.int64, device=device),
        "top_p": torch.ones(rows, device=device),
        "seed": torch.zeros(rows, dtype=torch.int64, device=device),
        "step_counter": torch.zeros(rows, dtype=torch.int64, device=device),
    }


def free_device_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# Kernel-name fragments per category, for kernel_profile (first match wins).
KERNEL_CATEGORIES = (
    ("gemm", ("nvjet", "gemm", "gemv", "splitKreduce", "cutlass", "xmma")),
    ("rotary_kv", ("rotary_kv_write",)),  # before kv_write and rotary: its name contains both
    ("kv_write", ("index_elementwise", "index_put", "kv_write")),
    ("attention", ("attention", "flash", "fmha")),
    ("norm", ("rms_norm",)),
    ("silu_mul", ("silu_mul",)),
    ("rotary", ("rotary",)),
    ("verify", ("verify",)),
    ("gated_delta", ("gated_delta", "conv1d")),
    ("torch", ("at::native",)),  # aten's own kernels: the ops left on references
)


def kernel_profile(run: Callable[[], object], replays: int, top: int = 12) -> dict[str, Any]:
    """Kernels of `replays` calls of `run` (an already warmed-up and, on GPU, usually captured program), from
    the PyTorch profiler (CUPTI sees the kernels inside graph replays): per-call count and time by category,
    the `top` kernels by time (printed), and every kernel (for the JSON: two columns' lists diffed show where
    one step's time goes beyond the other's)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            run()
        torch.cuda.synchronize()
    kernels = []
    for item in prof.key_averages():
        device_us = getattr(item, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(item, "self_cuda_time_total", 0.0)
        if device_us > 0 and item.cpu_time_total == 0:  # device-only rows are kernels and copies
            kernels.append((item.key, item.count / replays, device_us / replays))
    kernels.sort(key=lambda k: -k[2])
    total_us = sum(k[2] for k in kernels)
    categories: dict[str, list[float]] = {}
    for kernel_name, calls, us in kernels:
        category = next((c for c, keys in KERNEL_CATEGORIES if any(key in kernel_name for key in keys)), "other")
        entry = categories.setdefault(category, [0.0, 0.0])
        entry[0] += calls
        entry[1] += us
    return {
        "kernels_per_step": sum(k[1] for k in kernels),
        "kernel_us_per_step": total_us,
        "categories": {c: {"calls_per_step": calls, "us_per_step": us} for c, (calls, us) in categories.items()},
        "top": [
            {"name": n[:90], "calls_per_step": c, "us_per_step": us, "share": us / total_us}
            for n, c, us in kernels[:top]
        ],
        "kernels": [{"name": n[:160], "calls_per_step": c, "us_per_step": us} for n, c, us in kernels],
    }


def print_kernel_profile(title: str, profile: dict[str, Any]) -> None:
    """kernel_profile's result as a few lines: launches and kernel time, then per category, then the top kernels."""
    launches, ms = profile["kernels_per_step"], profile["kernel_us_per_step"] / 1e3
    print(f"\n{title}: {launches:.0f} launches, {ms:.2f} ms of kernel time")
    for category, entry in sorted(profile["categories"].items(), key=lambda item: -item[1]["us_per_step"]):
        print(f"  {category:>10} {entry['us_per_step'] / 1e3:8.3f} ms {entry['calls_per_step']:6.0f} launches")
    for kernel in profile["top"]:
        ms, calls = kernel["us_per_step"] / 1e3, kernel["calls_per_step"]
        print(f"  {ms:8.3f} ms {calls:5.0f}x {kernel['share']:6.1%} {kernel['name']}")
