"""graphspec against the systems users would pick instead, side by side, in one process on one device.

    python benchmarks/bench_systems.py [--small] [--out-dir D] [--pairs llama,qwen3] [--grid 2:1,4:1,...]

    PYTHONUNBUFFERED=1 python benchmarks/bench_systems.py --out-dir $OUT     # H200: 7 min (423 s), 8B/1B llama
    python benchmarks/bench_systems.py --small                                 # CPU smoke run (tiny models)
    python benchmarks/bench_systems.py --pairs qwen3                           # Qwen3-8B/0.6B alone: 9 min

Defaults (full size): Llama-3.1-8B-shaped target, Llama-3.2-1B-shaped draft, bf16, 128-token prompts,
256 new tokens, graphspec grid K:B = every K in 2/4/6 at every batch in 1/4/16/64, graphspec target-only
(compiled) at batch 1/16/64, the eager reference once at the largest batch (the oracle), transformers
greedy at 1/16. Optional work (static+compile, a second pair) starts only if it fits in --budget-s (520);
at --hard-deadline-s (570) a watchdog writes and prints what exists and exits 3.

What runs (same random weights, same prompts, greedy, no EOS stopping):
- graphspec speculative decoding (graphspec.compile + Runtime, CUDA graphs) over a (K, batch) grid, and a
  self-draft case (draft = target: every draft accepted, the ceiling of the step machinery);
- graphspec's plain target-only reference decoder, eager (graphspec.reference.reference_generate), whose
  output at the largest batch is the oracle every other system's tokens are checked against;
- graphspec target-only compiled like the step (benchmarks/target_only.py: traced, lowered to the same
  kernels, one CUDA graph per decode forward), the no-speculation baseline on the same machinery;
- transformers generate, greedy, target only; with a static cache + torch.compile (reduce-overhead);
  and assisted generation with the draft (num_assistant_tokens=K, constant schedule, no confidence cutoff);
- the floor: bytes a step must read over the copy bandwidth measured here (and FLOPs over the measured
  matrix rate, whichever is larger);
- regions: for every graphspec K:B point, where the time of one real step goes, measured inside the
  compiled (and on CUDA captured) step by marks at its region boundaries: draft, verify (the target
  forward), accept (verify/accept, commit, feedback), and host = generate()'s wall per step minus the step.

Random weights give random acceptance, so every row reports time per target forward (per speculation
step for speculative systems) and tokens per step next to tokens/s. Outputs are checked against the oracle
margin-aware: a divergence is benign when the diverging token's logit is within a bf16 rounding margin of
the target's top logit at that position (teacher-forced on the shared prefix).

Every system fails soft: an error becomes a row that says why. Results stream to <out-dir>/bench_systems.json
after every row; a watchdog prints what exists and exits before --hard-deadline-s. The table prints last.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

START = time.perf_counter()

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `graphspec` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common  # noqa: E402

common.setup_path()

SYSTEMS = ("reference", "target-graph", "graphspec", "selfdraft", "regions", "hf-greedy", "hf-compile", "hf-assisted")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# Seconds a system is expected to need on an H200 (8B pair); an optional system starts only when it is
# expected to finish inside --budget-s.
ESTIMATED_S = {"hf-compile": 90.0, "pair": 300.0}  # hf-compile took 30-38 s on the H200 (8B models)

FULL_DEFAULTS = dict(
    device="cuda",
    dtype="bfloat16",
    prompt_len=128,
    new_tokens=256,
    grid="2/4/6:1/4/16/64",
    ref_batches="",  # the eager reference runs once, at the largest batch, as the oracle
    target_batches="1,16,64",
    hf_batches="1,16",
    max_seq_len=512,
    warmup_tokens=16,
    region_reps=20,
    budget_s=520.0,
    hard_deadline_s=570.0,
)
SMALL_DEFAULTS = dict(
    device="cpu",
    dtype="float32",
    prompt_len=16,
    new_tokens=12,
    grid="2:1,4:1,4:2",
    ref_batches="1,2",
    target_batches="1,2",
    hf_batches="1,2",
    max_seq_len=64,
    warmup_tokens=4,
    region_reps=3,
    budget_s=1e9,
    hard_deadline_s=1e9,
)


def elapsed() -> float:
    return time.perf_counter() - START


def parse_ints(text: str) -> list[int]:
    return [int(t) for t in str(text).replace(" ", "").split(",") if t]


def parse_grid(text: str) -> list[tuple[int, int]]:
    """'2:1,4:1,4:16' -> [(2, 1), (4, 1), (4, 16)]; 'K1/K2:B1/B2' expands to the product."""
    grid: list[tuple[int, int]] = []
    for item in str(text).replace(" ", "").split(","):
        if not item:
            continue
        ks, _, bs = item.partition(":")
        if not bs:
            raise argparse.ArgumentTypeError(f"grid entry {item!r} is not K:B")
        for k in ks.split("/"):
            for b in bs.split("/"):
                if (int(k), int(b)) not in grid:
                    grid.append((int(k), int(b)))
    return grid


def short_error(error: BaseException, limit: int = 300) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class InjectedFailureError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------------
# graphspec loading cache: compile() loads both checkpoints on every call; the benchmark compiles several
# times (per K, self-draft), so each checkpoint is read from disk once and the loaded models are shared.
# --------------------------------------------------------------------------------------------------


class LoadCache:
    def __init__(self) -> None:
        self.models: dict[tuple[str, str, str, bool], object] = {}
        self._module = None
        self._original = None

    def load(self, path, dtype="float32", device="cpu", fold_norms=False):
        from graphspec.models.loading import load_model

        key = (str(Path(path).resolve()), str(dtype), str(device), fold_norms)
        if key not in self.models:
            self.models[key] = load_model(path, dtype, device, fold_norms=fold_norms)
        return self.models[key]

    def install(self) -> bool:
        import graphspec.compiler as compiler_module

        if not hasattr(compiler_module, "load_model"):
            return False  # compile() changed how it loads: it then loads per call (slower, still right)
        self._module, self._original = compiler_module, compiler_module.load_model
        compiler_module.load_model = self.load
        return True

    def uninstall(self) -> None:
        if self._module is not None:
            self._module.load_model = self._original
            self._module = None
        self.models.clear()


# --------------------------------------------------------------------------------------------------
# The oracle: target-only greedy output, and teacher-forced target logits for margin-aware checks.
# --------------------------------------------------------------------------------------------------


class Oracle:
    def __init__(self, model, prompts, outputs, dtype, device, margin_rel: float, margin_ulps: float) -> None:
        self.model = model
        self.prompts = [list(p) for p in prompts]
        self.outputs = [list(o) for o in outputs]
        self.dtype = dtype
        self.device = device
        self.margin_rel = margin_rel
        self.margin_ulps = margin_ulps
        self.hidden: list[torch.Tensor] = []  # per row: [N, hidden] states predicting output token j
        self.stats: dict = {}

    @torch.inference_mode()
    def prepare(self, chunk: int = 8) -> None:
        """Teacher-force prompt + output[:-1] through the target; keep the states that predict each output."""
        rows = len(self.outputs)
        for start in range(0, rows, chunk):
            group = list(range(start, min(start + chunk, rows)))
            lengths = {len(self.prompts[r]) + len(self.outputs[r]) - 1 for r in group}
            subgroups = [group] if len(lengths) == 1 else [[r] for r in group]
            for sub in subgroups:
                seqs = [self.prompts[r] + self.outputs[r][:-1] for r in sub]
                tokens = torch.tensor(seqs, dtype=torch.int64, device=self.device)
                cache = self.model.new_cache(len(sub), tokens.shape[1], self.dtype, self.device)
                zeros = torch.zeros(len(sub), dtype=torch.int64, device=self.device)
                slots = torch.arange(len(sub), device=self.device)
                hidden, _ = self.model(tokens, zeros, slots, cache, in_place=True)
                for i, r in enumerate(sub):
                    p = len(self.prompts[r])
                    self.hidden.append(hidden[i, p - 1 :].clone())
                del cache, hidden
        # How tie-prone is this model? (share of positions whose top-2 logits are within the margin, and
        # whether the oracle's own tokens are the teacher-forced argmax)
        near, agree, total = 0, 0, 0
        for r in range(rows):
            logits = self.model.logits(self.hidden[r]).float()  # [N, V]
            top2 = logits.topk(2, dim=-1).values
            tol = self.tolerance(top2[:, 0])
            near += int(((top2[:, 0] - top2[:, 1]) <= tol).sum())
            ids = torch.tensor(self.outputs[r], device=logits.device)
            own = logits.gather(1, ids[:, None])[:, 0]
            agree += int(((top2[:, 0] - own) <= tol).sum())
            total += logits.shape[0]
        self.stats = {
            "rows": rows,
            "positions": total,
            "near_tie_fraction": near / max(total, 1),
            "oracle_is_argmax_fraction": agree / max(total, 1),
        }

    def tolerance(self, top: torch.Tensor) -> torch.Tensor:
        """max(rel * |top|, ulps * ulp(top)) in the model dtype's rounding."""
        eps = torch.finfo(self.dtype).eps
        mag = top.abs().clamp_min(1e-30)
        ulp = eps * torch.exp2(torch.floor(torch.log2(mag)))
        return torch.maximum(self.margin_rel * mag, self.margin_ulps * ulp)

    @torch.inference_mode()
    def check(self, outputs: list[list[int]]) -> dict:
        rows = len(outputs)
        if rows > len(self.outputs):
            return {"status": "no-oracle", "summary": f"oracle has {len(self.outputs)} rows < {rows}"}
        exact, matched, total, divergences = 0, 0, 0, []
        for r, out in enumerate(outputs):
            ref = self.outputs[r]
            total += len(ref)
            n = min(len(out), len(ref))
            first = next((j for j in range(n) if out[j] != ref[j]), None)
            if first is None:
                matched += n
                if len(out) == len(ref):
                    exact += 1
                else:
                    divergences.append({"row": r, "pos": n, "kind": "length", "len": len(out), "benign": False})
                continue
            matched += first
            logits = self.model.logits(self.hidden[r][first]).float()
            top = logits.max()
            tol = float(self.tolerance(top))
            gap = float(top - logits[out[first]])
            gap_ref = float(top - logits[ref[first]])
            divergences.append(
                {
                    "row": r,
                    "pos": first,
                    "kind": "token",
                    "got": out[first],
                    "want": ref[first],
                    "gap": gap,
                    "oracle_gap": gap_ref,
                    "tol": tol,
                    "benign": gap <= tol,
                }
            )
        bad = [d for d in divergences if not d["benign"]]
        if not divergences:
            status, summary = "exact", f"exact {exact}/{rows}"
        elif not bad:
            at = ",".join(f"@{d['pos']}" for d in divergences[:3]) + ("..." if len(divergences) > 3 else "")
            status, summary = "ok", f"ok {exact}/{rows} exact, {len(divergences)} near-tie ({at})"
        else:
            worst = max(bad, key=lambda d: d.get("gap", math.inf))
            where = f"@{worst['pos']}" + (f" gap {worst['gap']:.3g}>{worst['tol']:.2g}" if "gap" in worst else " short")
            status, summary = "MISMATCH", f"MISMATCH {len(bad)}/{rows} rows ({where})"
        return {
            "status": status,
            "summary": summary,
            "rows": rows,
            "exact_rows": exact,
            "exact_fraction": exact / max(rows, 1),
            "matched_token_fraction": matched / max(total, 1),
            "first_divergence": [d["pos"] for d in divergences],
            "divergences": divergences[:64],
        }


