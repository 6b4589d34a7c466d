"""graphspec's target-only decoder compiled the way the speculation step is: one decode forward traced
with make_fx, cache writes made in place (defunctionalize_kv), rotary fused with the cache write and the
attention (fuse_rotary_kv, fuse_kv_attention), hot ops lowered to the same Triton kernels (lower_kernels),
and on CUDA captured as one CUDA graph that also feeds its token back, so generating N tokens is N
replays with no host sync. It is the fair "no speculation" baseline for benchmarks/bench_systems.py:
same weights, same kernels, same capture, no draft.

Greedy only. generate() prefills eagerly through the reference ops; decode() continues from any prefill
(bench_invariant.py passes the runtime's own, so speculative and target-only output start from the same
cache). Only decode is timed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from benchmarks import common
from graphspec import ops, pipeline
from graphspec.compiled import device_sm
from graphspec.config import PassContext
from graphspec.input_names import weight_input_names
from graphspec.lowering import registry
from graphspec.models.decoder import DecoderLM
from graphspec.trace import model_inputs, name_graph

# The step pipeline minus what only a speculation step has (verify/accept, padded rows, piecewise
# capture): the decode forward gets every cache, fusion and lowering pass the step gets.
STEP_ONLY = ("insert_verify", "mask_padding", "split_attention")
DECODE_PASSES = tuple(p for p in pipeline.PIPELINE if p.NAME not in STEP_ONLY)


# Products the lowering leaves to torch (cuBLAS on a GPU), the registry's aten ops of the matmul kernels:
# lowering_census counts them apart.
TORCH_PRODUCTS = frozenset(registry.ATEN_OPS[op] for op in ("mm", "addmm", "addmm_in_place"))


def lowering_census(gm: torch.fx.GraphModule) -> dict[str, int]:
    """How a lowered forward's ops run: kernel op name (with its config row's shape class, e.g.
    "graphspec::mm_triton:one_row") -> nodes, and "torch products" -> the matmuls left to torch. A benchmark prints
    it so a forward that silently lost its kernels shows in the run's own output."""
    census: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if "gs_kernel" in node.meta:
            kernel = node.meta["gs_kernel"]
            shape_class = str(kernel["sm"]).partition(":")[2]
            name = kernel["kernel"] + (f":{shape_class}" if shape_class else "")
        elif node.target in TORCH_PRODUCTS:
            name = "torch products"
        else:
            continue
        census[name] = census.get(name, 0) + 1
    return dict(sorted(census.items()))


@dataclass
class DecodeResult:
    tokens: list[list[int]]  # generated tokens per row (the first comes from prefill)
    wall_s: float  # prefill + decode
    decode_ms_per_token: float  # per decode forward (one token per row), measured over the decode loop
    captured: bool


def trace_decode(
    model: DecoderLM,
    batch: int,
    max_seq_len: int,
    sm: int | None,
    positions: int = 1,
    numerics: str = "default",
    cache: torch.Tensor | None = None,
    skip: tuple[str, ...] = (),
) -> torch.fx.GraphModule:
    """(params..., tokens [B, T], start [B], slots [B], cache) -> greedy token [B] (T = positions = 1: a
    decode step) or [B, T] (the target's verify forward of a step), lowered (with `numerics`, as the
    step) and in place. `cache`: the cache it will run on (default: a new one of `batch` slots). `skip`: pass
    names left out (an A/B of a pass, as compile's skip)."""
    params = model_inputs(model)
    names = list(params)
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype

    def program(*flat: torch.Tensor) -> torch.Tensor:
        bound = dict(zip(names, flat[: len(names)], strict=True))
        tokens, start, slots, cache = flat[len(names) :]
        output = "last_logits" if positions == 1 else "logits"
        logits, cache = torch.func.functional_call(model, bound, (tokens, start, slots, cache, output))
        return ops.argmax(logits), cache  # the step's greedy pick, lowered to the same kernel

    example = [
        torch.zeros((batch, positions), dtype=torch.int64, device=device),
        torch.zeros(batch, dtype=torch.int64, device=device),
        torch.arange(batch, device=device),
        model.new_cache(batch, max_seq_len, dtype, device, zeroed=False) if cache is None else cache,
    ]
    gm = make_fx(program, tracing_mode="fake")(*params.values(), *example)
    # Named as the step names its inputs: the registry lowers a product to the GEMVs (which read their weight
    # before earlier kernels finish) only where its weight operand is a target.* / draft.* input.
    name_graph(gm, (*weight_input_names(names), "tokens", "start", "slots", "cache"))
    ctx = PassContext(k=0, batch=batch, mode="greedy", sm=sm, device=str(device), dtype=str(dtype), numerics=numerics)
    for step in DECODE_PASSES:
        if step.NAME not in skip:
            gm = step.run(gm, ctx).gm
    return gm


