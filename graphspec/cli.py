"""`graphspec compile | generate | inspect`: parse flags, call compile()/Runtime, say where things went.

User errors (any GraphspecError, bad flags, missing paths) print one `error: ...` line on stderr and
exit with 2 (flags) or 1 (everything else), never with a traceback. A traceback means a graphspec bug.

Building the parser, --help and a refused command line import neither torch nor transformers (seconds):
the module imports only light modules, and each command imports what it runs inside its function.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import graphspec
from graphspec.config import DEFAULT_PREFILL_TOKENS, FOLD_NORMS, MAX_K, NUMERICS, SAMPLING_MODES
from graphspec.cublas import use_no_workspace
from graphspec.drafter_kinds import DEFAULT_NGRAM, KINDS, NAMED_KINDS
from graphspec.errors import ArtifactError, GraphspecError

if TYPE_CHECKING:
    from graphspec.compiled import Compiled

API_KEY_VARIABLE = "GRAPHSPEC_API_KEY"  # `graphspec serve --api-key`'s default

EXAMPLES = """\
examples:
  graphspec compile ./Llama-3.1-8B-Instruct --draft ./Llama-3.2-1B-Instruct \\
      -k 4 --batch-sizes 1,2,4,8 --out llama8b.gs
  graphspec generate llama8b.gs --prompt "The capital of France is" --max-new-tokens 32 --stream
  graphspec inspect llama8b.gs

TARGET and DRAFT are local Hugging Face checkpoint directories (config.json + *.safetensors).
"""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show a flag's default only when it has one worth reading (not None/False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, []) or action.default == argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action)


class UsageError(Exception):
    """A bad command line: reported as one `error:` line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse prints usage plus an error and exits; we want one line and no SystemExit inside main."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


# --------------------------------------------------------------------------------------------------
# Argument types: each rejects bad input with a message that shows the expected form.
# --------------------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def draft_length(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()) or not 1 <= int(text) <= MAX_K:
        raise argparse.ArgumentTypeError(f"expected an integer between 1 and {MAX_K}, got {text!r}")
    return int(text)


def port_number(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()) or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port between 1 and 65535, got {text!r}")
    return int(text)


