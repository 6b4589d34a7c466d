"""Load a Hugging Face checkpoint directory (config.json + *.safetensors [+ tokenizer]) into DecoderLM.

Everything that can be checked is checked before any tensor is materialized on the target device:
the config's architecture, the presence and integrity of every weight file (safetensors headers are
parsed up front, so a truncated file is named), and the exact set and shapes of tensors.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoConfig, PretrainedConfig

from graphspec.errors import CheckpointError
from graphspec.models.decoder import DecoderLM, checkpoint_layout, checkpoint_shapes
from graphspec.models.fold_norms import fold_norms as fold_norms_into_projections
from graphspec.models.fold_norms import fold_refusal
from graphspec.models.hybrid import HybridLM
from graphspec.models.spec import FAMILIES, ModelSpec, rope_frequencies, text_config

log = logging.getLogger("graphspec")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# Where a multimodal checkpoint (Qwen3.5's Qwen3_5ForConditionalGeneration) keeps its language model,
# and the tensors of it graphspec does not use (the vision tower: graphspec serves text).
LANGUAGE_MODEL_PREFIX = "model.language_model."
UNUSED_PREFIXES = ("model.visual.",)


@dataclass
class LoadedModel:
    model: DecoderLM | HybridLM
    config: PretrainedConfig
    tokenizer: object | None  # a transformers tokenizer when the checkpoint ships one
    path: Path
    weight_files: list[Path]

    @property
    def eos_token_ids(self) -> list[int]:
        return eos_token_ids(self.config, self.path)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise CheckpointError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_config(path: str | Path) -> PretrainedConfig:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {str(path)!r} does not exist or is not a directory")
    config_file = path / "config.json"
    if not config_file.is_file():
        if (path / "manifest.json").is_file():  # a graphspec artifact given where a checkpoint belongs
            raise CheckpointError(
                f"{path} is a graphspec artifact, not a model checkpoint: run it with `graphspec generate {path}` "
                f"or `graphspec serve {path}`, or compile from the checkpoints it was made of (`graphspec inspect "
                f"{path}` names them)"
            )
        raise CheckpointError(f"{config_file}: missing config.json; is this a Hugging Face checkpoint directory?")
    try:
        raw = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{config_file}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config_file}: not a JSON object")
    model_type = raw.get("model_type")
    if model_type is None:
        raise CheckpointError(f"{config_file}: no model_type field")
    # Checked before transformers sees the file: a model_type transformers does not know would
    # otherwise fail inside AutoConfig with a message that does not say what graphspec supports.
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{config_file}: unsupported architecture {model_type!r} "
            f"(architectures={raw.get('architectures')}); supported model_type values: {', '.join(sorted(FAMILIES))}"
        )
    known = known_config(path)
    if known is not None:
        return plain_config(known)
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (ValueError, KeyError, OSError) as error:
        raise CheckpointError(f"{config_file}: transformers could not read it: {error}") from None
    ModelSpec.from_config(config)  # raises on unsupported families, listing the supported ones
    return config


# Configs already resolved by transformers (an artifact's record of them), by checkpoint directory: while
# set (known_configs), load_config and load_tokenizer take them instead of parsing config.json again.
# The point is start-up time: a model family's config class imports much of transformers (its type
# validators reach the video utilities, and torchvision where it is installed: seconds).
_KNOWN_CONFIGS: contextvars.ContextVar[dict[Path, dict] | None] = contextvars.ContextVar(
    "graphspec_configs", default=None
)


@contextlib.contextmanager
def known_configs(configs: dict[Path, dict]) -> Iterator[None]:
    """Within the block, load_config(directory) is plain_config(configs[directory]) for these directories."""
    token = _KNOWN_CONFIGS.set({Path(directory).absolute(): record for directory, record in configs.items()})
    try:
        yield
    finally:
        _KNOWN_CONFIGS.reset(token)


def config_record(config: PretrainedConfig) -> dict:
    """config.to_dict() as it reads back from JSON."""
    record = json.loads(json.dumps(config.to_dict(), default=str))
    # to_dict writes the class's model_type: "" for a plain config (plain_config), which holds its family's
    # on the instance. Without this a loaded artifact saved again recorded model_type "" and was refused.
    own = vars(config).get("model_type")
    if own:
        record["model_type"] = own
    return record


def plain_config(record: dict) -> PretrainedConfig:
    """A transformers base-class config holding a resolved config's values (config_record of it)."""
    return PretrainedConfig(**record)


