# ruff: noqa  (the script as run, kept with its results)
"""Cold start of the 8B/1B artifact (buckets 1,4,8, both modes) in fresh processes, alternating the
experiment's setting: captured graphs instantiated one after another, or on GRAPHSPEC_INSTANTIATE_THREADS
threads, after every capture. Prints load-to-ready and the warm-up's phases of each process.
(GRAPHSPEC_INSTANTIATE_THREADS was a knob of this experiment's working tree only; it bought nothing and was removed.)

    python docs/results/2026-11-27-instantiate-probe/coldstart_ab.py [rounds] [profile file]

With a profile file: then one more cold start, Runtime.load under cProfile (bench_prefill's
--cold-start-profile), its summary written there.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import graphspec
from benchmarks import common
from benchmarks.bench_step import PRESETS, write_checkpoint
from graphspec.artifact import save_artifact

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
profile = sys.argv[2] if len(sys.argv) > 2 else None
bench = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_prefill.py"
target_shape, draft_shape = PRESETS["llama"]
with tempfile.TemporaryDirectory(dir=common.checkpoint_dir(0)) as workdir:
    target_dir = write_checkpoint(Path(workdir) / "target", target_shape, "cuda", seed=1)
    draft_dir = write_checkpoint(Path(workdir) / "draft", draft_shape, "cuda", seed=2)
    began = time.perf_counter()
    compiled = graphspec.compile(
        target_dir,
        draft_dir,
        k=4,
        batch_sizes=(1, 4, 8),
        dtype="bfloat16",
        device="cuda",
        max_seq_len=8192,
        prefill_tokens=4096,
        modes=("greedy", "sample"),
    )
    runtime = graphspec.Runtime(compiled)  # warm: fills the Triton cache the artifact carries
    artifact = Path(workdir) / "artifact"
    save_artifact(runtime.compiled, artifact, copy_weights=False)
    print(f"compiled, warmed up and saved in {time.perf_counter() - began:.0f} s", flush=True)
    del runtime, compiled
    common.free_device_memory()
    for round_ in range(rounds):
        for threads in ("0", "4"):
            env = {
                **os.environ,
                "GRAPHSPEC_INSTANTIATE_THREADS": threads,
                "TRITON_CACHE_DIR": str(Path(workdir) / f"triton_{round_}_{threads}"),
            }
            command = [sys.executable, str(bench), "--cold-start-artifact", str(artifact), "--cold-start-tokens", "512"]
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if done.returncode:
                print(done.stderr[-3000:])
                continue
            cold = json.loads(done.stdout.strip().splitlines()[-1])
            phases = ", ".join(f"{k} {v:.2f}" for k, v in cold["startup_seconds"].items())
            warm = ", ".join(f"{k} {v:.2f}" for k, v in cold["warm_up_seconds"].items())
            capture = ", ".join(f"{k} {v:.2f}" for k, v in cold["capture_phase_seconds"].items())
            print(
                f"threads {threads}: load to ready {cold['load_to_ready_s']:.2f} s; first/second request "
                f"{cold['first_request_ms']:.0f}/{cold['second_request_ms']:.0f} ms; compiles "
                f"{cold['triton_compiles_during_requests']}, captures {cold['captures_during_requests']}\n"
                f"  phases: {phases}\n  warm-up: {warm}\n  capture: {capture}",
                flush=True,
            )
    if profile:
        env = {**os.environ, "TRITON_CACHE_DIR": str(Path(workdir) / "triton_profile")}
        command = [sys.executable, str(bench), "--cold-start-artifact", str(artifact), "--cold-start-tokens", "512"]
        done = subprocess.run([*command, "--cold-start-profile", profile], capture_output=True, text=True, env=env)
        print(
            f"profiled cold start: exit {done.returncode}, load to ready "
            f"{json.loads(done.stdout.strip().splitlines()[-1])['load_to_ready_s']:.2f} s"
            if not done.returncode
            else done.stderr[-3000:]
        )
