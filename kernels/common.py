"""Launch helpers shared by the kernel files (no op lives here): config lookup, SM count, block sizes.

Every kernel file keeps its configs as data, `CONFIGS = {80: {...}, 90: {...}, "default": {...}}`, each
value a dict of ints in one fixed key order; the lowered graph passes those ints as trailing op
arguments in that order, so a dumped graph shows (and a re-loaded one keeps) the exact config.

A hazard to keep out of every kernel here: inside a software-pipelined loop (tl.range with num_stages), two tl.dot
calls that read the same loaded tile gave results that differed from launch to launch on an H200 (Triton 3.6, sm_90;
docs/results/2026-11-29-few-row-swiglu: a weight tile's dot and x @ x^T sharing x's buffer), where loading the tile
twice was stable. No kernel here does that (attention's q is loaded before its loop); compare a new tensor-core
kernel's outputs bit for bit across launches on the GPU, not only against an error bound.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

import torch
import triton
import triton.language as tl

# Programs a launch aims for, per SM, when it splits work (split-K attention, vocab splits): enough
# independent loads in flight to saturate HBM on Ampere/Hopper without making the reduce step large.
PROGRAMS_PER_SM = 4

# Used when the tensors live on the CPU (TRITON_INTERPRET=1): small, so interpreter tests still
# exercise the split paths without running many programs.
INTERPRETER_SMS = 2


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(*tensors: torch.Tensor) -> None:
    """Triton compiles for CUDA only; CPU tensors need the interpreter, chosen before import."""
    if any(t.device.type != "cuda" for t in tensors) and not interpreting():
        raise RuntimeError(
            "graphspec Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 set before the kernel "
            "modules are imported (tests do this in tests/kernels/conftest.py)"
        )


def _cuda_index(device: torch.device) -> int:
    """The CUDA device's index ("cuda" alone: the current device), for the cached property queries below."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of the device (a host-side property query, no sync; cached)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _cuda_sm_count(_cuda_index(device))


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


# "0" launches every kernel in plain stream order; unset or "1" (the default): the kernels that take USE_PDL launch
# with programmatic dependent launch on sm_90+. On since the H200 A/B of 2026-11-29 21:40 UTC (docs/BENCHMARKS.md:
# batch-1 decode 3.976 -> 3.944 ms, draft-model step 7.914 -> 7.880, same tokens).
PDL_ENV = "GRAPHSPEC_PDL"


def pdl_launch(device: torch.device) -> dict[str, bool]:
    """Launch arguments for programmatic dependent launch (PDL; CUDA sm_90+, unless GRAPHSPEC_PDL=0): the GPU may
    start the kernel before the kernel ahead of it in the stream has finished. A batch-1 decode's one-row products,
    attention and reduce are all Triton kernels (since the one-row GEMVs), so each layer has six such boundaries.
    A kernel launched this way takes USE_PDL and calls wait_for_earlier_kernels() before it touches anything an
    earlier kernel may write, so what it computes is what it computes in plain stream order. The GEMVs ask for
    their first weight tile before that wait (lowering/registry.py gives them model weights only, which no kernel
    writes), and the GEMVs, the attention and its reduce call let_later_kernels_launch() after their main loops:
    the next kernel's programs start, and ask for their weights, while this one's last programs finish.
    H200, batch-1 decode (docs/BENCHMARKS.md, 2026-11-29 21:40): PDL with the wait first 3.976 -> 3.944 ms, the
    early weight tiles and launches 3.944 -> 3.894. (The few-row GEMV waits first: its early tile cost registers
    and occupancy, and the draft-model step 13 us.)"""
    setting = os.environ.get(PDL_ENV, "")
    if setting not in ("", "0", "1"):
        raise ValueError(f"{PDL_ENV}={setting!r}: use 0 (plain stream order) or 1 (the default: PDL on sm_90+)")
    if device.type != "cuda" or setting == "0":
        return {"USE_PDL": False}
    if _cuda_capability(_cuda_index(device))[0] < 9:
        return {"USE_PDL": False}
    return {"USE_PDL": True, "launch_pdl": True}


@triton.jit
def wait_for_earlier_kernels(USE_PDL: tl.constexpr):
    """USE_PDL: wait until the kernels before this one in the stream have finished and their writes are visible
    (griddepcontrol.wait); a no-op for a kernel launched in plain stream order."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def let_later_kernels_launch(USE_PDL: tl.constexpr):
    """USE_PDL: let the next kernel in the stream launch once every program of this one has come here
    (griddepcontrol.launch_dependents), so its programs can ask for what no kernel writes (weights) while this
    one's last programs finish; it still waits for this kernel to end before it touches anything else. A no-op
    for a kernel launched in plain stream order."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@functools.cache
def _cuda_shared_memory(index: int) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def shared_memory_per_block(device: torch.device) -> int | None:
    """Bytes of shared memory one program may opt in to (Triton's "hardware limit"); None off CUDA (the
    interpreter has no limit). A cached host-side property query."""
    if device.type != "cuda":
        return None
    return _cuda_shared_memory(_cuda_index(device))


SHARED_MARGIN = 16 << 10  # bytes of shared memory fit_shared_memory leaves for what it does not count