# --------------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = args.device
        self.dtype = DTYPES[args.dtype]
        self.out_dir = Path(args.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.log_lines: list[str] = []
        self.current = "startup"
        self.results: dict = {
            "source": common.source_info(),
            "meta": {
                "device": common.device_name(self.device),
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "python": platform.python_version(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "complete": False,
            },
            "args": {k: v for k, v in vars(args).items()},
            "ceilings": {},
            "pairs": {},
        }
        with contextlib.suppress(Exception):
            import transformers

            self.results["meta"]["transformers"] = transformers.__version__
        self.systems = set(SYSTEMS) if args.systems == "all" else set(args.systems.split(","))
        self.systems -= set(filter(None, args.skip_systems.split(",")))
        self.inject = set(filter(None, args.inject_failure.split(",")))
        self.checkpoint_dirs: list[Path] = []  # removed at exit, also by the watchdog

    # ---------------------------------------------------------------------------------------------
    # Bookkeeping
    # ---------------------------------------------------------------------------------------------

    def log(self, message: str) -> None:
        line = f"[{elapsed():7.1f}s] {message}"
        with self.lock:
            self.log_lines.append(line)
        print(line, file=sys.stderr, flush=True)

    def remaining(self) -> float:
        return self.args.budget_s - elapsed()

    def want(self, system: str) -> bool:
        return system in self.systems

    def pair_results(self, pair: str) -> dict:
        with self.lock:
            return self.results["pairs"].setdefault(
                pair, {"models": {}, "rows": [], "regions": [], "oracle": {}, "notes": []}
            )

    def add_row(self, pair: str, row: dict) -> None:
        with self.lock:
            self.pair_results(pair)["rows"].append(row)
        self.write_json()

    def snapshot(self) -> dict:
        with self.lock:
            data = copy.deepcopy(self.results)
            data["meta"]["elapsed_s"] = elapsed()
            data["log"] = list(self.log_lines[-400:])
        return data

    def write_json(self, data: dict | None = None) -> None:
        data = data or self.snapshot()
        path = self.out_dir / "bench_systems.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, path)

    def run_system(
        self,
        pair: str,
        system: str,
        k: int | None,
        batch: int,
        fn: Callable[[], dict],
        oracle: Oracle | None = None,
        estimate_s: float = 0.0,
    ) -> dict:
        """Run one measurement; whatever happens, a row is recorded."""
        row: dict = {"pair": pair, "system": system, "k": k, "batch": batch, "status": "ok"}
        self.current = f"{pair}/{system} k={k} b={batch}"
        began = time.perf_counter()
        if estimate_s and elapsed() + estimate_s > self.args.budget_s:
            row.update(
                status="skipped",
                error=f"time budget: {elapsed():.0f}s used, needs ~{estimate_s:.0f}s "
                f"of --budget-s {self.args.budget_s:.0f}",
            )
            self.log(f"skip {self.current}: {row['error']}")
            self.add_row(pair, row)
            return row
        self.log(f"run {self.current}")
        outputs = None
        cuda = common.is_cuda(self.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            if system in self.inject or f"{system}@{batch}" in self.inject:
                raise InjectedFailureError(f"injected failure for {system}@{batch} (--inject-failure)")
            result = fn()
            outputs = result.pop("outputs", None)
            row.update(result)
        except Exception as error:
            row.update(status="error", error=short_error(error))
            self.log(f"FAILED {self.current}: {row['error']}")
            with self.lock:
                self.log_lines.extend(traceback.format_exc().splitlines()[-25:])
            common.free_device_memory()
        if row["status"] == "ok":
            if outputs is None:
                row["check"] = {"status": "n/a", "summary": "no outputs"}
            elif oracle is None:
                row["check"] = {"status": "no-oracle", "summary": "no oracle"}
            else:
                try:
                    row["check"] = oracle.check(outputs)
                except Exception as error:
                    row["check"] = {"status": "check-error", "summary": short_error(error, 80)}
        row["wall_s"] = time.perf_counter() - began
        if cuda:
            row["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9
        self.add_row(pair, row)
        self.log(f"done {self.current}: {describe_row(row)}")
        return row

    # ---------------------------------------------------------------------------------------------
    # Ceilings
    # ---------------------------------------------------------------------------------------------

    def measure_ceilings(self) -> None:
        ceilings = {}
        try:
            ceilings["copy"] = common.measure_copy_bandwidth(self.device)
            self.log(f"copy bandwidth {ceilings['copy']['gb_s']:.0f} GB/s (read+write)")
        except Exception as error:
            ceilings["copy_error"] = short_error(error)
        try:
            ceilings["matmul"] = common.measure_matmul_rate(self.device, self.dtype)
            self.log(f"matmul rate {ceilings['matmul']['tflops']:.1f} TFLOP/s ({self.args.dtype})")
        except Exception as error:
            ceilings["matmul_error"] = short_error(error)
        common.free_device_memory()
        with self.lock:
            self.results["ceilings"] = ceilings

    def floor(self, target_cost, draft_cost, k: int, batch: int) -> dict | None:
        """Fewest ms one step can take: bytes read over copy bandwidth vs FLOPs over the matrix rate.
        k=0: one target-only decode forward. Context: the run's mean (prompt + half the new tokens)."""
        ceilings = self.results.get("ceilings", {})
        if "copy" not in ceilings or target_cost is None:
            return None
        ctx = self.args.prompt_len + self.args.new_tokens / 2
        t = target_cost
        nbytes = t.weight_bytes + batch * ctx * t.kv_bytes_per_token
        flops = batch * (k + 1) * (2 * t.matmul_params + ctx * t.attn_flops_per_ctx)
        if k:
            d = draft_cost
            nbytes += k * d.weight_bytes + batch * ctx * k * d.kv_bytes_per_token
            flops += batch * k * (2 * d.matmul_params + ctx * d.attn_flops_per_ctx)
        bw_ms = nbytes / (ceilings["copy"]["gb_s"] * 1e9) * 1e3
        fl_ms = flops / (ceilings["matmul"]["tflops"] * 1e12) * 1e3 if "matmul" in ceilings else 0.0
        return {"ms": max(bw_ms, fl_ms), "bw_ms": bw_ms, "flop_ms": fl_ms, "bytes": nbytes, "flops": flops}

    # ---------------------------------------------------------------------------------------------
    # One model pair
    # ---------------------------------------------------------------------------------------------

    def run_pair(self, pair: str) -> None:
        args = self.args
        shapes = (common.SMALL_PAIRS if args.small else common.PAIRS)[pair]
        info = self.pair_results(pair)
        info["models"] = {"target": shapes[0], "draft": shapes[1]}
        cache = LoadCache()
        hf_target = hf_draft = None
        dirs: list[Path] = []
        try:
            self.current = f"{pair}/build"
            began = time.perf_counter()
            hf_target = common.build_hf_model(shapes[0], self.device, self.dtype, seed=args.seed)
            hf_draft = common.build_hf_model(shapes[1], self.device, self.dtype, seed=args.seed + 1)
            target_cost, draft_cost = common.ModelCost.of(hf_target), common.ModelCost.of(hf_draft)
            info["models"]["target_weight_gb"] = target_cost.weight_bytes / 1e9
            info["models"]["draft_weight_gb"] = draft_cost.weight_bytes / 1e9
            self.log(
                f"{pair}: built {shapes[0]} ({target_cost.weight_bytes / 1e9:.2f} GB read/forward) and "
                f"{shapes[1]} ({draft_cost.weight_bytes / 1e9:.2f} GB) on {self.device} in "
                f"{time.perf_counter() - began:.1f}s"
            )
            began = time.perf_counter()
            for model, cost in ((hf_target, target_cost), (hf_draft, draft_cost)):
                directory = common.checkpoint_dir(int(cost.weight_bytes * 1.2), args.ckpt_dir)
                dirs.append(directory)
                self.checkpoint_dirs.append(directory)
                common.save_checkpoint(model, directory)
            target_dir, draft_dir = dirs
            self.log(f"{pair}: saved checkpoints to {target_dir.parent} in {time.perf_counter() - began:.1f}s")
            began = time.perf_counter()
            cache.install()
            gs_target = cache.load(target_dir, args.dtype, self.device)
            cache.load(draft_dir, args.dtype, self.device)
            self.log(f"{pair}: graphspec loaded both in {time.perf_counter() - began:.1f}s")
            info["models"]["target_dir"], info["models"]["draft_dir"] = str(target_dir), str(draft_dir)

            vocab = hf_target.config.vocab_size
            generator = torch.Generator().manual_seed(args.seed)
            grid = parse_grid(args.grid)
            # The oracle runs at the largest batch any selected system uses; smaller batches check its prefix rows.
            batches = {1} | set(parse_ints(args.ref_batches))
            if self.want("target-graph"):
                batches |= set(parse_ints(args.target_batches))
            if self.want("graphspec"):
                batches |= {b for _, b in grid}
            if self.want("hf-greedy"):
                batches |= set(parse_ints(args.hf_batches))
            biggest = max(batches)
            low = min(3, vocab - 1)
            prompts = torch.randint(low, vocab, (biggest, args.prompt_len), generator=generator).tolist()

            oracle = self.run_reference_rows(pair, gs_target, prompts, biggest)
            self.run_target_graph_rows(pair, gs_target, prompts, oracle)
            self.run_graphspec_rows(pair, target_dir, draft_dir, prompts, grid, oracle, target_cost, draft_cost)
            self.run_hf_rows(pair, hf_target, hf_draft, prompts, oracle)
            self.add_floor_rows(pair, target_cost, draft_cost, grid)
        except Exception as error:
            self.log(f"{pair}: setup FAILED: {short_error(error)}")
            with self.lock:
                info["notes"].append(f"setup failed: {short_error(error, 1000)}")
                self.log_lines.extend(traceback.format_exc().splitlines()[-25:])
            self.add_row(
                pair,
                {
                    "pair": pair,
                    "system": "setup",
                    "k": None,
                    "batch": 0,
                    "status": "error",
                    "error": short_error(error),
                },
            )
        finally:
            cache.uninstall()
            del hf_target, hf_draft
            with contextlib.suppress(Exception):
                torch._dynamo.reset()
            common.free_device_memory()
            if not args.keep_checkpoints:
                self.remove_checkpoints()

    # ---------------------------------------------------------------------------------------------
    # graphspec's plain target-only decoder (the oracle)
    # ---------------------------------------------------------------------------------------------

    def run_reference_rows(self, pair: str, gs_target, prompts, biggest: int) -> Oracle | None:
        args = self.args
        model = gs_target.model
        oracle: Oracle | None = None
        if not self.want("reference"):
            return None

        def measure(batch: int) -> dict:
            from graphspec.reference import reference_generate

            rows = prompts[:batch]
            limit = args.prompt_len + args.new_tokens
            reference_generate(model, rows, 2, max_seq_len=limit)  # warm-up (cuBLAS handles, allocator)
            # One mark after every model forward (prefill, then one per decode step), the same per-step
            # clock the HF rows use: the intervals are decode steps including the host's sampling.
            clock = common.Clock(self.device)
            hook = model.register_forward_hook(lambda *_: clock.mark())
            common.sync(self.device)
            began = time.perf_counter()
            try:
                outputs = reference_generate(model, rows, args.new_tokens, max_seq_len=limit)
            finally:
                hook.remove()
            common.sync(self.device)
            wall = time.perf_counter() - began
            n = args.new_tokens
            intervals = clock.intervals_ms()
            step_ms = statistics.fmean(intervals) if intervals else wall * 1e3
            return {
                "tokens_per_s": batch * n / wall,
                "ms_per_step": step_ms,
                "tokens_per_step": 1.0,
                "steps": n,
                "gen_wall_s": wall,
                "outputs": outputs,
            }

        # The oracle first, at the largest batch any system runs (prefix rows serve smaller batches).
        holder: dict = {}

        def oracle_run() -> dict:
            result = measure(biggest)
            holder["outputs"] = result["outputs"]
            return result

        row = self.run_system(pair, "graphspec-reference-eager", 0, biggest, oracle_run)
        if row["status"] == "ok":
            try:
                began = time.perf_counter()
                oracle = Oracle(
                    model, prompts, holder["outputs"], self.dtype, self.device, args.margin_rel, args.margin_ulps
                )
                oracle.prepare()
                self.log(f"{pair}: oracle margins in {time.perf_counter() - began:.1f}s: {oracle.stats}")
                with self.lock:
                    self.pair_results(pair)["oracle"] = dict(oracle.stats, batch=biggest)
                row["check"] = oracle.check(holder["outputs"])  # itself: exact by construction
            except Exception as error:
                oracle = None
                self.log(f"{pair}: oracle margins FAILED: {short_error(error)}")
                with self.lock:
                    self.pair_results(pair)["notes"].append(f"oracle margins failed: {short_error(error)}")
        for batch in sorted(set(parse_ints(args.ref_batches)) - {biggest}):
            self.run_system(pair, "graphspec-reference-eager", 0, batch, lambda b=batch: measure(b), oracle)
        return oracle

    def run_target_graph_rows(self, pair: str, gs_target, prompts, oracle: Oracle | None) -> None:
        """graphspec without speculation, compiled like the step (traced, lowered, one CUDA graph per
        decode forward that feeds its own token back): benchmarks/target_only.py."""
        if not self.want("target-graph"):
            return
        from benchmarks import target_only

        args = self.args
        limit = args.prompt_len + args.new_tokens

        def measure(batch: int) -> dict:
            rows = prompts[:batch]
            target_only.generate(gs_target.model, rows, 2, limit)  # warm-up: Triton JIT, cuBLAS handles
            result = target_only.generate(gs_target.model, rows, args.new_tokens, limit)
            return {
                "tokens_per_s": batch * args.new_tokens / result.wall_s,
                "ms_per_step": result.decode_ms_per_token,
                "tokens_per_step": 1.0,
                "steps": args.new_tokens,
                "gen_wall_s": result.wall_s,
                "captured": result.captured,
                "outputs": result.tokens,
            }

        for batch in sorted(set(parse_ints(args.target_batches))):
            self.run_system(pair, "graphspec-target-only", 0, batch, lambda b=batch: measure(b), oracle)

    # ---------------------------------------------------------------------------------------------
    # graphspec speculative decoding
    # ---------------------------------------------------------------------------------------------

    def run_graphspec_rows(self, pair, target_dir, draft_dir, prompts, grid, oracle, target_cost, draft_cost):
        args = self.args
        by_k: dict[int, list[int]] = {}
        for k, b in grid:
            by_k.setdefault(k, []).append(b)
        groups = []
        if self.want("graphspec"):
            groups += [("graphspec", k, sorted(bs), draft_dir, draft_cost) for k, bs in by_k.items()]
        if self.want("selfdraft"):
            groups.append(("graphspec-selfdraft", args.selfdraft_k, [1], target_dir, target_cost))
        for system, k, batches, draft, dcost in groups:
            self.run_graphspec_group(pair, system, k, batches, target_dir, draft, prompts, oracle, target_cost, dcost)

    def run_graphspec_group(self, pair, system, k, batches, target_dir, draft_dir, prompts, oracle, tcost, dcost):
        import graphspec

        args = self.args
        runtime = compiled = None
        compile_error = None
        began = time.perf_counter()
        self.current = f"{pair}/{system} k={k} compile"
        try:
            if system in self.inject or f"{system}@compile" in self.inject:
                raise InjectedFailureError(f"injected failure for {system} compile (--inject-failure)")
            self.log(f"compile {system} k={k} buckets={batches}")
            compiled = graphspec.compile(
                target_dir,
                draft_dir,
                k=k,
                batch_sizes=tuple(batches),
                dtype=args.dtype,
                device=self.device,
                max_seq_len=args.max_seq_len,
                modes=("greedy",),
            )
            runtime = graphspec.Runtime(compiled)
        except Exception as error:
            compile_error = short_error(error)
            self.log(f"compile {system} k={k} FAILED: {compile_error}")
            with self.lock:
                self.log_lines.extend(traceback.format_exc().splitlines()[-25:])
        compile_s = time.perf_counter() - began
        try:
            for index, batch in enumerate(batches):
                if runtime is None:
                    self.add_row(
                        pair,
                        {
                            "pair": pair,
                            "system": system,
                            "k": k,
                            "batch": batch,
                            "status": "error",
                            "error": f"compile failed: {compile_error}",
                        },
                    )
                    continue
                row = self.run_system(
                    pair, system, k, batch, lambda b=batch: self.measure_graphspec(runtime, k, b, prompts), oracle
                )
                if index == 0:
                    row["compile_s"] = compile_s
                floor = self.floor(tcost, dcost, k, batch)
                if floor and row.get("ms_per_step"):
                    row["floor"] = floor
                if self.want("regions") and system == "graphspec":
                    try:
                        regions = self.time_regions(runtime, k, batch, row)
                        row["regions"] = regions
                        with self.lock:
                            self.pair_results(pair)["regions"].append(dict(regions, k=k, batch=batch))
                    except Exception as error:
                        row["regions"] = {"error": short_error(error)}
                        self.log(f"regions k={k} b={batch} FAILED: {short_error(error)}")
                self.write_json()
        finally:
            runtime = compiled = None
            common.free_device_memory()

    def measure_graphspec(self, runtime, k: int, batch: int, prompts) -> dict:
        args = self.args
        rows = prompts[:batch]
        began = time.perf_counter()
        runtime.generate(rows, max_new_tokens=args.warmup_tokens, stop_token_ids=[])  # capture + warm-up
        common.sync(self.device)
        warm_s = time.perf_counter() - began
        fields = ("steps", "accepted", "emitted", "step_seconds", "graph_steps")
        repeats = max(1, args.repeats) + (1 if (k == 4 and batch == 1 and args.repeats == 1) else 0)
        runs, outputs = [], None
        for _ in range(repeats):
            before = {f: getattr(runtime.stats, f, 0) for f in fields}
            common.sync(self.device)
            began = time.perf_counter()
            results = runtime.generate(rows, max_new_tokens=args.new_tokens, stop_token_ids=[])
            common.sync(self.device)
            wall = time.perf_counter() - began
            d = {f: getattr(runtime.stats, f, 0) - before[f] for f in fields}
            steps = max(d["graph_steps"], 1)
            runs.append(
                {
                    "wall_s": wall,
                    "tokens_per_s": sum(len(r.token_ids) for r in results) / wall,
                    "ms_per_step": d["step_seconds"] / steps * 1e3,
                    "tokens_per_step": (d["accepted"] + d["steps"]) / max(d["steps"], 1),
                    "graph_steps": d["graph_steps"],
                    "decode_tokens_per_s": d["emitted"] / d["step_seconds"] if d["step_seconds"] else None,
                    "acceptance_rate": d["accepted"] / (d["steps"] * k) if d["steps"] else 0.0,
                }
            )
            outputs = outputs or [list(r.token_ids) for r in results]
        best = sorted(runs, key=lambda r: r["tokens_per_s"])[len(runs) // 2]  # median run
        graphs = {}
        with contextlib.suppress(Exception):
            graphs = {f"{m}/{b}": g.describe() for (m, b), g in runtime.graphs.items() if b == batch}
        spread = None
        if len(runs) > 1:
            times = [r["ms_per_step"] for r in runs]
            spread = (max(times) - min(times)) / statistics.median(times)
        return {
            **{key: best[key] for key in ("tokens_per_s", "ms_per_step", "tokens_per_step", "acceptance_rate")},
            "steps": best["graph_steps"],
            "decode_tokens_per_s": best["decode_tokens_per_s"],
            "warmup_s": warm_s,
            "runs": runs,
            "step_ms_spread": spread,
            "graphs": graphs,
            "outputs": outputs,
        }

    @torch.inference_mode()
    def time_regions(self, runtime, k: int, batch: int, row: dict) -> dict:
        """Where the time of one real step goes, measured inside it: the bucket's compiled step (lowered
        kernels, captured on CUDA) instrumented with marks at its region boundaries (draft, verify,
        accept; graphspec.runtime.region_timing), at the run's mean context, next to the plain step.
        host_ms = generate()'s wall time per step (this row's ms_per_step) minus the plain step."""
        from graphspec.runtime.region_timing import time_regions

        device = self.device
        ctx = int(self.args.prompt_len + self.args.new_tokens / 2)
        vocab = runtime.target.spec.vocab_size
        graph = runtime.graphs[("greedy", batch)]
        graph.buffers.load_rows(  # every row real, at the mean context; caches hold this run's KV
            {
                "last_tokens": torch.randint(3, vocab, (batch, 2), device=device),
                "committed_len": torch.full((batch,), ctx, dtype=torch.int64, device=device),
                "slot_ids": torch.arange(batch, device=device),
                "step_counter": torch.ones(batch, dtype=torch.int64, device=device),
            }
        )
        reps = self.args.region_reps
        timing = time_regions(graph, runs=reps, warmup=1 if reps < 5 else 3)
        return dict(timing.as_dict(wall_ms_per_step=row.get("ms_per_step")), context=ctx)

    # ---------------------------------------------------------------------------------------------
    # transformers
    # ---------------------------------------------------------------------------------------------

    def hf_generate(self, model, batch: int, prompts, n: int, clock: bool = True, **config) -> dict:
        from transformers import GenerationConfig, LogitsProcessorList

        ids = torch.tensor(prompts[:batch], dtype=torch.int64, device=self.device)
        mask = torch.ones_like(ids)
        gen = GenerationConfig(
            max_new_tokens=n,
            do_sample=False,
            num_beams=1,
            eos_token_id=None,
            pad_token_id=0,
            use_cache=True,
            **{k: v for k, v in config.items() if k != "assistant_model"},
        )
        ticks = common.Clock(self.device)
        processors = LogitsProcessorList([StepClock(ticks)]) if clock else None
        extra = {"assistant_model": config["assistant_model"]} if "assistant_model" in config else {}
        common.sync(self.device)
        began = time.perf_counter()
        with torch.no_grad():  # as transformers itself; inference tensors and compiled static caches mix badly
            out = model.generate(
                input_ids=ids, attention_mask=mask, generation_config=gen, logits_processor=processors, **extra
            )
        common.sync(self.device)
        wall = time.perf_counter() - began
        tokens = out[:, ids.shape[1] :].tolist()
        if any(len(t) != n for t in tokens):
            raise RuntimeError(f"transformers generated {[len(t) for t in tokens][:4]} tokens, expected {n}")
        return {"wall": wall, "tokens": tokens, "intervals": ticks.intervals_ms()}

    def run_hf_rows(self, pair, hf_target, hf_draft, prompts, oracle) -> None:
        args = self.args
        n = args.new_tokens
        # Greedy, target only (dynamic cache, eager).
        if self.want("hf-greedy"):
            for batch in parse_ints(args.hf_batches):

                def greedy(b=batch) -> dict:
                    self.hf_generate(hf_target, b, prompts, min(8, n))  # warm-up
                    result = self.hf_generate(hf_target, b, prompts, n)
                    return hf_metrics(result, b, n, steps=n)

                self.run_system(pair, "hf-greedy", 0, batch, greedy, oracle)
        # Assisted generation, batch 1 (transformers supports no other).
        if self.want("hf-assisted"):
            self.run_system(
                pair,
                "hf-assisted",
                args.assist_k,
                1,
                lambda: self.measure_assisted(hf_target, hf_draft, prompts),
                oracle,
            )
        # Static cache + torch.compile (reduce-overhead): last, it is the slowest to set up.
        if self.want("hf-compile"):
            estimate = ESTIMATED_S["hf-compile"] if common.is_cuda(self.device) else 0.0
            self.run_system(
                pair,
                "hf-static-compile",
                0,
                1,
                lambda: self.measure_compiled(hf_target, prompts),
                oracle,
                estimate_s=estimate,
            )
        # Attach floors to every target-only / assisted row.
        target_cost, draft_cost = common.ModelCost.of(hf_target), common.ModelCost.of(hf_draft)
        with self.lock:
            for row in self.pair_results(pair)["rows"]:
                if row.get("status") == "ok" and "floor" not in row and row.get("ms_per_step"):
                    k = row.get("k") or 0
                    floor = self.floor(target_cost, draft_cost, k, row["batch"])
                    if floor:
                        row["floor"] = floor

    def measure_assisted(self, hf_target, hf_draft, prompts) -> dict:
        args = self.args
        n = args.new_tokens
        config = hf_draft.generation_config
        config.num_assistant_tokens = args.assist_k
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = 0.0  # 0 disables the early stop of drafting
        counts = {"target": 0, "draft": 0}
        # A mark after every target forward: prefill, then one verify per speculation step, so the
        # intervals are whole steps (drafting included), measured like every other row.
        clock = common.Clock(self.device)
        hooks = [
            hf_target.register_forward_pre_hook(lambda *_: counts.__setitem__("target", counts["target"] + 1)),
            hf_draft.register_forward_pre_hook(lambda *_: counts.__setitem__("draft", counts["draft"] + 1)),
        ]
        try:
            kwargs = dict(assistant_model=hf_draft, clock=False)
            self.hf_generate(hf_target, 1, prompts, min(8, n), **kwargs)  # warm-up
            counts.update(target=0, draft=0)
            hooks.append(hf_target.register_forward_hook(lambda *_: clock.mark()))
            result = self.hf_generate(hf_target, 1, prompts, n, **kwargs)
            forwards, drafts = counts["target"], counts["draft"]
        finally:
            for hook in hooks:
                hook.remove()
        intervals = clock.intervals_ms()
        return {
            "tokens_per_s": n / result["wall"],
            "ms_per_step": statistics.fmean(intervals) if intervals else result["wall"] / max(forwards, 1) * 1e3,
            "tokens_per_step": n / max(forwards, 1),
            "steps": forwards,
            "draft_forwards": drafts,
            "gen_wall_s": result["wall"],
            "outputs": result["tokens"],
        }

    def measure_compiled(self, hf_target, prompts) -> dict:
        """Static cache; transformers compiles the decode forward itself (reduce-overhead) on CUDA. If that
        does not happen, compile model.forward by hand. On CPU: static cache only (no compile)."""
        from transformers import CompileConfig

        n = self.args.new_tokens
        cuda = common.is_cuda(self.device)
        config = {"cache_implementation": "static"}
        note = None
        if cuda:
            config["compile_config"] = CompileConfig(fullgraph=False, mode="reduce-overhead")
        else:
            config["disable_compile"] = True
            note = "static cache, no compile (cpu)"
        manual = False
        graphs_before = dynamo_graph_count()
        try:
            began = time.perf_counter()
            self.hf_generate(hf_target, 1, prompts, n, **config)  # compile + CUDA-graph recording
            warm = time.perf_counter() - began
            compiled = hasattr(hf_target, "_compiled_call") or dynamo_graph_count() > graphs_before
            if cuda and not compiled:  # transformers did not auto-compile: do it by hand
                self.log("hf-static-compile: no auto-compile; compiling model.forward by hand")
                hf_target.forward = torch.compile(hf_target.forward, mode="reduce-overhead", fullgraph=False)
                manual = True
                config.pop("compile_config")
                config["disable_compile"] = True
                began = time.perf_counter()
                self.hf_generate(hf_target, 1, prompts, n, **config)
                warm += time.perf_counter() - began
                compiled = True
            result = self.hf_generate(hf_target, 1, prompts, n, **config)
        finally:
            if manual:
                with contextlib.suppress(Exception):
                    del hf_target.forward
        metrics = hf_metrics(result, 1, n, steps=n)
        metrics.update(
            compile_s=warm,
            compiled=bool(cuda and compiled),
            manual_compile=manual,
            dynamo_graphs=dynamo_graph_count() - graphs_before,
        )
        if note:
            metrics["note"] = note
        return metrics

    # ---------------------------------------------------------------------------------------------
    # Floor rows
    # ---------------------------------------------------------------------------------------------

    def add_floor_rows(self, pair, target_cost, draft_cost, grid) -> None:
        rows = self.pair_results(pair)["rows"]
        spec = {r["batch"]: r for r in rows if r["system"] == "graphspec" and r.get("k") == 4 and r["status"] == "ok"}
        batches = sorted({b for k, b in grid if k == 4})
        for batch in batches:
            floor = self.floor(target_cost, draft_cost, 4, batch)
            if not floor:
                continue
            tps = spec[batch]["tokens_per_step"] if batch in spec else 1.0
            self.add_row(
                pair,
                {
                    "pair": pair,
                    "system": "floor (spec)",
                    "k": 4,
                    "batch": batch,
                    "status": "ok",
                    "ms_per_step": floor["ms"],
                    "tokens_per_step": tps,
                    "tokens_per_s": batch * tps / floor["ms"] * 1e3,
                    "floor": floor,
                    "check": {"status": "n/a", "summary": "bytes/BW, FLOPs/rate"},
                },
            )
        for batch in sorted({r["batch"] for r in rows if r.get("k") == 0 and r["status"] == "ok"}):
            floor = self.floor(target_cost, draft_cost, 0, batch)
            if floor:
                self.add_row(
                    pair,
                    {
                        "pair": pair,
                        "system": "floor (target)",
                        "k": 0,
                        "batch": batch,
                        "status": "ok",
                        "ms_per_step": floor["ms"],
                        "tokens_per_step": 1.0,
                        "tokens_per_s": batch / floor["ms"] * 1e3,
                        "floor": floor,
                        "check": {"status": "n/a", "summary": "bytes/BW, FLOPs/rate"},
                    },
                )

    # ---------------------------------------------------------------------------------------------
    # Output
    # ---------------------------------------------------------------------------------------------

    def remove_checkpoints(self) -> None:
        import shutil

        while self.checkpoint_dirs:
            shutil.rmtree(self.checkpoint_dirs.pop(), ignore_errors=True)

    def finish(self, reason: str = "complete") -> str:
        """Write JSON and plot, return the text block that is printed last."""
        with self.lock:
            if reason == "complete":
                self.results["meta"]["complete"] = True
            self.results["meta"]["end_reason"] = reason
            self.results["meta"]["total_s"] = elapsed()
        data = self.snapshot()
        add_ratios(data)
        text = render(data)
        try:
            png = plot(data, self.out_dir / "bench_systems.png")
            data["meta"]["plot"] = str(png) if png else None
        except Exception as error:
            data["meta"]["plot_error"] = short_error(error)
        self.write_json(data)
        (self.out_dir / "bench_systems.txt").write_text(text + "\n")
        return text


def StepClock(clock: common.Clock):  # noqa: N802 - builds an instance of a transformers subclass
    """A logits processor that only marks the time: transformers calls it once per generated token."""
    from transformers import LogitsProcessor

    class _StepClock(LogitsProcessor):
        def __call__(self, input_ids, scores):
            clock.mark()
            return scores

    return _StepClock()


def dynamo_graph_count() -> int:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return 0


def hf_metrics(result: dict, batch: int, n: int, steps: int) -> dict:
    intervals = result["intervals"]  # n - 1 decode forwards between consecutive tokens
    step_ms = statistics.fmean(intervals) if intervals else result["wall"] / steps * 1e3
    return {
        "tokens_per_s": batch * n / result["wall"],
        "ms_per_step": step_ms,
        "median_step_ms": statistics.median(intervals) if intervals else None,
        "tokens_per_step": 1.0,
        "steps": steps,
        "gen_wall_s": result["wall"],
        "outputs": result["tokens"],
    }


def describe_row(row: dict) -> str:
    if row.get("status") != "ok":
        return f"{row.get('status')}: {row.get('error', '')}"
    parts = []
    if row.get("tokens_per_s") is not None:
        parts.append(f"{row['tokens_per_s']:.1f} tok/s")
    if row.get("ms_per_step") is not None:
        parts.append(f"{row['ms_per_step']:.2f} ms/step")
    if row.get("tokens_per_step") is not None:
        parts.append(f"{row['tokens_per_step']:.2f} tok/step")
    if row.get("check"):
        parts.append(row["check"].get("summary", ""))
    return ", ".join(parts)


ALPHA = 0.7  # acceptance probability per draft token for the projection line
ALPHAS = (0.5, ALPHA, 0.9)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Chain drafting, i.i.d. acceptance alpha per token: E[accepted + 1] = (1 - alpha^(K+1)) / (1 - alpha)."""
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def add_ratios(data: dict) -> None:
    """tokens/s relative to graphspec K=4 at the same batch (and pair); floor share; acceptance projections."""
    for info in data["pairs"].values():
        for row in info["rows"]:
            speculative = row["system"] in ("graphspec", "hf-assisted") and row.get("k")
            if row["status"] == "ok" and speculative and row.get("ms_per_step"):
                row["projected_tokens_per_s"] = {
                    str(a): row["batch"] * expected_tokens_per_step(a, row["k"]) / row["ms_per_step"] * 1e3
                    for a in ALPHAS
                }
        base = {
            r["batch"]: r["tokens_per_s"]
            for r in info["rows"]
            if r["system"] == "graphspec" and r.get("k") == 4 and r["status"] == "ok" and r.get("tokens_per_s")
        }
        for row in info["rows"]:
            if row["status"] == "ok" and row.get("tokens_per_s") and row["batch"] in base:
                row["ratio_vs_gs_k4"] = row["tokens_per_s"] / base[row["batch"]]
            if row["status"] == "ok" and row.get("floor") and row.get("ms_per_step"):
                row["floor_pct"] = 100.0 * row["floor"]["ms"] / row["ms_per_step"]


TABLE_ORDER = (
    "graphspec",
    "graphspec-selfdraft",
    "graphspec-target-only",
    "graphspec-reference-eager",
    "hf-greedy",
    "hf-static-compile",
    "hf-assisted",
    "floor (spec)",
    "floor (target)",
)


def table_order(row: dict) -> tuple:
    system = row.get("system")
    rank = TABLE_ORDER.index(system) if system in TABLE_ORDER else len(TABLE_ORDER)
    return (rank, row.get("k") or 0, row.get("batch") or 0)


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(data: dict) -> str:
    lines = []
    meta, ceilings = data["meta"], data.get("ceilings", {})
    lines.append(
        f"== graphspec vs alternatives: {meta['device']}, torch {meta['torch']}, transformers "
        f"{meta.get('transformers', '?')}, {data['args']['dtype']}, prompt {data['args']['prompt_len']}, "
        f"{data['args']['new_tokens']} new tokens, greedy; {meta.get('end_reason', '')} after {meta['elapsed_s']:.0f}s"
    )
    if "copy" in ceilings:
        extra = f", matmul {ceilings['matmul']['tflops']:.0f} TFLOP/s" if "matmul" in ceilings else ""
        lines.append(f"ceilings: copy {ceilings['copy']['gb_s']:.0f} GB/s (read+write){extra}")
    for pair, info in data["pairs"].items():
        rows = info["rows"]
        oracle = info.get("oracle") or {}
        if oracle:
            lines.append(
                f"[{pair}] oracle: target-only greedy at batch {oracle.get('batch')}; "
                f"{100 * oracle.get('near_tie_fraction', 0):.2f}% of positions are near-ties "
                f"(top-2 within margin); oracle token = teacher-forced argmax at "
                f"{100 * oracle.get('oracle_is_argmax_fraction', 0):.2f}%"
            )
        for row in rows:
            if row["system"].startswith("graphspec") and row["batch"] == 1 and row.get("floor") and row.get("k"):
                f, step = row["floor"], row["ms_per_step"]
                spread = row.get("step_ms_spread")
                lines.append(
                    f"[{pair}] {row['system']} K={row['k']} B=1: step {step:.2f} ms = {step / f['ms']:.2f}x the floor "
                    f"{f['ms']:.2f} ms ({f['bytes'] / 1e9:.2f} GB over copy BW {f['bw_ms']:.2f} ms; FLOPs "
                    f"{f['flop_ms']:.3f} ms)" + (f"; run-to-run spread {100 * spread:.1f}%" if spread else "")
                )
        projected = [
            f"{r['system']} K={r['k']}: {r['projected_tokens_per_s'][str(ALPHA)]:.0f}"
            for r in sorted(rows, key=table_order)
            if r["batch"] == 1 and r.get("projected_tokens_per_s") and r["system"] != "graphspec-selfdraft"
        ]
        projected += [
            f"{r['system']}: {1e3 / r['ms_per_step']:.0f}"
            for r in sorted(rows, key=table_order)
            if r["batch"] == 1
            and r["status"] == "ok"
            and r.get("k") == 0
            and r.get("ms_per_step")
            and not r["system"].startswith("floor")
        ]
        if projected:
            lines.append(
                f"[{pair}] B=1 tok/s projected at per-token acceptance {ALPHA} (same step times; step time does "
                f"not depend on acceptance): " + ", ".join(projected)
            )
        for region in info.get("regions", []):
            if "draft_ms" in region:
                step, marked, host = region["step_ms"], region["marked_ms"], region.get("host_ms")
                shares = ", ".join(
                    f"{name} {region[f'{name}_ms']:.2f} ms ({100 * region[f'{name}_ms'] / marked:.0f}%)"
                    for name in ("draft", "verify", "accept")
                )
                lines.append(
                    f"[{pair}] regions K={region['k']} B={region['batch']} ({region['mode']} step, "
                    f"{region['clock']}, ctx {region['context']}): {shares}; in-step total "
                    f"{marked:.2f} ms vs plain step {step:.2f} ms"
                    + (
                        f"; host {host:.2f} ms of generate()'s {region['wall_ms_per_step']:.2f} ms per step"
                        if host is not None
                        else ""
                    )
                )
        for note in info.get("notes", []):
            lines.append(f"[{pair}] note: {note}")
    for pair, info in data["pairs"].items():
        lines.append("")
        lines.append(f"[{pair}] {info['models'].get('target')} + draft {info['models'].get('draft')}")
        header = ("system", "K", "B", "tok/s", "ms/step", "tok/step", "vs gs K4", "%floor", "check")
        table = [header]
        for row in sorted(info["rows"], key=table_order):
            k = "-" if not row.get("k") else str(row["k"])
            if row["status"] != "ok":
                table.append(
                    (
                        row["system"],
                        k,
                        str(row["batch"]),
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        f"{row['status'].upper()}: {row.get('error', '')[:90]}",
                    )
                )
                continue
            table.append(
                (
                    row["system"],
                    k,
                    str(row["batch"]),
                    fmt(row.get("tokens_per_s"), ".1f"),
                    fmt(row.get("ms_per_step"), ".2f"),
                    fmt(row.get("tokens_per_step"), ".2f"),
                    fmt(row.get("ratio_vs_gs_k4"), ".2f"),
                    fmt(row.get("floor_pct"), ".0f"),
                    (row.get("check") or {}).get("summary", "-") + (f" [{row['note']}]" if row.get("note") else ""),
                )
            )
        widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
        for r in table:
            cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r[:-1], widths, strict=True))]
            lines.append("  ".join(cells) + "  " + r[-1])
    return "\n".join(lines)


def plot(data: dict, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = [p for p, info in data["pairs"].items() if info["rows"]]
    if not pairs:
        return None
    fig, axes = plt.subplots(len(pairs), 2, figsize=(13, 4.8 * len(pairs)), squeeze=False)
    for index, pair in enumerate(pairs):
        series: dict[str, list[tuple[int, float, float]]] = {}
        for row in data["pairs"][pair]["rows"]:
            if row["status"] != "ok" or not row.get("tokens_per_s") or not row.get("ms_per_step"):
                continue
            label = row["system"] + (f" K={row['k']}" if row.get("k") else "")
            series.setdefault(label, []).append((row["batch"], row["tokens_per_s"], row["ms_per_step"]))
        for label, points in sorted(series.items()):
            points.sort()
            xs = [p[0] for p in points]
            style = "--" if label.startswith("floor") else "-"
            axes[index][0].plot(xs, [p[1] for p in points], style, marker="o", label=label)
            axes[index][1].plot(xs, [p[2] for p in points], style, marker="o", label=label)
        batches = sorted({p[0] for points in series.values() for p in points})
        for column, ylabel in enumerate(("tokens/s (all rows)", "ms per step / target forward")):
            ax = axes[index][column]
            ax.set_xscale("log", base=2)
            if batches:
                ax.set_xticks(batches, [str(b) for b in batches])
            ax.set_yscale("log")
            ax.set_xlabel("batch size")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{pair}: {data['pairs'][pair]['models'].get('target')} ({data['meta']['device']})")
            ax.grid(True, which="both", alpha=0.3)
        axes[index][1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_systems",
        description="graphspec vs transformers (greedy, static+compile, assisted) and the bandwidth floor, "
        "on random-weight real-shape models, in one process.",
    )
    parser.add_argument("--small", action="store_true", help="tiny models on CPU in fp32, few tokens (smoke test)")
    parser.add_argument("--out-dir", default=None, help="default: $OUT if set, else ./bench_out")
    parser.add_argument("--pairs", default="llama", help="comma list of: llama, qwen3 (default llama)")
    parser.add_argument("--device", default=None, help="default cuda (cpu with --small)")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default bfloat16 (float32 with --small)")
    parser.add_argument(
        "--grid",
        default=None,
        help="graphspec K:B entries, default 2/4/6:1/4/16/64; K1/K2:B1/B2 expands to the product",
    )
    parser.add_argument(
        "--ref-batches", default=None, help="eager reference decoder batches besides the oracle's (default none)"
    )
    parser.add_argument(
        "--target-batches", default=None, help="graphspec target-only (compiled) batches (default 1,16,64)"
    )
    parser.add_argument("--hf-batches", default=None, help="transformers greedy batches (default 1,16)")
    parser.add_argument("--selfdraft-k", type=int, default=4)
    parser.add_argument("--assist-k", type=int, default=4, help="num_assistant_tokens for assisted generation")
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--max-seq-len", type=int, default=None)
    parser.add_argument("--warmup-tokens", type=int, default=None)
    parser.add_argument("--region-reps", type=int, default=None, help="timed runs of the step instrumented per region")
    parser.add_argument("--repeats", type=int, default=1, help="timed graphspec runs per point (median kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--systems", default="all", help=f"comma list of {','.join(SYSTEMS)} (default all)")
    parser.add_argument("--skip-systems", default="", help="comma list of systems to leave out")
    parser.add_argument("--margin-rel", type=float, default=1e-3, help="benign divergence: gap <= rel*|top logit|")
    parser.add_argument("--margin-ulps", type=float, default=2.0, help="... or gap <= this many ulps of the dtype")
    parser.add_argument("--budget-s", type=float, default=None, help="optional systems start only if they fit")
    parser.add_argument("--hard-deadline-s", type=float, default=None, help="print what exists and exit at this time")
    parser.add_argument(
        "--ckpt-dir",
        default=None,
        help="where to write the random checkpoints (default /dev/shm if it has room, else the temp dir)",
    )
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--inject-failure", default="", help=argparse.SUPPRESS)  # tests: SYSTEM or SYSTEM@BATCH
    return parser


def resolve_args(argv: list[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    defaults = SMALL_DEFAULTS if args.small else FULL_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.out_dir is None:
        args.out_dir = os.environ.get("OUT") or "bench_out"
    parse_grid(args.grid)  # validate early
    pairs = [p for p in args.pairs.split(",") if p]
    unknown = [p for p in pairs if p not in common.PAIRS]
    if unknown:
        raise SystemExit(f"unknown pair(s) {unknown}; choose from {', '.join(common.PAIRS)}")
    unknown = [s for s in (args.systems.split(",") if args.systems != "all" else []) if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
    if common.is_cuda(args.device) and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available here; use --small (CPU) or --device cpu")
    return args


def main(argv: list[str] | None = None) -> int:
    args = resolve_args(argv)
    with contextlib.suppress(Exception):
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(args.seed)
    bench = Bench(args)
    bench.log(f"device {bench.results['meta']['device']}; out {bench.out_dir}; args {vars(args)}")

    done = threading.Event()

    def on_deadline() -> None:
        if done.is_set():
            return
        bench.log(f"hard deadline {args.hard_deadline_s:.0f}s reached during {bench.current}; writing what exists")
        try:
            text = bench.finish(f"stopped at the hard deadline during {bench.current}")
            print(text, flush=True)
        finally:
            if not args.keep_checkpoints:
                bench.remove_checkpoints()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)

    watchdog = None
    if args.hard_deadline_s < 1e8:
        watchdog = threading.Timer(max(1.0, args.hard_deadline_s - elapsed()), on_deadline)
        watchdog.daemon = True
        watchdog.start()
    try:
        bench.measure_ceilings()
        for index, pair in enumerate(p for p in args.pairs.split(",") if p):
            if index and elapsed() + ESTIMATED_S["pair"] > args.budget_s:
                bench.log(f"skip pair {pair}: time budget")
                bench.pair_results(pair)["notes"].append("skipped: time budget")
                continue
            bench.run_pair(pair)
        text = bench.finish()
    finally:
        done.set()
        if watchdog:
            watchdog.cancel()
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