def non_negative_int(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def batch_sizes(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    if not all(re.fullmatch(r"\d+", part) and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas (1,2,4,8), got {text!r}")
    return tuple(int(part) for part in parts)


def bucket_ks(text: str) -> list[tuple[int, int]]:
    """BUCKET:K pairs (16:2,64:1), as written: whether the buckets and Ks fit (a bucket named twice
    included, which a dict would drop silently) is compile()'s check (SpecConfig)."""
    pairs = [part.strip().split(":") for part in text.split(",")]
    if not all(len(pair) == 2 and all(re.fullmatch(r"\d+", x.strip()) for x in pair) for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected BUCKET:K pairs separated by commas (16:2,64:1), got {text!r}")
    return [(int(bucket), int(k)) for bucket, k in pairs]


def token_ids(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",")]
    if not all(re.fullmatch(r"\d+", part) for part in parts):
        raise argparse.ArgumentTypeError(f"expected token ids (integers >= 0) separated by commas, got {text!r}")
    return [int(part) for part in parts]


def stop_ids(text: str) -> list[int]:
    """Token ids like token_ids, or `none` for no stop tokens at all."""
    if text.strip().lower() == "none":
        return []
    try:
        return token_ids(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected token ids (integers >= 0) separated by commas, or none, got {text!r}"
        ) from None


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def device(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def modes(text: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(","))
    if not all(mode in SAMPLING_MODES for mode in chosen):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {','.join(SAMPLING_MODES)}, got {text!r}"
        )
    return chosen


def pass_names(text: str) -> list[str]:
    from graphspec.pipeline import PASS_NAMES  # the pass modules import torch: only when the flag is given

    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in PASS_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown pass {text!r}; passes are: {', '.join(PASS_NAMES)}")
    return names


def pass_name(text: str) -> str:
    from graphspec.pipeline import PASS_NAMES

    if text not in PASS_NAMES:
        raise argparse.ArgumentTypeError(f"unknown pass {text!r}; passes are: {', '.join(PASS_NAMES)}")
    return text


# --------------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------------


def build_parser() -> Parser:
    parser = Parser(
        prog="graphspec",
        description="Speculative decoding as a compiler: compile a target + draft model pair into one "
        "step graph per batch bucket, then generate from the compiled artifact.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"graphspec {graphspec.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True

    compile_parser = commands.add_parser(
        "compile",
        help="trace and compile a target + draft pair into a serving artifact",
        description="Load TARGET and DRAFT, trace the speculation step for every batch bucket and sampling "
        "mode, run the pass pipeline, and write a self-describing artifact directory (--out) that "
        "`graphspec generate` and Runtime.load() use. --dump-dir writes the graph after every pass; "
        "--stop-after/--skip bisect a miscompile.",
        formatter_class=HelpFormatter,
    )
    compile_parser.add_argument("target", metavar="TARGET", nargs="?", help="target checkpoint directory")
    compile_parser.add_argument(
        "--draft",
        metavar="DRAFT",
        help="draft checkpoint directory (same vocabulary), a head directory (EAGLE-3 or MTP NextN, kind read "
        "from its config), 'ngram' (prompt lookup: no model) or 'mtp' (the target checkpoint's own MTP head)",
    )
    compile_parser.add_argument(
        "--drafter", choices=sorted(KINDS), default=None, help="drafter kind, when DRAFT alone does not say it"
    )
    compile_parser.add_argument(
        "--ngram-min",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"n-gram drafter: shortest match (default {DEFAULT_NGRAM[0]})",
    )
    compile_parser.add_argument(
        "--ngram-max",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"n-gram drafter: longest match (default {DEFAULT_NGRAM[1]})",
    )
    compile_parser.add_argument(
        "--token-map",
        default=None,
        metavar="FILE",
        help="MTP, EAGLE-3 and DFlash drafters: draft over only the target ids in FILE (a reduced lm_head: "
        "faster drafts, slightly lower acceptance); write one with `graphspec token-map`",
    )
    compile_parser.add_argument("-k", type=draft_length, default=4, help="draft tokens proposed per step")
    compile_parser.add_argument(
        "--k-by-bucket",
        type=bucket_ks,
        default=None,
        metavar="B:K,...",
        help="fewer drafts per step in these buckets (e.g. 64:1): a large batch makes the verify of K+1 tokens "
        "per row compute-bound; the other buckets draft -k",
    )
    compile_parser.add_argument(
        "--batch-sizes",
        type=batch_sizes,
        default="1",  # argparse runs string defaults through `type`; a string reads well in --help
        metavar="B1,B2,...",
        help="batch-size buckets, one compiled graph each; a batch runs in the smallest bucket that holds it",
    )
    compile_parser.add_argument(
        "--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16", help="weights and compute"
    )
    compile_parser.add_argument("--device", type=device, default="cuda", help="cpu, cuda or cuda:N")
    compile_parser.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        metavar="N",
        help="KV-cache length per row: prompt + new tokens + k + 1 must fit; default: the models' "
        "max_position_embeddings, capped so the caches take at most 30%% of GPU memory (4 GiB on the CPU)",
    )
    compile_parser.add_argument(
        "--prefill-tokens",
        type=positive_int,
        default=DEFAULT_PREFILL_TOKENS,
        metavar="N",
        help="prompt tokens per prefill chunk over a whole bucket (each bucket's chunk: the largest divisor "
        "of --max-seq-len within N / bucket positions per row)",
    )
    compile_parser.add_argument(
        "--capture",
        choices=("auto", "full", "piecewise", "none"),
        default="auto",
        help="CUDA-graph capture: whole step, pieces between attention, or none",
    )
    compile_parser.add_argument(
        "--lowering", choices=("auto", "reference"), default="auto", help="reference: keep torch reference ops"
    )
    compile_parser.add_argument(
        "--numerics",
        choices=NUMERICS,
        default="default",
        help="invariant: row-invariant kernels (greedy, CUDA), so speculation changes no token of the target's "
        "own output; default: the fastest kernels",
    )
    compile_parser.add_argument(
        "--fold-norms",
        choices=tuple(FOLD_NORMS),
        default="auto",
        help="fold each layer's norm weights into the projections they feed (up to two launches fewer per "
        "layer); auto: on CUDA under default numerics",
    )
    compile_parser.add_argument(
        "--modes",
        type=modes,
        default=",".join(SAMPLING_MODES),
        metavar="MODES",
        help="sampling modes to compile: greedy (temperature 0), sample, or both",
    )
    compile_parser.add_argument("--out", metavar="ART", help="artifact directory to write (replaced if it exists)")
    compile_parser.add_argument(
        "--reference-weights",
        action="store_true",
        help="reference the checkpoints by absolute path + sha256 instead of copying them into ART",
    )
    compile_parser.add_argument(
        "--dump-dir", metavar="D", help="write D/<graph>/NN_<pass>.py (+ .diff), summary.md and kernels.txt"
    )
    compile_parser.add_argument(
        "--list-passes", action="store_true", help="print the pass pipeline in order and exit (no TARGET needed)"
    )
    compile_parser.add_argument(
        "--stop-after", type=pass_name, metavar="PASS", help="run the pipeline up to and including PASS"
    )
    compile_parser.add_argument(
        "--skip",
        type=pass_names,
        action="append",
        default=[],
        metavar="PASS[,PASS]",
        help="leave PASS out of the pipeline (repeat the flag or separate names with commas)",
    )
    compile_parser.add_argument("-v", "--verbose", action="store_true", help="also log one line per pass run")
    compile_parser.set_defaults(run=run_compile, subparser=compile_parser)

    generate_parser = commands.add_parser(
        "generate",
        help="generate from a compiled artifact",
        description="Load the artifact ART (verified: versions, GPU, sha256 of every file) and generate. "
        "Prints the text (token ids when the target has no tokenizer, or with --ids) on stdout and a stats "
        "line on stderr. Several --prompt/--prompt-ids run as one batch.",
        formatter_class=HelpFormatter,
    )
    generate_parser.add_argument("artifact", metavar="ART", help="artifact directory written by `graphspec compile`")
    prompts = generate_parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompt", action="append", metavar="TEXT", help="a text prompt (repeat for a batch)")
    prompts.add_argument(
        "--prompt-ids",
        type=token_ids,
        action="append",
        metavar="ID,ID,...",
        help="a prompt as token ids, e.g. 1,2,3 (repeat for a batch)",
    )
    generate_parser.add_argument(
        "--max-new-tokens", type=positive_int, default=64, metavar="N", help="tokens to generate per prompt at most"
    )
    generate_parser.add_argument(
        "--temperature", type=non_negative_float, default=0.0, metavar="T", help="0 = greedy (exact)"
    )
    generate_parser.add_argument("--top-k", type=non_negative_int, default=None, metavar="K", help="0 = off")
    generate_parser.add_argument("--top-p", type=probability, default=None, metavar="P", help="nucleus mass, (0, 1]")
    generate_parser.add_argument("--seed", type=non_negative_int, default=None, metavar="S", help="sampling seed")
    generate_parser.add_argument(
        "--stop-ids",
        type=stop_ids,
        default=None,
        metavar="ID,ID,...",
        help="stop tokens; default: the EOS ids; `none`: no stop tokens (always max-new-tokens)",
    )
    generate_parser.add_argument("--ids", action="store_true", help="print token ids even when there is a tokenizer")
    generate_parser.add_argument("--stream", action="store_true", help="print tokens as they are committed")
    generate_parser.add_argument(
        "--compile-cpu",
        action="store_true",
        help="on the CPU, run each step through torch.compile (Inductor): the first step of each batch bucket "
        "compiles it (counted in the stats line), later ones run about 1.5x faster; pays off for long generations",
    )
    generate_parser.add_argument(
        "--cpu-draft-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="on the CPU (a float32 artifact), the drafter multiplies bfloat16 copies of its own weights: cheaper "
        "drafts, the same output tokens (the target verifies in float32); default float32",
    )
    generate_parser.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="load an artifact compiled for another GPU or software version (a warning, not an error); "
        "changed files are still refused",
    )
    generate_parser.set_defaults(run=run_generate, subparser=generate_parser)

    inspect_parser = commands.add_parser(
        "inspect",
        help="summarize a compiled artifact",
        description="Print what ART holds: models, K, buckets, dtype, device/SM, versions, passes, kernels, "
        "files and sizes, and whether it matches this machine. Reads the manifest only.",
    )
    inspect_parser.add_argument("artifact", metavar="ART", help="artifact directory written by `graphspec compile`")
    inspect_parser.add_argument("--json", action="store_true", help="print manifest.json as is")
    inspect_parser.set_defaults(run=run_inspect, subparser=inspect_parser)

    token_map_parser = commands.add_parser(
        "token-map",
        help="write a token map (the most frequent target ids of a corpus) for a drafter's --token-map",
        description="Encode CORPUS (a text file, or a directory of them) with TARGET's tokenizer and write the "
        "--size most frequent token ids (ties by id; special and eos tokens always included) to OUT, a "
        "safetensors file with one int64 tensor hot_token_ids. `graphspec compile TARGET --draft mtp "
        "--token-map OUT` then drafts over those ids only.",
        formatter_class=HelpFormatter,
    )
    token_map_parser.add_argument("target", metavar="TARGET", help="target checkpoint directory (its tokenizer)")
    token_map_parser.add_argument("corpus", metavar="CORPUS", help="a text file, or a directory of text files")
    token_map_parser.add_argument("--size", type=positive_int, required=True, metavar="N", help="ids in the map")
    token_map_parser.add_argument("--out", required=True, metavar="FILE", help="the token-map file to write")
    token_map_parser.set_defaults(run=run_token_map, subparser=token_map_parser)

    serve_parser = commands.add_parser(
        "serve",
        help="serve a compiled artifact over an OpenAI-compatible HTTP API",
        description="Load ART and serve /v1/completions, /v1/chat/completions (SSE streaming), /v1/models, "
        "/tokenize, /detokenize, /health and /metrics (Prometheus) with continuous batching. Needs the `serve` extra: "
        "pip install 'graphspec[serve]'.",
        formatter_class=HelpFormatter,
    )
    serve_parser.add_argument("artifact", metavar="ART", help="artifact directory written by `graphspec compile`")
    serve_parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve_parser.add_argument("--port", type=port_number, default=8000, help="port to listen on")
    serve_parser.add_argument(
        "--model-name", default=None, metavar="NAME", help="the model id clients send (default: ART's directory name)"
    )
    serve_parser.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template file; default: the tokenizer's, else `role: content` lines (serve/chat.py)",
    )
    serve_parser.add_argument(
        "--channels",
        default=None,
        metavar="THINK_START,THINK_END,TOOL_START,TOOL_END",
        help="split chat output into reasoning_content, content and tool_calls at these markers; `default` means "
        "<think>,</think>,<tool_call>,</tool_call>",
    )
    serve_parser.add_argument(
        "--starts-in-reasoning",
        action="store_true",
        help="with --channels: the chat template opens the think block itself (output starts as reasoning)",
    )
    serve_parser.add_argument(
        "--compile-cpu",
        action="store_true",
        help="on the CPU, compile every step with torch.compile (Inductor) at start-up, before the first request: "
        "steps run about 1.5x faster; each (mode, bucket) step takes 15-60 s to compile the first time (cached on "
        "disk afterwards)",
    )
    serve_parser.add_argument(
        "--cpu-draft-dtype", choices=("float32", "bfloat16"), default="float32", help="as for `graphspec generate`"
    )
    serve_parser.add_argument("--allow-mismatch", action="store_true", help="as for `graphspec generate`")
    serve_parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_VARIABLE),
        metavar="KEY",
        help=f"require `Authorization: Bearer KEY` on every request but /health and /metrics; default: "
        f"${API_KEY_VARIABLE}, which keeps the key out of the process list",
    )
    serve_parser.set_defaults(run=run_serve, subparser=serve_parser)
    return parser


