"""Build Triton kernels for CUDA SMs on a machine without a GPU (`triton.compile` with a GPUTarget).

Run as a script in a process without TRITON_INTERPRET (the interpreter replaces @triton.jit functions,
which triton.compile cannot take): reads launches recorded under the interpreter (JSON: module, kernel
name, argument types, constexpr values, launch options), compiles each for every SM given, prints one
line per build and exits non-zero if any failed.

    python tests/lowering/gpu_binaries.py launches.json 90 80
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor


def build(launch: dict, sm: int) -> int:
    """Compile one recorded launch for `sm`; returns the cubin's size in bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        module = importlib.import_module(launch["module"])
    except ModuleNotFoundError:  # a generated kernel module (kernels/fused_pointwise.py): load it from its file
        spec = importlib.util.spec_from_file_location(launch["module"], launch["file"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    kernel = getattr(module, launch["kernel"])
    source = ASTSource(kernel, launch["signature"], launch["constexprs"])
    compiled = triton.compile(source, target=GPUTarget("cuda", sm, 32), options=launch["options"])
    return len(compiled.asm["cubin"])


def report(launch: dict, sm: int) -> tuple[bool, str]:
    """(built, one line or the traceback) for one launch and SM."""
    name = f"sm_{sm} {launch['module']}.{launch['kernel']} {launch['constexprs']}"
    try:
        return True, f"ok   {name}: {build(launch, sm)} bytes"
    except Exception:  # every failure is reported, then the exit status says it
        return False, f"FAIL {name}\n{traceback.format_exc()}"


PDL_MIN_SM = 90  # programmatic dependent launch (griddepcontrol) exists from sm_90


def with_pdl(launch: dict) -> dict:
    """The launch as kernels/common.pdl_launch makes it on sm_90+: USE_PDL on, launch_pdl among the options."""
    constexprs = {**launch["constexprs"], "USE_PDL": True}
    return {**launch, "constexprs": constexprs, "options": {**launch["options"], "launch_pdl": True}}


def build_jobs(launches: list[dict], sms: list[int]) -> list[tuple[dict, int]]:
    """Every recorded launch for every SM, and on sm_90+ again with PDL where the kernel takes USE_PDL (the
    recording runs on the CPU, where no launch uses it)."""
    jobs = [(launch, sm) for sm in sms for launch in launches]
    pdl = [launch for launch in launches if "USE_PDL" in launch["constexprs"]]
    return jobs + [(with_pdl(launch), sm) for sm in sms if sm >= PDL_MIN_SM for launch in pdl]


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("run without TRITON_INTERPRET: the interpreter replaces the kernels")
    launches = json.loads(open(argv[0]).read())
    jobs = build_jobs(launches, [int(sm) for sm in argv[1:]])
    # One build is about a second of single-threaded MLIR + ptxas: spread them over the cores.
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(report, *zip(*jobs, strict=True)))
    for _, line in results:
        print(line)
    return 0 if all(built for built, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