# Keys the base config class converts or consumes itself (a torch.dtype for "float16"; use_cache is a
# generation setting in transformers 5): graphspec reads none of them from a model config.
BASE_CLASS_KEYS = frozenset({"dtype", "torch_dtype", "use_cache"})


def known_config(path: str | Path) -> dict | None:
    """The record known_configs holds for this checkpoint directory, if any."""
    return (_KNOWN_CONFIGS.get() or {}).get(Path(path).absolute())


# Config keys that only say which transformers wrote the file, not what the model is.
VOLATILE_CONFIG_KEYS = ("transformers_version",)


def disagreements(raw: dict, record: dict) -> list[str]:
    """Keys with a plain (scalar) value in both config.json and a resolved record that differ: how a
    config.json edited after compile shows against the record made from it."""
    scalar = (str, int, float, bool, type(None))
    return sorted(
        key
        for key in set(raw) & set(record) - set(VOLATILE_CONFIG_KEYS)
        if isinstance(raw[key], scalar) and isinstance(record[key], scalar) and raw[key] != record[key]
    )


def stands_in_for(config: PretrainedConfig, raw: dict) -> bool:
    """Whether plain_config(config_record(config)) has every value of the record as an attribute and gives
    the same model (spec, rope frequencies, EOS ids), and the record agrees with config.json (`raw`) on
    their shared plain values: false for configs whose class computes something a plain one would not
    (nested sub-configs, as Qwen3.5's multimodal wrapper), which keep their own class."""
    record = config_record(config)
    if disagreements(raw, record):
        return False
    try:
        plain = plain_config(record)
        read_back = {key: getattr(plain, key, None) for key in record if key not in BASE_CLASS_KEYS}
        if json.loads(json.dumps(read_back, default=str)) != {key: record[key] for key in read_back}:
            return False
        if ModelSpec.from_config(plain) != ModelSpec.from_config(config):
            return False
        (ours, our_scale), (theirs, their_scale) = rope_frequencies(plain), rope_frequencies(config)
    except (AttributeError, KeyError, TypeError, ValueError, CheckpointError):
        return False
    return torch.equal(ours, theirs) and our_scale == their_scale and eos_token_ids(plain) == eos_token_ids(config)