def fit_shared_memory(q: torch.Tensor, block_m: int, block_n: int, num_stages: int) -> tuple[int, int]:
    """(block_n, num_stages) cut down until the tiles fit the device's shared memory: every pipeline
    stage past the first holds a K and a V tile, beside the q tile. The config tables are tuned for
    bf16 heads of up to 128; heads of 256 need fewer stages or narrower tiles. Neither changes a result
    (the key blocks are visited in the same order)."""
    limit = shared_memory_per_block(q.device)
    if limit is None:
        return block_n, num_stages
    row = q.shape[-1] * q.element_size()

    def needs(stages: int, block: int) -> int:  # Triton's own count runs a few KB above it: margin below
        return (max(stages - 1, 1) * 2 * block + block_m) * row + SHARED_MARGIN

    while num_stages > 1 and needs(num_stages, block_n) > limit:
        num_stages -= 1
    while block_n > 16 and needs(num_stages, block_n) > limit:
        block_n //= 2
    return block_n, num_stages


def config_for(configs: Mapping[int | str, dict[str, int]], sm: int | None) -> dict[str, int]:
    """The config of an SM from a CONFIGS table: exact SM, else "default"."""
    return dict(configs.get(sm, configs["default"]))


def check_config_table(configs: Mapping[int | str | tuple[int | str, str], dict[str, int]]) -> tuple[str, ...]:
    """All configs of a table share one key order (it is the op's trailing argument order). Keys are an SM,
    "default", "invariant" or "cpu", or (one of those, a shape class the kernel's shape_class names)."""
    fields = tuple(configs["default"])
    for key, config in configs.items():
        if tuple(config) != fields or not all(isinstance(v, int) for v in config.values()):
            raise ValueError(f"CONFIGS[{key!r}] must have int fields {fields} in that order, got {config}")
        if isinstance(key, tuple) and (len(key) != 2 or key[0] not in configs or not isinstance(key[1], str)):
            raise ValueError(f"CONFIGS[{key!r}]: a shape-class row is (a key of the table, a class name)")
    return fields


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Whether this module's @triton.jit functions run under the interpreter: decided, like them, when it is
# imported (kernel modules are imported lazily, after tests choose TRITON_INTERPRET).
INTERPRETED = tl.constexpr(interpreting())


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """fp32 x rounded to DTYPE (round to nearest even), returned as fp32 holding an exact DTYPE value.

    Kernels round through this instead of `.to(tl.bfloat16)`, for two reasons. The Triton interpreter
    (TRITON_INTERPRET=1, triton<=3.9) truncates fp32->bf16 casts, so CPU tests would not see the GPU's
    rounding: there bf16 is rounded on the bits. And in a compiled kernel LLVM sees through a plain
    conversion and fuses across it: `round_to(a * b) - c` became one 16-bit FMA, the product never
    rounded, so kernels that repeat the reference's roundings step by step (rotary) came out different.
    Compiled kernels therefore convert with inline PTX (cvt.rn, two elements per instruction: one
    instruction where the bit arithmetic took about six integer ones; silu_mul at prefill sizes ran 20%
    faster), which the optimizer cannot look into; it rounds every fp32 bit pattern as torch does
    (docs/results/2026-11-27-round-to-ab). NaN stays NaN (payloads are not preserved). For fp32 the
    value is returned as it is, through an inline PTX add of -0.0 in compiled kernels: without it the
    compiler fused `round_to(a * b) + c` into an fp32 FMA just the same, and fp32 rotary on a GPU
    differed from torch's (and from its own unfused launches) by up to 15 ulps. (A plain move did not
    stop ptxas, which contracts a mul and an add without rounding modifiers across it.)
    """
    if DTYPE == tl.bfloat16:
        if INTERPRETED:
            bits = x.to(tl.uint32, bitcast=True)
            # Add half an ulp of bf16 (0x7FFF) plus the lowest kept bit (ties to even), then drop 16 bits.
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            # NaN becomes the quiet NaN: the GPU's canonical NaN 0x7FFFFFFF would carry into the sign bit
            # above and come out as -0.0 (a NaN input of silu or rms_norm silently turning into zero).
            return tl.where(x == x, bits.to(tl.float32, bitcast=True), float("nan"))
        else:  # cvt.rn.bf16x2.f32 packs its first source into the high half
            rounded = tl.inline_asm_elementwise(
                "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [x], dtype=tl.bfloat16, is_pure=True, pack=2
            )
            return rounded.to(tl.float32)
    elif DTYPE == tl.float16:
        if INTERPRETED:  # numpy's conversion rounds to nearest even
            return x.to(tl.float16).to(tl.float32)
        else:
            rounded = tl.inline_asm_elementwise(
                "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [x], dtype=tl.float16, is_pure=True, pack=2
            )
            return rounded.to(tl.float32)
    elif INTERPRETED:
        return x
    else:  # x + -0.0 is x (signed zeros and NaN included); an add with an explicit rounding mode is one
        # that neither LLVM nor ptxas contracts into an FMA (PTX ISA, add), so the product stays rounded
        return tl.inline_asm_elementwise(
            "add.rn.f32 $0, $1, 0f80000000;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
