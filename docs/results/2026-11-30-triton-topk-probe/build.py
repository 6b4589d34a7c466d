# ruff: noqa  (a probe helper: the sm_90 builds of probe.py's kernels, on the CPU machine)
"""python docs/results/2026-11-30-triton-topk-probe/build.py: registers, spills and instructions of each variant."""

import glob, importlib.util, os, re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("probe", "docs/results/2026-11-30-triton-topk-probe/probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
tool = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))[0]


def build(kernel, sig, const, warps):
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig) if name.endswith("_ptr")}
    compiled = triton.compile(
        ASTSource(kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
    )
    cubin = os.path.join(tempfile.mkdtemp(), "k.cubin")
    open(cubin, "wb").write(compiled.asm["cubin"])
    usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    lines = [l for l in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,5}\*/", l)]
    regs = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    return f"regs {regs.group(1)} stack {regs.group(2)} instructions {len(lines)} BAR {sum('BAR' in l for l in lines)}"


pointers = {"logits_ptr": "*bf16", "in_ptr": "*i64", "out_ptr": "*i64", "values_ptr": "*bf16", "index_ptr": "*i64"}
for chunk, warps in ((512, 4), (1024, 4), (2048, 4), (2048, 8), (4096, 8)):
    names = [
        "logits_ptr",
        "out_ptr",
        "values_ptr",
        "index_ptr",
        "vocab",
        "stride_row",
        "lists_out",
        "CHUNK",
        "CAP",
        "LAST",
    ]
    const = {"CHUNK": chunk, "CAP": 128, "LAST": False}
    sig = {n: "constexpr" if n in const else pointers.get(n, "i32") for n in names}
    print(
        f"chunk_top_kernel chunk {chunk} warps {warps}:", build(probe.chunk_top_kernel, sig, const, warps), flush=True
    )
for group, warps in ((8, 4), (16, 4), (16, 8)):
    names = ["in_ptr", "out_ptr", "values_ptr", "index_ptr", "lists_in", "lists_out", "GROUP", "CAP", "LAST"]
    const = {"GROUP": group, "CAP": 128, "LAST": True}
    sig = {n: "constexpr" if n in const else pointers.get(n, "i32") for n in names}
    print(
        f"merge_top_kernel group {group} warps {warps}:", build(probe.merge_top_kernel, sig, const, warps), flush=True
    )