# --------------------------------------------------------------------------------------------------
# compile
# --------------------------------------------------------------------------------------------------


class Progress:
    """Elapsed-time progress lines on stderr; on a terminal each line replaces the previous one.
    Tracing messages are numbered against the number of graphs, so a long compile shows how far it is."""

    def __init__(self, stream: TextIO, graphs: int | None) -> None:
        self.stream = stream
        self.start = time.perf_counter()
        self.tty = stream.isatty()
        self.graphs, self.traced = graphs, 0

    def __call__(self, message: str) -> None:
        if message.startswith("tracing "):
            self.traced += 1
            message = f"{message} (graph {self.traced}{'' if self.graphs is None else f'/{self.graphs}'})"
        line = f"[{time.perf_counter() - self.start:6.1f}s] {message}"
        self.stream.write(f"\r\x1b[K{line}" if self.tty else f"{line}\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()


def run_compile(args: argparse.Namespace) -> int:
    from graphspec.artifact import check_out
    from graphspec.pipeline import describe
    from graphspec.trace_prefill import chunk_sizes

    if args.list_passes:
        print(describe())
        return 0
    compile_parser = args.subparser
    if args.target is None:
        compile_parser.error("the following arguments are required: TARGET")
    if args.draft is None:
        compile_parser.error("the following arguments are required: --draft")
    drafter_options = {
        name: value for name in ("ngram_min", "ngram_max", "token_map") if (value := getattr(args, name)) is not None
    }
    model_free = args.draft in NAMED_KINDS
    for flag, value in (("TARGET", args.target), ("--draft", args.draft)):
        if not (model_free and flag == "--draft") and not Path(value).is_dir():
            raise GraphspecError(f"{flag} {value}: no such checkpoint directory")
    if args.out is None and args.dump_dir is None:
        compile_parser.error("nothing to write: give --out ART (the artifact) and/or --dump-dir D (pass dumps)")
    skip = [name for names in args.skip for name in names]
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    # A step graph per (mode, bucket) and the prefill chunk programs of each bucket; without
    # --max-seq-len the chunk sizes are known only once compile has sized the context: no total.
    buckets, total = set(args.batch_sizes), None
    if args.max_seq_len is not None:
        sizes = [chunk_sizes(b, args.max_seq_len, args.prefill_tokens, args.device) for b in buckets]
        prefill = sum(len(chunks) for chunks in sizes)
        total = len(buckets) * len(set(args.modes)) + prefill
    if args.out is not None:
        check_out(args.out)  # refused before any work, as compile(out=...) would
    progress = Progress(sys.stderr, total)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")  # each warning once per place, as without catching
            compiled = graphspec.compile(
                args.target,
                args.draft,
                k=args.k,
                k_by_bucket=args.k_by_bucket,
                batch_sizes=args.batch_sizes,
                dtype=args.dtype,
                device=args.device,
                dump_dir=args.dump_dir,
                max_seq_len=args.max_seq_len,
                prefill_tokens=args.prefill_tokens,
                capture=args.capture,
                lowering=args.lowering,
                numerics=args.numerics,
                fold_norms=FOLD_NORMS[args.fold_norms],
                stop_after=args.stop_after,
                skip=skip,
                copy_weights=not args.reference_weights,
                modes=args.modes,
                on_progress=progress,
                drafter=args.drafter,
                **drafter_options,
            )
            if args.out is not None:
                save_warmed_up(compiled, args, progress)
    finally:
        progress.done()
    for warning in caught:  # e.g. a partial folder of an interrupted compile it could not remove
        print(f"warning: {warning.message}", file=sys.stderr)
    graphs = f"{len(compiled.graphs)} step graphs, {len(compiled.prefill_graphs)} prefill programs"
    if args.out:
        out = Path(args.out).absolute()
        size = sum(file.stat().st_size for file in out.rglob("*") if file.is_file())
        weights = "weights referenced by path" if args.reference_weights else "weights copied"
        print(f"artifact: {out} ({graphs}, {human_size(size)}, {weights})")
        print(f"  run it: graphspec generate {out} --prompt ...   inspect it: graphspec inspect {out}")
    if args.dump_dir:
        dumps = Path(args.dump_dir).absolute()
        print(f"dumps:    {dumps} (one folder per graph; start with {dumps}/<graph>/summary.md)")
        for name in sorted(compiled.records):
            print(f"  {dumps / name / 'summary.md'}")
    if args.stop_after or skip:
        partial = [f"stopped after {args.stop_after}"] if args.stop_after else []
        partial += [f"skipped {', '.join(skip)}"] if skip else []
        print(f"note: partial pipeline ({'; '.join(partial)}): for bisecting, not for serving", file=sys.stderr)
    return 0


def save_warmed_up(compiled: Compiled, args: argparse.Namespace, progress: Progress) -> None:
    """Write the artifact; on a GPU after a Runtime over it has warmed up, so that Triton has loaded or
    built every kernel of every program and the artifact carries them (loading it then builds none).
    A partial pipeline (--stop-after, --skip) is saved as it is: it is for bisecting, not serving."""
    from graphspec.artifact import save_artifact

    if compiled.config.device.startswith("cuda") and not (args.stop_after or any(args.skip)):
        from graphspec.runtime.runtime import Runtime

        progress("warming up a Runtime: Triton builds every kernel the artifact will carry")
        Runtime(compiled)
    progress(f"writing artifact {args.out}")
    save_artifact(compiled, args.out, copy_weights=not args.reference_weights)


# --------------------------------------------------------------------------------------------------
# token-map
# --------------------------------------------------------------------------------------------------


def run_token_map(args: argparse.Namespace) -> int:
    from graphspec.drafters.token_map import write_token_map
    from graphspec.hot_tokens import build_token_map

    where = Path(args.out).absolute()  # checked before the corpus is read
    if where.is_dir():
        raise UsageError(f"--out {args.out}: is a directory")
    if not where.parent.is_dir():
        raise UsageError(f"--out {args.out}: no directory {where.parent}")
    ids, facts = build_token_map(args.target, args.corpus, args.size)
    out = write_token_map(args.out, ids).absolute()
    short = " (all the corpus and the special tokens hold)" if len(ids) < args.size else ""
    print(
        f"token map: {out}: {len(ids)} of {facts['vocab_size']} ids{short}, covering "
        f"{facts['coverage_per_mille'] / 10:.1f}% of {facts['tokens']} tokens in {facts['files']} file(s)"
    )
    print(f"  use it: graphspec compile {args.target} --draft mtp --token-map {out} --out ART")
    return 0


# --------------------------------------------------------------------------------------------------
# generate
# --------------------------------------------------------------------------------------------------


def run_generate(args: argparse.Namespace) -> int:
    from graphspec.runtime.runtime import Runtime

    prompts: list[Any] = args.prompt if args.prompt is not None else args.prompt_ids
    if args.stream and len(prompts) > 1:
        args.subparser.error("--stream takes one prompt (give one --prompt or --prompt-ids)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # One call uses one or two of the artifact's buckets: with --compile-cpu those compile on their first
        # step instead of every (mode, bucket) step at load, as a server's start-up does.
        runtime = Runtime.load(
            args.artifact,
            allow_mismatch=args.allow_mismatch,
            compile_cpu=args.compile_cpu,
            warm_up=not args.compile_cpu,
            cpu_draft_dtype=args.cpu_draft_dtype,
        )
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    options = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_token_ids=args.stop_ids,
    )
    show_ids = args.ids or runtime.tokenizer is None
    start = time.perf_counter()
    if args.stream:
        results = [stream_one(runtime, prompts, options, show_ids)]
    else:
        results = runtime.generate(prompts, **options)
        for index, result in enumerate(results):
            prefix = f"[{index}] " if len(results) > 1 else ""
            print(prefix + (format_ids(result.token_ids) if show_ids else (result.text or "")))
    seconds = time.perf_counter() - start
    print(stats_line(runtime, results, seconds), file=sys.stderr)
    return 0


def stream_one(runtime: Any, prompts: list[Any], options: dict[str, Any], show_ids: bool) -> Any:
    """Print one prompt's tokens as they are committed; return its GenerationResult."""
    from graphspec.runtime.runtime import GenerationResult

    emitted: list[int] = []
    shown = ""
    for _, item in runtime.stream(prompts, **options):
        if isinstance(item, GenerationResult):
            sys.stdout.write("\n")
            sys.stdout.flush()
            return item
        emitted.append(item)
        if show_ids:
            sys.stdout.write(("," if len(emitted) > 1 else "") + str(item))
        else:
            # Decode the whole prefix: a token can complete a multi-byte character of the one before.
            text = runtime.tokenizer.decode(emitted)
            sys.stdout.write(text[len(shown) :] if text.startswith(shown) else text)
            shown = text
        sys.stdout.flush()
    raise RuntimeError("the runtime's stream ended without a result")


def format_ids(ids: Sequence[int]) -> str:
    """Comma-separated, the form --prompt-ids reads back."""
    return ",".join(map(str, ids))


def stats_line(runtime: Any, results: Sequence[Any], seconds: float) -> str:
    stats = runtime.stats
    tokens = sum(len(result.token_ids) for result in results)
    rate = tokens / seconds if seconds > 0 else 0.0
    by_position = " ".join(f"{p:.2f}" for p in stats.acceptance_by_position)
    return (
        f"stats: {tokens} tokens in {seconds:.2f} s ({rate:.1f} tokens/s); {stats.steps} row-steps, "
        f"mean accepted {stats.mean_accepted:.2f} of k={stats.k} ({stats.mean_tokens_per_step:.2f} tokens/step); "
        f"acceptance by draft position: {by_position}"
    )


# --------------------------------------------------------------------------------------------------
# serve
# --------------------------------------------------------------------------------------------------


def run_serve(args: argparse.Namespace) -> int:
    try:
        from graphspec.serve import serve
        from graphspec.serve.channels import Markers
    except ImportError as error:
        raise UsageError(f"`graphspec serve` needs the serve extra ({error}); pip install 'graphspec[serve]'") from None
    markers = None
    if args.channels is not None:
        names = "<think>,</think>,<tool_call>,</tool_call>" if args.channels == "default" else args.channels
        parts = names.split(",")
        if len(parts) != 4 or not all(parts):
            raise UsageError(f"--channels takes four non-empty markers separated by commas, got {args.channels!r}")
        markers = Markers(*parts, starts_in_reasoning=args.starts_in_reasoning)
    template = Path(args.chat_template).read_text() if args.chat_template else None
    runtime_options = {"compile_cpu": args.compile_cpu, "cpu_draft_dtype": args.cpu_draft_dtype}
    if args.api_key is not None and not args.api_key.strip():
        raise UsageError(f"--api-key (or ${API_KEY_VARIABLE}) is empty; leave it unset to serve without a key")
    serve(
        args.artifact, args.host, args.port, args.model_name, template, markers, args.allow_mismatch, runtime_options,
        args.api_key,
    )  # fmt: skip
    return 0


# --------------------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------------------


def run_inspect(args: argparse.Namespace) -> int:
    from graphspec.artifact import read_manifest

    manifest = read_manifest(args.artifact)
    if args.json:
        print(json.dumps(manifest, indent=2))
        return 0
    try:
        summary = describe_manifest(Path(args.artifact).absolute(), manifest)
    except (KeyError, TypeError, ValueError) as error:
        raise ArtifactError(
            f"{args.artifact}: malformed manifest.json ({type(error).__name__}: {error}); "
            f"`graphspec inspect --json` shows it as is"
        ) from None
    print(summary)
    return 0


def describe_manifest(path: Path, manifest: dict[str, Any]) -> str:
    """A readable summary of an artifact's manifest (what `graphspec inspect` prints)."""
    from graphspec.artifact import changed_passes, environment_mismatches

    config, device, versions = manifest["config"], manifest["device"], manifest["versions"]
    files = manifest["files"]
    sm = f"sm_{device['sm']}" if device.get("sm") is not None else "no GPU sm"
    pairs = config.get("k_by_bucket") or []
    by_bucket = f" (bucket {', '.join(f'{bucket}: k={k}' for bucket, k in pairs)})" if pairs else ""
    lines = [
        f"artifact   {path}",
        f"           format {manifest['format_version']}, created {manifest.get('created', '?')}",
        f"step       k={config['k']}{by_bucket}  buckets {','.join(map(str, config['batch_sizes']))}  "
        f"modes {','.join(manifest.get('modes', []))}  dtype {config['dtype']}  max_seq_len {config['max_seq_len']}  "
        f"capture {config['capture']}  lowering {config['lowering']}  numerics {config.get('numerics', 'default')}  "
        f"fold_norms {config.get('fold_norms', False)}",
        f"device     {device['device']} ({device.get('name', '?')}, {sm})",
        "versions   " + "  ".join(f"{name} {version}" for name, version in versions.items()),
    ]
    drafter = dict(manifest.get("drafter", {"kind": "draft_model"}))
    kind = drafter.pop("kind")
    lines.append(f"drafter    {kind}" + "".join(f"  {name} {value}" for name, value in drafter.items()))
    for role in ("target", "draft"):
        if role not in manifest["models"]:
            continue
        model = manifest["models"][role]
        model_config = model["config"]
        size = sum(files[name]["bytes"] for name in model["files"] if name in files)
        where = f"copied into {model['weights']}/" if model["copied"] else f"referenced at {model['weights']}"
        heads = f"{model_config.get('num_attention_heads')}/{model_config.get('num_key_value_heads')}"
        lines.append(
            f"{role:<10} {model.get('model_type')}  {model_config.get('num_hidden_layers')} layers  "
            f"hidden {model_config.get('hidden_size')}  heads(q/kv) {heads}  vocab {model_config.get('vocab_size')}  "
            f"weights {human_size(size)} {where}  (from {model['source']})"
        )
    ran: dict[str, str] = {}
    for entry in manifest["graphs"]:
        for record in entry.get("passes", []):
            ran.setdefault(record["name"], "skipped" if record.get("skipped") else "ran")
    lines.append("passes")
    for index, entry in enumerate(manifest["pipeline"], start=1):
        state = ran.get(entry["name"], "not run (--stop-after)")
        lines.append(f"  [{index:02d}] {entry['name']:<20} {state:<24} source sha256 {entry['sha256'][:12]}")
    lines.append("graphs")
    for entry in manifest["graphs"]:
        size = sum(files[entry[key]]["bytes"] for key in ("graph", "constants") if entry.get(key) in files)
        lines.append(
            f"  {entry['name']:<20} mode {entry['mode']:<7} bucket {entry['bucket']:<4} {entry.get('nodes', '?')} nodes"
            f"  {human_size(size)}"
        )
    if manifest.get("prefill"):
        lines.append("prefill programs (one per bucket and chunk size: positions per row)")
        for entry in manifest["prefill"]:
            size = sum(files[entry[key]]["bytes"] for key in ("graph", "constants") if entry.get(key) in files)
            lines.append(
                f"  {entry['name']:<20} bucket {entry['bucket']:<4} chunk {entry['chunk']:<6} "
                f"{entry.get('nodes', '?')} nodes  {human_size(size)}"
            )
    kernels = _kernel_summary(path, manifest)
    lines.append(f"kernels    {kernels}")
    total = sum(record["bytes"] for record in files.values())
    lines.append(f"files      {len(files)} files, {human_size(total)}")
    for name, record in sorted(files.items()):
        lines.append(f"  {human_size(record['bytes']):>10}  {name}")
    try:
        mismatches, changed = environment_mismatches(manifest), changed_passes(manifest)
    except (KeyError, TypeError) as error:
        mismatches, changed = [("manifest", f"a malformed manifest ({error})", "")], []
    if mismatches:
        lines.append(
            "this machine: differs: "
            + "; ".join(f"compiled for {theirs}, here {ours}" for _, theirs, ours in mismatches)
            + " (generate refuses unless --allow-mismatch)"
        )
    else:
        lines.append("this machine: matches (GPU sm and software versions)")
    if changed:
        lines.append(f"passes changed since compile: {', '.join(changed)} (graphs run as compiled)")
    lines.append(f"recompile  {manifest['command']}")
    return "\n".join(lines)


def _kernel_summary(path: Path, manifest: dict[str, Any]) -> str:
    try:
        kernels = json.loads((path / manifest.get("kernels", "kernels.json")).read_text())
    except (OSError, json.JSONDecodeError):
        return "(kernels.json unreadable)"
    chosen = {name: table for name, table in kernels.items() if table}
    if not chosen:
        return "none chosen: every hot op runs its torch reference"
    counts: dict[str, int] = {}
    for table in chosen.values():
        for kernel in table.values():
            # lower_kernels tags {"kernel": name, "sm": sm, "config": {...}}; show name and SM.
            if isinstance(kernel, dict) and "kernel" in kernel:
                key = f"{kernel['kernel']} (sm_{kernel.get('sm')})"
            else:
                key = str(kernel)
            counts[key] = counts.get(key, 0) + 1
    nodes = sum(counts.values())
    listed = ", ".join(f"{kernel} x{count}" for kernel, count in sorted(counts.items()))
    return f"{nodes} lowered nodes in {len(chosen)} graphs: {listed}"


def human_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `graphspec` console script and `python -m graphspec`; returns the exit status."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    use_no_workspace()  # before any command starts CUDA (graphspec/cublas.py)
    try:
        args = parser.parse_args(argv)
        run: Callable[[argparse.Namespace], int] = args.run
        status = run(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at interpreter exit
        return status
    except BrokenPipeError:
        # The reader went away (`graphspec inspect --json | head`): stop quietly, as a tool killed by
        # SIGPIPE does. stdout goes to /dev/null so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except UsageError as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2
    except (GraphspecError, OSError) as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    except SystemExit as exit_:  # --help and --version exit through argparse
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(f"error: {' '.join(str(exit_.code).split())}", file=sys.stderr)  # sys.exit("message") exits 1
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
