# ruff: noqa  (a probe helper: the key loop of the sm_90 build, instruction counts; run on the CPU machine)
import subprocess, os, glob, re, sys, importlib.util, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

spec = importlib.util.spec_from_file_location("wb", "docs/results/2026-11-30-attention-warp-blocks/probe.py")
wb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wb)
tool = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))[0]
params = [p.name for p in JITFunction(wb.warp_blocks_kernel.fn).params]
for T, BM, D, W, N, st in (
    (1, 16, 128, 4, 16, 3),
    (5, 32, 128, 4, 16, 3),
    (1, 16, 64, 4, 16, 3),
    (1, 16, 128, 2, 32, 3),
    (1, 16, 128, 8, 16, 2),
):
    const = dict(
        T=T, GROUP=4, HEAD_DIM=D, BLOCK_M=BM, W=W, SUB_N=N, PRECISION="tf32", UPCAST=False, stride_qd=1, stride_cd=1
    )
    ptrs = {
        "q_ptr": "*bf16",
        "cache_ptr": "*bf16",
        "slot_ids_ptr": "*i64",
        "start_pos_ptr": "*i64",
        "part_out_ptr": "*fp32",
        "part_lse_ptr": "*fp32",
    }
    sig = {}
    for p in params:
        if p in const:
            sig[p] = "constexpr"
        elif p in ptrs:
            sig[p] = ptrs[p]
        elif p == "qk_scale":
            sig[p] = "fp32"
        else:
            sig[p] = "i32"
    div = {p for p in params if p in ptrs or (p.startswith("stride") and p not in const) or p == "seq_capacity"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if p in div}
    try:
        c = triton.compile(
            ASTSource(wb.warp_blocks_kernel, sig, const, attrs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": W, "num_stages": st},
        )
    except Exception as e:
        print("T", T, "D", D, "W", W, "FAILED", str(e)[:300])
        continue
    cubin = os.path.join(tempfile.mkdtemp(), "w.cubin")
    open(cubin, "wb").write(c.asm["cubin"])
    res = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    lines = [l for l in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,5}\*/", l)]
    addr = lambda l: int(re.search(r"/\*([0-9a-f]{4,5})\*/", l).group(1), 16)
    back = [
        (addr(l), int(re.search(r"BRA (0x[0-9a-f]+)", l).group(1), 16))
        for l in lines
        if re.search(r"BRA (0x[0-9a-f]+)", l) and int(re.search(r"BRA (0x[0-9a-f]+)", l).group(1), 16) < addr(l)
    ]
    print(
        "T",
        T,
        "D",
        D,
        "W",
        W,
        "N",
        N,
        [l.strip() for l in res.splitlines() if "REG" in l][0][:40],
        "shared",
        c.metadata.shared,
        "back",
        [(hex(a), hex(b)) for a, b in back],
    )
    for end, start in back[:1]:
        loop = [l for l in lines if start <= addr(l) <= end]
        ops = {}
        for l in loop:
            m = re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+(\.[A-Z0-9_]+)?)", l)
            if m:
                ops[m.group(2)] = ops.get(m.group(2), 0) + 1
        print(
            "   loop",
            len(loop),
            "BAR",
            sum(v for k, v in ops.items() if k.startswith("BAR")),
            "LDL",
            ops.get("LDL", 0),
            "STS",
            sum(v for k, v in ops.items() if k.startswith("STS")),
        )
