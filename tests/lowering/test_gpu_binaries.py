"""Every Triton kernel the step launches also builds for real GPUs: sm_90 and sm_80 binaries from this
CPU machine (`triton.compile` with a CUDA GPUTarget, ptxas from the Triton wheel). The interpreter runs
kernels as Python and misses what only the compiler rejects (layouts, shared memory, types); this does not.

The launches are recorded while the real traced step (both sampling modes, fused and unfused, with its
generated fused_pointwise kernels; and a hybrid Gated DeltaNet target's step) runs lowered for sm 90 under
the interpreter, so the argument types and constexprs are the ones the step uses; tests/lowering/gpu_binaries.py
then builds them in a process without the interpreter."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphspec import pipeline, trace, trace_prefill
from graphspec.config import PassContext
from graphspec.drafters.ngram import NGram
from graphspec.lowering import registry
from graphspec.models import load_model
from tests.checkpoints import make_hybrid_checkpoint
from tests.lowering import gpu_binaries
from tests.step_case import StepCase

SMS = (90, 80)
K_HYBRID = 2
# (mode, passes skipped, numerics): together they lower every kernel of the table, fused and unfused,
# with the default and the invariant config rows, but rotary_kv_write (the step fuses it into attention;
# the recording launches it directly: a whole interpreted step more would cost half a minute of CI).
VARIANTS = (
    ("greedy", (), "default"),
    ("sample", ("fuse_rotary_kv", "fuse_kv_attention", "fuse_qk_norm"), "default"),
    ("greedy", (), "invariant"),
)
TRITON_TYPES = {
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
}


def launch_record(function, args: tuple, kwargs: dict) -> dict:
    """What triton.compile needs to build this launch: argument types, constexpr values, options."""
    from triton.runtime.jit import JITFunction

    params = JITFunction(function.fn).params
    signature, constexprs = {}, {}
    for index, param in enumerate(params):
        value = args[index] if index < len(args) else kwargs.get(param.name, param.default)
        if param.is_constexpr or value is None:
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + TRITON_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{function.fn.__name__}: argument {param.name} of type {type(value).__name__}")
    options = {name: kwargs[name] for name in ("num_warps", "num_stages") if name in kwargs}
    return {
        "module": function.fn.__module__,
        "file": inspect.getfile(function.fn),  # where the module is not importable by name (generated kernels)
        "kernel": function.fn.__name__,
        "signature": signature,
        "constexprs": constexprs,
        "options": options,
    }


def run_hybrid_step(directory: Path) -> set[str]:
    """A hybrid (Gated DeltaNet) target's step and prefill chunk program with the n-gram drafter, lowered
    for sm 90 and run: the verify forward launches the conv and recurrent snapshot kernels, the prefill
    program the prefill-form recurrence. Returns the ops they lowered."""
    target = load_model(directory).model
    drafter = NGram()
    inputs = trace.new_row_inputs(2, "cpu")
    for state in trace.step_states(target, drafter, 3, 32, K_HYBRID, torch.float32):
        inputs[state.name] = state.allocate("cpu")
    gm, signature = trace.trace_step(target, drafter, K_HYBRID, "greedy", inputs)
    context = PassContext(k=K_HYBRID, batch=2, mode="greedy", sm=None, scratch_slot=2, options={"force_sm": 90})
    gm = pipeline.run_pipeline(gm, context, stop_after="lower_kernels").gm
    params = [*trace.model_inputs(target).values(), *drafter.params().values()]
    gm(*params, *(inputs[name] for name in signature.step_inputs))
    # Its prefill chunk program: the prefill-form recurrence (lengths, start positions).
    chunk = trace_prefill.example_prefill_inputs(target, drafter, K_HYBRID, 2, 8, 3, 32, torch.float32, "cpu")
    chunk.update({name: inputs[name] for name in signature.states})
    chunk["last_index"] = torch.tensor([7, 3])
    prefill, prefill_signature = trace_prefill.trace_prefill(target, drafter, K_HYBRID, chunk)
    prefill = pipeline.run_pipeline(prefill, context, passes=pipeline.PREFILL_PIPELINE, phase_checks={}).gm
    prefill(*params, *(chunk[name] for name in prefill_signature.input_names[len(params) :]))
    return {
        node.target._opname.removesuffix("_triton")
        for graph in (gm, prefill)
        for node in graph.graph.nodes
        if node.op == "call_function" and str(node.target).startswith("graphspec.")
    }


@pytest.fixture(scope="module")
def recorded(checkpoint_factory, tmp_path_factory) -> tuple[list[dict], set[str]]:
    """Distinct Triton launches of the lowered step, recorded under the interpreter, and the ops lowered."""
    from triton.runtime.interpreter import InterpretedFunction

    target = checkpoint_factory("llama", seed=0, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    draft = checkpoint_factory("qwen3", seed=1, head_dim=64, num_attention_heads=2, num_key_value_heads=1)
    case = StepCase(target, draft)
    records: dict[str, dict] = {}
    lowered: set[str] = set()
    original = InterpretedFunction.run

    def recording_run(self, *args, **kwargs):
        record = launch_record(self, args, kwargs)
        records[json.dumps(record, sort_keys=True)] = record
        return original(self, *args, **kwargs)

    InterpretedFunction.run = recording_run
    try:
        for mode, skip, numerics in VARIANTS:
            context = case.context(mode, options={"force_sm": 90}, numerics=numerics)
            gm = pipeline.run_pipeline(case.traced(mode), context, stop_after="fuse_pointwise", skip=skip).gm
            lowered |= {
                node.target._opname.removesuffix("_triton")
                for node in gm.graph.nodes
                if node.op == "call_function" and str(node.target).startswith("graphspec.")
            }
            case.run_graph(gm)
        # The prefill program's one kernel, launched with each of its config rows at the 8B head size.
        from graphspec.kernels import prefill_attention

        for config in (prefill_attention.CONFIGS[90], prefill_attention.CONFIGS["default"]):
            q, k, v = (torch.randn(1, 2, 16, 128, dtype=torch.bfloat16) for _ in range(3))
            cache = torch.zeros(2, 2, 2, 2, 64, 128, dtype=torch.bfloat16)
            start_pos, slot_ids = torch.tensor([16]), torch.tensor([0])
            prefill_attention.prefill_attention(q, k, v, cache, 1, slot_ids, start_pos, 128**-0.5, **config)
        lowered.add("prefill_attention")
        # DFlash's non-causal block attention (the attention kernel with CAUSAL=False), block 8, 8B heads.
        from graphspec.kernels import block_attention

        for config in (block_attention.CONFIGS[90], block_attention.CONFIGS["default"]):
            q = torch.randn(1, 4, 8, 128, dtype=torch.bfloat16)
            cache = torch.zeros(1, 2, 2, 1, 64, 128, dtype=torch.bfloat16)
            block_attention.block_attention(q, cache, 0, torch.tensor([0]), torch.tensor([20]), 128**-0.5, **config)
        lowered.add("block_attention")
        # The hybrid families' full attention at their real head size, 256 (Qwen3.5, Qwen3-Next).
        from graphspec.kernels import attention

        for config in (attention.CONFIGS[90], attention.CONFIGS["default"]):
            for batch in (1, 2):  # 2 rows x 1 KV head: one wave of tiles on the interpreter's 2 SMs (wave_block_n)
                q = torch.randn(batch, 4, 4, 256, dtype=torch.bfloat16)
                cache = torch.zeros(1, 2, 2, 1, 64, 256, dtype=torch.bfloat16)
                slot_ids, start_pos = torch.tensor([0, 1][:batch]), torch.tensor([20, 40][:batch])
                attention.attention(q, cache, 0, slot_ids, start_pos, 256**-0.5, **config)
        # A batch-1 row at a long cache, 64 splits: the reduce takes them in one 64-split chunk
        # (attention.reduce_launch: 2 warps at head dim 128, 4 at 256). Few keys, so most splits exit at once.
        for head_dim in (128, 256):
            q = torch.randn(1, 4, 1, head_dim, dtype=torch.bfloat16)
            cache = torch.zeros(1, 2, 1, 1, 4096, head_dim, dtype=torch.bfloat16)
            config = {**attention.CONFIGS[90], "programs_per_sm": 64}
            attention.attention(q, cache, 0, torch.tensor([0]), torch.tensor([100]), head_dim**-0.5, **config)
        # The fused rotary + KV write (what fuse_rotary_kv makes where attention stays apart), fp32 as the
        # step's and bf16, with each of its config rows; q/k/v as transposed slices of one projection.
        from graphspec.kernels import rotary_kv_write

        for dtype in (torch.float32, torch.bfloat16):
            for config in (rotary_kv_write.CONFIGS[90], rotary_kv_write.CONFIGS["default"]):
                qkv = torch.randn(2, 3, 4 * 64, dtype=dtype)
                q, k, v = (part.view(2, 3, -1, 64).transpose(1, 2) for part in qkv.split([128, 64, 64], dim=-1))
                cos, sin = torch.randn(2, 3, 64), torch.randn(2, 3, 64)
                cache = torch.zeros(2, 2, 3, 1, 16, 64, dtype=dtype)
                start_pos, slot_ids = torch.tensor([4, 0]), torch.tensor([2, 0])
                rotary_kv_write.rotary_kv_write(q, k, v, cos, sin, cache, 1, slot_ids, start_pos, **config)
                # With per-head norms folded in (fuse_qk_norm; a DFlash drafter's context rows: q is k).
                norm = torch.rand(64, dtype=dtype) + 0.5
                rotary_kv_write.rotary_kv_write(k, k, v, cos, sin, cache, 1, slot_ids, start_pos, norm, norm, 1e-6)
        lowered.add("rotary_kv_write")
        # The MTP / EAGLE-3 input (embedding, two norms, cat in one kernel), bf16 at a 4096 hidden size.
        from graphspec.kernels import embed_norm_concat

        for config in (embed_norm_concat.CONFIGS[90], embed_norm_concat.CONFIGS[80]):
            hidden, weights = torch.randn(3, 4096, dtype=torch.bfloat16), torch.randn(3, 4096, dtype=torch.bfloat16)
            tokens = torch.tensor([0, 2, 1])
            embed_norm_concat.embed_norm_concat(tokens, weights, weights[0], hidden, weights[1], 1e-5, **config)
        lowered.add("embed_norm_concat")
        # The folded-norm SwiGLU (models/fold_norms.py), bf16 at the 8B sizes, decode and prefill config rows.
        from graphspec.kernels import scaled_silu_mul

        for config in (scaled_silu_mul.CONFIGS[90], scaled_silu_mul.CONFIGS[(90, "many_rows")]):
            gate_up, x = torch.randn(2, 2 * 14336, dtype=torch.bfloat16), torch.randn(2, 4096, dtype=torch.bfloat16)
            scaled_silu_mul.scaled_silu_mul(gate_up, x, 1e-5, **config)
        lowered.add("scaled_silu_mul")
        # A folded input norm's row scale in the step's attention (fuse_row_scale), bf16, 8B heads and hidden size,
        # a decode and a verify of 5 (one source row per program, and several).
        from graphspec.kernels import rotary_kv_attention

        for t in (1, 5):
            qkv = torch.randn(1, t, 6 * 128, dtype=torch.bfloat16)
            q, k, v = (part.view(1, t, -1, 128).transpose(1, 2) for part in qkv.split([512, 128, 128], dim=-1))
            cos, sin, src = (
                torch.randn(1, t, 128),
                torch.randn(1, t, 128),
                torch.randn(1, t, 4096, dtype=torch.bfloat16),
            )
            cache = torch.zeros(1, 2, 2, 1, 64, 128, dtype=torch.bfloat16)
            rotary_kv_attention.rotary_kv_attention(
                q, k, v, cos, sin, cache, 0, torch.tensor([1]), torch.tensor([20]), 128**-0.5, None, None, 1e-6, True,
                src, 1e-5, **rotary_kv_attention.CONFIGS[90],
            )  # fmt: skip
        # A reduced vocabulary's greedy draft (argmax looking its pick up in the ids), and rope tables with a scale.
        from graphspec.kernels import argmax, rope_tables

        argmax.argmax(torch.randn(3, 300, dtype=torch.bfloat16), torch.arange(300) + 7, **argmax.CONFIGS[90])
        rope_tables.rope_tables(torch.arange(6).view(2, 3), torch.rand(64), 0.5, **rope_tables.CONFIGS["default"])
        # The invariant matmul with a bias (no test checkpoint has one), bf16 at a 1B projection's K.
        from graphspec.kernels import addmm

        for config in (addmm.CONFIGS[90], addmm.CONFIGS[80]):
            x, weight, bias = torch.randn(5, 2048), torch.randn(64, 2048), torch.randn(64)
            addmm.addmm_triton(*(t.to(torch.bfloat16) for t in (bias, x, weight.t())), 1, 1, *config.values())
        lowered.add("addmm")
        # The one-row GEMV (no test step folds at batch 1): unmasked at an 8B q/k/v projection's K, in place into a
        # residual as the folded norms' o and down projections run it, and with masked tails of N and K.
        from graphspec.kernels import addmm_in_place, gemv

        for sm in (90, 80):
            config = addmm_in_place.CONFIGS[sm]
            shapes = ((1, 4096), (64, 4096), (1, 64))
            x, weight, residual = (torch.randn(*shape, dtype=torch.bfloat16) for shape in shapes)
            addmm_in_place.addmm_in_place_triton(residual, x, weight.t(), 1, 1, *config.values())
            knobs = {name: config[name] for name in ("block_n", "block_k", "num_warps", "num_stages")}
            gemv.gemv(x[:, :1000], weight[:60, :1000].contiguous().t(), **knobs)
            # Two rows (few_rows_kernel: a draft model's catch-up forward at batch 1), in place into its residual.
            two, residual2 = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(2, 64, dtype=torch.bfloat16)
            two_rows = addmm_in_place.CONFIGS[(sm, "two_rows")].values()
            addmm_in_place.addmm_in_place_triton(residual2, two, weight.t(), 1, 1, *two_rows)
            # The long-K one-row tiles (K >= 4N: a 1B draft's down projection), in place.
            long_k = addmm_in_place.CONFIGS[(sm, "one_row_long_k")].values()
            addmm_in_place.addmm_in_place_triton(residual, x, weight.t(), 1, 1, *long_k)
            # Two rows of a wide weight (few_rows_dot_kernel, the tensor cores: a batch-2 decode) in place, both
            # tiles, and five rows with masked tails of N and K (the kernel takes up to MAX_ROWS).
            five = torch.randn(5, 4096, dtype=torch.bfloat16)
            for name in ("few_rows", "few_rows_wide"):
                few_rows = addmm_in_place.CONFIGS[(sm, name)]
                addmm_in_place.addmm_in_place_triton(residual2, two, weight.t(), 1, 1, *few_rows.values())
                knobs = {name: few_rows[name] for name in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
                gemv.gemv(five[:, :1000], weight[:60, :1000].contiguous().t(), **knobs)
        lowered.add("addmm_in_place")
        # The one-row MLP's fused gate/up GEMV and scaled SwiGLU: unmasked at the 8B's hidden size, masked tails.
        from graphspec.kernels import scaled_silu_mul_linear

        for config in (scaled_silu_mul_linear.CONFIGS[90], scaled_silu_mul_linear.CONFIGS[80]):
            x, weight = torch.randn(1, 4096, dtype=torch.bfloat16), torch.randn(64, 4096, dtype=torch.bfloat16)
            scaled_silu_mul_linear.scaled_silu_mul_linear(x, weight.t(), 1e-5, **config)
            scaled_silu_mul_linear.scaled_silu_mul_linear(
                x[:, :1000], weight[:42, :1000].contiguous().t(), 1e-5, **config
            )
        lowered.add("scaled_silu_mul_linear")
        lowered |= run_hybrid_step(make_hybrid_checkpoint(tmp_path_factory.mktemp("hybrid_binaries"), seed=0))
    finally:
        InterpretedFunction.run = original
    return list(records.values()), lowered


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the GPU tests build the real kernels")
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="records launches under the Triton interpreter"
)
def test_every_step_kernel_builds_for_sm90_and_sm80(recorded, tmp_path: Path) -> None:
    launches, lowered = recorded
    missing = sorted(set(registry.KERNELS) - lowered)
    assert not missing, f"kernels the step never launched (add them to this test's step): {missing}"
    assert "fused_pointwise" in lowered and any(launch["kernel"] == "kernel" for launch in launches)  # generated
    recorded = tmp_path / "launches.json"
    recorded.write_text(json.dumps(launches))
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    script = Path(__file__).with_name("gpu_binaries.py")
    result = subprocess.run(
        [sys.executable, str(script), str(recorded), *map(str, SMS)], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    jobs = gpu_binaries.build_jobs(launches, list(SMS))
    assert len(jobs) > len(launches) * len(SMS)  # the PDL builds (gemv, attention, its reduce, the SwiGLU GEMV)
    assert result.stdout.count("ok ") == len(jobs)
    assert result.stdout.count("'USE_PDL': True") == len(jobs) - len(launches) * len(SMS)