@torch.inference_mode()
def generate(model: DecoderLM, prompts: list[list[int]], new_tokens: int, max_seq_len: int) -> DecodeResult:
    """Greedy decode of equal-length prompts: eager prefill, then new_tokens - 1 traced decode forwards
    (replays of one CUDA graph on a GPU)."""
    if len({len(p) for p in prompts}) != 1 or new_tokens < 2:
        raise ValueError("target_only.generate needs equal-length prompts and new_tokens >= 2")
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    batch, length = len(prompts), len(prompts[0])
    cache = model.new_cache(batch, max_seq_len, dtype, device)
    slots = torch.arange(batch, device=device)
    began = time.perf_counter()
    prompt = torch.tensor(prompts, dtype=torch.int64, device=device)
    logits, _ = model(prompt, torch.zeros(batch, dtype=torch.int64, device=device), slots, cache, "last_logits", True)
    start = torch.full((batch,), length, dtype=torch.int64, device=device)
    gm = trace_decode(model, batch, max_seq_len, device_sm(str(device)), cache=cache)
    result = decode(model, gm, cache, slots, logits.argmax(dim=-1), start, new_tokens)
    result.wall_s = time.perf_counter() - began
    return result


@torch.inference_mode()
def decode(
    model: DecoderLM,
    gm: torch.fx.GraphModule,
    cache: torch.Tensor,
    slots: torch.Tensor,
    first: torch.Tensor,
    start: torch.Tensor,
    new_tokens: int,
) -> DecodeResult:
    """Greedy decode from a filled cache: row b's prompt is in slot slots[b] at positions < start[b], and
    first[b] is its first token (at position start[b]); new_tokens - 1 forwards of `gm` (trace_decode for
    this cache and len(slots) rows), replays of one CUDA graph on a GPU. Tokens include `first`."""
    device = cache.device
    cuda = device.type == "cuda"
    weights = list(model_inputs(model).values())
    batch = slots.shape[0]
    history = torch.zeros((batch, new_tokens), dtype=torch.int64, device=device)
    history[:, 0] = first
    tokens = history[:, :1].clone()  # static input buffers, fed back in place
    start = start.clone()
    column = torch.ones((batch, 1), dtype=torch.int64, device=device)  # where the next token lands

    def step() -> None:
        next_token, _ = gm(*weights, tokens, start, slots, cache)
        tokens.copy_(next_token[:, None])
        history.scatter_(1, column, tokens)
        start.add_(1)
        column.add_(1)

    began = time.perf_counter()
    graph = None
    if cuda:  # warm up on a side stream (Triton compiles, cuBLAS handles), then capture one step
        saved = (tokens.clone(), start.clone(), column.clone(), history.clone())
        graph = common.capture(step, device)
        for buffer, value in zip((tokens, start, column, history), saved, strict=True):
            buffer.copy_(value)  # the warm-up and capture each ran one step; start over
    common.sync(device)
    decode_began = time.perf_counter()
    for _ in range(new_tokens - 1):
        if graph is not None:
            graph.replay()
        else:
            step()
    common.sync(device)
    end = time.perf_counter()
    return DecodeResult(
        tokens=history.tolist(),
        wall_s=end - began,
        decode_ms_per_token=(end - decode_began) / (new_tokens - 1) * 1e3,
        captured=graph is not None,
    )
