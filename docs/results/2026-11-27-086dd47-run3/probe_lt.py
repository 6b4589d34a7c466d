# ruff: noqa  (the script as run, kept with its results)
"""Does bf16 linear with a bias (cuBLASLt's epilogue path) run with CUBLAS_WORKSPACE_CONFIG=:0:0?"""

import os

import torch
import torch.nn.functional as F

print("CUBLAS_WORKSPACE_CONFIG", os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
for m in (1, 5, 80, 4096):
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    for name, fn in (
        ("linear+bias", lambda: F.linear(x, w, b)),
        ("addmm", lambda: torch.addmm(b, x, w.t())),
        ("linear", lambda: F.linear(x, w)),
    ):
        try:
            ref = x.float() @ w.float().t() + (b.float() if "bias" in name or name == "addmm" else 0)
            err = ((fn().float() - ref).norm() / ref.norm()).item()
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                out = fn()
            g.replay()
            torch.cuda.synchronize()
            print(f"M={m} {name}: ok, rel err {err:.1e}, captured ok")
        except Exception as e:
            print(f"M={m} {name}: {type(e).__name__}: {str(e)[:150]}")