def _read_index(index: Path) -> dict[str, str]:
    """tensor name -> shard file name, from model.safetensors.index.json."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(f"{index}: corrupt shard index ({type(error).__name__}: {error})") from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(name, str) and isinstance(file, str) for name, file in weight_map.items()
    ):
        raise CheckpointError(f"{index}: corrupt shard index (weight_map must map tensor names to file names)")
    return weight_map


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files, from the shard index when there is one."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = [path / name for name in sorted(set(_read_index(index).values()))]
    elif (path / "model.safetensors").exists():
        files = [path / "model.safetensors"]
    else:
        found = sorted(p.name for p in path.glob("*.safetensors"))
        if not found:
            other = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
            hint = f"; found only {', '.join(other)}: convert it to safetensors first" if other else ""
            raise CheckpointError(
                f"{path}: no model.safetensors or model.safetensors.index.json (found no weights){hint}"
            )
        files = [path / name for name in found]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"missing weight file(s): {', '.join(missing)}")
    return files


def read_safetensors_header(handle: Any, size: int) -> tuple[int, dict]:
    """(offset of the data section, header) of an open safetensors file of `size` bytes, read from its
    start; ValueError (or json's) when the header is not there."""
    header_len = int.from_bytes(handle.read(8), "little")
    if size < 8 or header_len <= 0 or 8 + header_len > size:
        raise ValueError("header length runs past the end of the file")
    return 8 + header_len, json.loads(handle.read(header_len))


def _read_headers(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """name -> (file, shape) for every tensor, validating each file's header and size."""
    tensors: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in files:
        size = file.stat().st_size
        try:
            with file.open("rb") as handle:
                data_start, header = read_safetensors_header(handle, size)
        except (ValueError, UnicodeDecodeError) as error:
            raise CheckpointError(f"{file}: corrupt or truncated safetensors file ({error})") from None
        end = 0
        shapes: dict[str, tuple[int, ...]] = {}
        try:
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, stop = info["data_offsets"]
                if not 0 <= begin <= stop:
                    raise ValueError(f"bad data_offsets for {name}")
                end = max(end, stop)
                shapes[name] = tuple(int(d) for d in info["shape"])
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{file}: corrupt safetensors header ({type(error).__name__}: {error})") from None
        # Two files holding one tensor: which copy is meant is unknowable, so refuse rather than pick.
        duplicated = sorted(f"{name} (also in {tensors[name][0].name})" for name in shapes if name in tensors)
        if duplicated:
            raise CheckpointError(f"{file}: tensors stored in more than one file: {', '.join(duplicated)}")
        tensors.update((name, (file, shape)) for name, shape in shapes.items())
        if data_start + end > size:
            raise CheckpointError(
                f"{file}: truncated safetensors file ({size} bytes, header promises {data_start + end})"
            )
    return tensors


def _check_index(path: Path, available: dict[str, tuple[Path, tuple[int, ...]]]) -> None:
    """Every tensor the shard index names must be in the shard it names: an index that disagrees with
    its shards means files from two different checkpoints were mixed."""
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return
    wrong = sorted(
        f"{name} (index: {file}, found in: {available[name][0].name if name in available else 'no shard'})"
        for name, file in _read_index(index).items()
        if name not in available or available[name][0].name != file
    )
    if wrong:
        raise CheckpointError(f"{index}: shard index disagrees with the shards: {', '.join(wrong)}")


def build_model(config: PretrainedConfig) -> DecoderLM | HybridLM:
    """The family's model (DecoderLM, or HybridLM for Gated DeltaNet hybrids) with uninitialized (meta)
    parameters for `config`."""
    spec = ModelSpec.from_config(config)
    inv_freq, rope_scale = rope_frequencies(config)
    family = HybridLM if spec.linear is not None else DecoderLM
    with torch.device("meta"):
        model = family(spec, torch.empty_like(inv_freq, device="meta"), rope_scale)
    model.inv_freq = inv_freq  # a real buffer: meta-initialized above only to skip allocating weights
    return model


# Config fields that count a checkpoint's multi-token-prediction layers (transformers' name, DeepSeek-V3 /
# Qwen3-Next's, Qwen3.5's). Their tensors sit beside the model's and are read by drafters.mtp, not here.
MTP_LAYER_FIELDS = ("num_mtp_layers", "num_nextn_predict_layers", "mtp_num_hidden_layers")


def mtp_layer_count(config: PretrainedConfig) -> int:
    """MTP layers the checkpoint's config declares (0 when it declares none)."""
    config = text_config(config)
    for field in MTP_LAYER_FIELDS:
        value = getattr(config, field, None)
        if value:
            return int(value)
    return 0


def is_mtp_tensor(name: str, num_layers: int) -> bool:
    """An MTP tensor in either public layout: Qwen3.5/Qwen3-Next `mtp.*`, or DeepSeek-V3's extra decoder
    layers `model.layers.{num_layers + i}.*`."""
    match = re.match(r"model\.layers\.(\d+)\.", name)
    return name.startswith("mtp.") or (match is not None and int(match.group(1)) >= num_layers)


def checkpoint_tensors(path: str | Path) -> tuple[list[Path], dict[str, tuple[Path, tuple[int, ...]]]]:
    """The checkpoint's weight files and name -> (file, shape) of every tensor, headers validated."""
    path = Path(path)
    files = weight_files(path)
    available = _read_headers(files)
    _check_index(path, available)
    return files, available


# safetensors dtype names -> torch dtypes, for the prefetch's own reads (it parses the header itself).
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


@dataclass(frozen=True)
class _Piece:
    """One stored tensor for the prefetch to move: where its bytes are and what they are."""

    file: Path
    name: str
    offset: int  # of its first byte in the file
    nbytes: int
    dtype: torch.dtype  # as stored
    shape: tuple[int, ...]


@dataclass
class _FileRead:
    """A file while the prefetch reads it: its open handle, the pieces still pending, what the read ones
    gave (tensor, and the CUDA event after its last copy), and whether one failed."""

    handle: Any
    pending: int
    read: dict[str, tuple[torch.Tensor, Any]]
    failed: bool = False


class _Prefetch:
    """Every tensor of some safetensors files, copied to the device in the target dtype by side threads
    that take the tensors one by one from one queue (all files', in file order), so even a checkpoint of
    one file moves on every thread. A file's tensors become available together once all are read; a file
    that fails to read (a bad header, a short file, no device) is left to read_into, which reads it again
    and names the error.

    To a GPU the bytes go through pinned staging buffers, two per thread: a read (pread, from the page
    cache) fills one while the other's copy to the device runs. On an H200 that moved 16 GB of weights
    in 0.96 s with four threads (3.2 s with one: one thread per file left a one-file 8B checkpoint at that
    rate). Through safe_open, each tensor a view of the mapped file that .to(device) copies from pageable
    memory, faulting its pages in as it goes, it took 3.4-3.6 s with one thread or four
    (docs/BENCHMARKS.md). The threads need the interpreter briefly per buffer: beside a busy main thread
    each such moment waits out the GIL's switch interval (5 ms by default; 16 GB took 8.1 s instead of
    0.96 s), so while a prefetch is open the interval is SWITCH_INTERVAL, and restored when it closes."""

    THREADS = 4
    STAGING_BYTES = 32 << 20  # per buffer: large enough that each copy runs at full bandwidth
    SWITCH_INTERVAL: float | None = 2e-4  # seconds; None leaves the interpreter's own

    def __init__(self, files: Iterable[Path], dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self._files = {Path(file).resolve(): threading.Event() for file in files}
        self._tensors: dict[Path, dict[str, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reading: dict[Path, _FileRead] = {}  # the files being read
        self._queue: list[_Piece] = []
        for file in self._files:
            self._plan(file)
        self._queue.reverse()  # popped from the end: file order, each file's tensors in stored order
        self._threads = [
            threading.Thread(target=self._work, name="graphspec-prefetch", daemon=True)
            for _ in range(min(self.THREADS, len(self._queue)))
        ]
        for thread in self._threads:
            thread.start()
        # Last, so a failure above leaves the interpreter's interval as it was (close() restores it).
        self._switch_interval = sys.getswitchinterval()
        if self.SWITCH_INTERVAL is not None:
            sys.setswitchinterval(min(self.SWITCH_INTERVAL, self._switch_interval))

    def _plan(self, file: Path) -> None:
        """Queue `file`'s tensors; a file whose header cannot be read is done at once, with nothing."""
        try:
            handle = file.open("rb", buffering=0)
        except OSError:
            self._files[file].set()
            return
        try:
            data_start, header = read_safetensors_header(handle, os.fstat(handle.fileno()).st_size)
            pieces = []
            for name, info in header.items():
                if name == "__metadata__" or name.startswith(UNUSED_PREFIXES):
                    continue
                begin, end = info["data_offsets"]
                shape = tuple(int(d) for d in info["shape"])
                pieces.append(
                    _Piece(file, name, data_start + begin, end - begin, SAFETENSORS_DTYPES[info["dtype"]], shape)
                )
        except Exception:  # read_into reads the header again and says what is wrong with it
            handle.close()
            self._files[file].set()
            return
        self._reading[file] = _FileRead(handle, len(pieces), {})
        self._queue += sorted(pieces, key=lambda piece: piece.offset)
        if not pieces:
            self._complete(file)

    def _work(self) -> None:
        try:
            staged = _Staging(self.device, self.STAGING_BYTES) if self.device.type == "cuda" else None
        except Exception:  # e.g. no pinned memory (no CUDA here): plain copies, or read_into's error per file
            staged = None
        while not self._stop.is_set():
            with self._lock:
                if not self._queue:
                    return
                piece = self._queue.pop()
                reading = self._reading[piece.file]
                skip = reading.failed
            result = None
            if not skip:
                try:
                    result = self._read_piece(piece, staged)
                except Exception:  # the file is left to read_into
                    pass
            with self._lock:
                if result is None:
                    reading.failed = True
                else:
                    reading.read[piece.name] = result
                reading.pending -= 1
                last = reading.pending == 0
            if last:
                self._complete(piece.file)

    def _read_piece(self, piece: _Piece, staged: _Staging | None) -> tuple[torch.Tensor, Any]:
        """The piece's bytes on the device as its stored dtype and shape, and the event its copies end
        with (None when they were synchronous)."""
        handle = self._reading[piece.file].handle
        if staged is None:
            raw = torch.empty(piece.nbytes, dtype=torch.uint8)
            _pread_into(handle, memoryview(raw.numpy()), piece.offset)
            raw, event = raw.to(self.device), None
        else:
            raw = torch.empty(piece.nbytes, dtype=torch.uint8, device=self.device)
            for start in range(0, piece.nbytes, self.STAGING_BYTES):
                staged.copy(handle, piece.offset + start, raw[start : start + self.STAGING_BYTES])
            event = staged.mark()
        return raw.view(piece.dtype).reshape(piece.shape), event

    def _complete(self, file: Path) -> None:
        """Every piece of `file` is read (or one failed): hand its tensors over, converted to the dtype."""
        reading = self._reading.pop(file)
        try:
            if not reading.failed:
                for _, event in reading.read.values():
                    if event is not None:
                        event.synchronize()  # its copies landed; the conversions run on the loader's stream
                self._tensors[file] = {name: tensor.to(self.dtype) for name, (tensor, _) in reading.read.items()}
        except Exception:  # read_into reads the file again and reports what is wrong
            self._tensors.pop(file, None)
        finally:
            reading.handle.close()
            self._files[file].set()

    def take(self, file: Path, names: Iterable[str], dtype: torch.dtype, device: torch.device) -> dict | None:
        """The named tensors of `file` (removed from the prefetch), or None when it cannot give them
        all: another file, dtype or device, a file it failed to read, or names it does not hold."""
        file = Path(file).resolve()
        if file not in self._files or (dtype, device) != (self.dtype, self.device):
            return None
        self._files[file].wait()
        tensors = self._tensors.get(file, {})
        names = list(names)
        if not all(name in tensors for name in names):
            return None
        return {name: tensors.pop(name) for name in names}

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        for reading in self._reading.values():
            reading.handle.close()
        self._reading.clear()
        self._tensors.clear()
        sys.setswitchinterval(self._switch_interval)


def _pread_into(handle: Any, view: memoryview, offset: int) -> None:
    """Fill `view` with the file's bytes from `offset` (pread: no shared file position between threads)."""
    filled = 0
    while filled < len(view):  # a read may return fewer bytes than asked
        got = os.preadv(handle.fileno(), [view[filled:]], offset + filled)
        if not got:
            raise ValueError("the file ends before its tensors do")
        filled += got


class _Staging:
    """One prefetch thread's two pinned buffers, the CUDA stream its copies run on, and an event per
    buffer marking when its last copy finished (so a read does not overwrite bytes still in flight)."""

    def __init__(self, device: torch.device, nbytes: int) -> None:
        self.device = device
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.events = [torch.cuda.Event() for _ in range(2)]
        self.stream = torch.cuda.Stream(device)
        self.turn = 0

    def copy(self, handle: Any, offset: int, destination: torch.Tensor) -> None:
        """Read destination.numel() bytes of `handle` from `offset` into a free buffer, copy them on."""
        slot = self.turn % 2
        self.turn += 1
        self.events[slot].synchronize()
        staging = self.buffers[slot][: destination.numel()]
        _pread_into(handle, memoryview(staging.numpy()), offset)
        with torch.cuda.stream(self.stream):
            destination.copy_(staging, non_blocking=True)
            self.events[slot].record(self.stream)

    def mark(self) -> Any:
        """An event recorded after every copy queued so far."""
        event = torch.cuda.Event()
        event.record(self.stream)
        return event


_PREFETCH: contextvars.ContextVar[_Prefetch | None] = contextvars.ContextVar("graphspec_prefetch", default=None)


@contextlib.contextmanager
def prefetched(files: Iterable[Path], dtype: str | torch.dtype, device: str | torch.device) -> Iterator[None]:
    """Within the block, read_into takes the tensors of `files` from copies that side threads start
    making on the device at once, before the caller has parsed a config: loading an artifact, whose
    files are known up front, moves the weights while it verifies and checks the rest (docs/BENCHMARKS.md,
    cold start). Tensors nobody took are freed on exit."""
    prefetch = _Prefetch(files, parse_dtype(dtype), torch.device(device))
    token = _PREFETCH.set(prefetch)
    try:
        yield
    finally:
        _PREFETCH.reset(token)
        prefetch.close()


def read_into(
    module: torch.nn.Module,
    files: list[Path],
    names: dict[str, str],
    dtype: torch.dtype,
    device: str | torch.device,
) -> None:
    """Load tensors into `module` (built on meta): names maps each of its checkpoint-layout names
    (decoder.checkpoint_state's, fused projections unfused) to the name stored in the files."""
    wanted = {stored: own for own, stored in names.items()}
    state: dict[str, torch.Tensor] = {}
    prefetch = _PREFETCH.get()
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                here = [name for name in handle.keys() if name in wanted]
                taken = prefetch.take(file, here, dtype, torch.device(device)) if prefetch else None
                for name in here:
                    tensor = taken[name] if taken else handle.get_tensor(name).to(device=device, dtype=dtype)
                    state[wanted[name]] = tensor
        except Exception as error:  # safetensors raises its own error types for corrupt data
            raise CheckpointError(f"{file}: could not read tensors ({error})") from None
    _fuse(module, state)
    module.load_state_dict(state, strict=False, assign=True)


def tensor_problems(
    expected: dict[str, tuple[int, ...]],
    available: dict[str, tuple[Path, tuple[int, ...]]],
    required: Iterable[str] | None = None,
    ignore_unexpected: Callable[[str], bool] | None = lambda name: False,
) -> list[str]:
    """What is wrong between the tensors a module expects (stored name -> shape) and what the files hold
    (checkpoint_tensors' name -> (file, shape)): missing `required` ones (default: all expected),
    unexpected stored ones (unless ignore_unexpected says so; None: other tensors are allowed), and
    mis-shaped ones. One phrase per kind, names sorted; empty when they fit."""
    required = expected if required is None else required
    missing = sorted(name for name in required if name not in available)
    unexpected = (
        []
        if ignore_unexpected is None
        else sorted(name for name in set(available) - set(expected) if not ignore_unexpected(name))
    )
    misshaped = sorted(
        f"{name} (checkpoint {list(available[name][1])}, expected {list(shape)})"
        for name, shape in expected.items()
        if name in available and tuple(available[name][1]) != tuple(shape)
    )
    return (
        ([f"missing tensors: {', '.join(missing)}"] if missing else [])
        + ([f"unexpected tensors: {', '.join(unexpected)}"] if unexpected else [])
        + ([f"mis-shaped tensors: {', '.join(misshaped)}"] if misshaped else [])
    )


def load_model(
    path: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    fold_norms: bool = False,
) -> LoadedModel:
    """Load and validate a checkpoint directory. Raises CheckpointError naming what is wrong. MTP
    tensors stored beside the model (see is_mtp_tensor) are left for the MTP drafter. fold_norms: fold the
    layers' norm weights into the projections they feed where the model allows (models/fold_norms.py; where it
    does not, the model loads as stored and the log says why)."""
    path = Path(path)
    torch_dtype = parse_dtype(dtype)
    config = load_config(path)
    files, available = checkpoint_tensors(path)
    model = build_model(config)

    stored = stored_names(checkpoint_shapes(model), available)
    expected = {stored[name]: shape for name, shape in checkpoint_shapes(model).items()}
    if model.spec.tie_word_embeddings:
        available.pop("lm_head.weight", None)  # some tied checkpoints still store it
    if mtp_layer_count(config):
        for name in [n for n in available if is_mtp_tensor(n, model.spec.num_layers)]:
            available.pop(name)
    for name in [n for n in available if n.startswith(UNUSED_PREFIXES)]:
        available.pop(name)
    problems = tensor_problems(expected, available)
    if problems:
        raise CheckpointError(f"{path}: checkpoint does not match its config.json; " + "; ".join(problems))

    read_into(model, files, stored, torch_dtype, device)
    if model.spec.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = model.inv_freq.to(device)
    model.eval().requires_grad_(False)
    if fold_norms:
        reason = fold_refusal(model)
        if reason is None:
            fold_norms_into_projections(model)
        else:
            log.info("fold_norms: %s keeps its norms: %s", path, reason)
    return LoadedModel(model, config, load_tokenizer(path), path, files)


def stored_names(own: dict[str, object], available: dict[str, object]) -> dict[str, str]:
    """Own checkpoint-layout name -> the name the files store it under: the same, except in a multimodal
    checkpoint whose language model sits under LANGUAGE_MODEL_PREFIX (model.language_model.layers.*)."""
    nested = any(name.startswith(LANGUAGE_MODEL_PREFIX) for name in available)
    if not nested:
        return {name: name for name in own}
    return {
        name: LANGUAGE_MODEL_PREFIX + name.removeprefix("model.") if name.startswith("model.") else name for name in own
    }


def _fuse(model: DecoderLM | HybridLM, state: dict[str, torch.Tensor]) -> None:
    """Replace the checkpoint's separate q/k/v and gate/up tensors in `state` by the fused parameters
    the model holds (concatenated along rows, in FusedLinear.parts order), one parameter at a time so
    peak memory grows by one fused tensor only."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for name, (parameter, row, _) in checkpoint_layout(model).items():
        groups.setdefault(parameter, []).append((row, name))
    for parameter, parts in groups.items():
        state[parameter] = torch.cat([state.pop(name) for _, name in sorted(parts)], dim=0)


def load_tokenizer(path: Path) -> object | None:
    """transformers AutoTokenizer when the checkpoint ships tokenizer files, else None."""
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    known = known_config(path)
    # Given the config, AutoTokenizer does not parse config.json (with its family's config class) again.
    extra = {} if known is None else {"config": plain_config(known)}
    try:
        return AutoTokenizer.from_pretrained(str(path), **extra)
    except Exception as error:  # tokenizer classes raise many types; all mean the files are unusable
        raise CheckpointError(f"{path}: tokenizer files present but unreadable ({error})") from None


def eos_token_ids(config: PretrainedConfig, path: Path | None = None) -> list[int]:
    """EOS ids from generation_config.json when present, else config.json's eos_token_id."""
    eos = None
    if path is not None and (path / "generation_config.json").is_file():
        eos = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
