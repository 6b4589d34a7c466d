"""cuBLAS's workspace in processes graphspec starts CUDA in (the CLI, the server, the benchmarks, and a Python
program whose first CUDA work is graphspec.compile, Runtime.from_pretrained or Runtime.load).

With a workspace (torch's default) cuBLAS picks split-K kernels for many decode-sized GEMMs (a few rows
against a wide weight: o_proj, down_proj), each followed by a separate reduce kernel. Without one it picks
kernels that need no reduce: on an H200 the captured 8B target's decode step and the speculation steps
run 2-3% faster, prefill is unchanged, and cuBLASLt's bias epilogue still runs and captures
(docs/BENCHMARKS.md, 2026-11-27). torch reads CUBLAS_WORKSPACE_CONFIG once, when the process creates its
first cuBLAS handle, so the setting must come before any CUDA work: the CLI sets it first thing, and compile()
and Runtime.load() before they touch the device. A process that started CUDA before keeps what it has (set the
variable yourself then); one that set the variable keeps its value.
"""

from __future__ import annotations

import os
import sys

WORKSPACE_VARIABLE = "CUBLAS_WORKSPACE_CONFIG"
NO_WORKSPACE = ":0:0"


def use_no_workspace() -> str | None:
    """Turn cuBLAS's workspace off for this process unless CUBLAS_WORKSPACE_CONFIG is set already (the
    user's value wins; `:4096:8` is torch's default) or CUDA has started (too late to matter). Returns the
    value in effect, None when the variable is unset."""
    # A process that has not imported torch has not started CUDA either; the CLI calls this before its
    # commands import torch, and importing it here would cost `graphspec --help` seconds.
    torch = sys.modules.get("torch")
    cuda_started = torch is not None and torch.cuda.is_initialized()
    if WORKSPACE_VARIABLE not in os.environ and not cuda_started:
        os.environ[WORKSPACE_VARIABLE] = NO_WORKSPACE
    return os.environ.get(WORKSPACE_VARIABLE)
