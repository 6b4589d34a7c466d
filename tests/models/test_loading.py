"""Checkpoint loading: every way a checkpoint directory can be wrong is refused with a message that
names the problem, and every supported way of storing a checkpoint loads to the same weights."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from graphspec.errors import CheckpointError
from graphspec.models import FAMILIES, load_model, loading
from graphspec.models.decoder import checkpoint_state
from tests.checkpoints import load_hf


@pytest.fixture
def checkpoint(checkpoint_factory, tmp_path: Path) -> Path:
    """A private copy of the session's tiny llama checkpoint, free to be damaged."""
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint_factory("llama"), copy)
    return copy


@pytest.fixture
def sharded(checkpoint_factory, tmp_path: Path) -> Path:
    """The tiny llama checkpoint re-saved by transformers in several shards plus an index."""
    directory = tmp_path / "sharded"
    load_hf(checkpoint_factory("llama")).save_pretrained(directory, max_shard_size="100KB")
    return directory


def rewrite_weights(directory: Path, change) -> None:
    """Load model.safetensors, let `change(tensors)` edit the dict in place, save it back."""
    file = directory / "model.safetensors"
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def load_error(directory: Path, **kwargs) -> str:
    with pytest.raises(CheckpointError) as info:
        load_model(directory, **kwargs)
    return str(info.value)


# --------------------------------------------------------------------------------------------------
# Refused checkpoints
# --------------------------------------------------------------------------------------------------


def test_unsupported_architecture_lists_supported_model_types(tmp_path: Path) -> None:
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64).save_pretrained(tmp_path)
    message = load_error(tmp_path)
    assert "gpt2" in message
    for family in FAMILIES:
        assert family in message


def test_unknown_model_type_lists_supported_model_types(checkpoint: Path) -> None:
    # A model_type transformers itself does not know must still get the list, not a transformers error.
    config = json.loads((checkpoint / "config.json").read_text())
    config["model_type"] = "not_a_real_model"
    (checkpoint / "config.json").write_text(json.dumps(config))
    message = load_error(checkpoint)
    assert "not_a_real_model" in message
    for family in FAMILIES:
        assert family in message


def test_missing_directory_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_checkpoint"
    message = load_error(missing)
    assert str(missing) in message
    assert "does not exist" in message


def test_missing_config_json_is_named(checkpoint: Path) -> None:
    (checkpoint / "config.json").unlink()
    message = load_error(checkpoint)
    assert "config.json" in message
    assert "missing" in message


def test_invalid_config_json_is_named(checkpoint: Path) -> None:
    (checkpoint / "config.json").write_text("{not json")
    message = load_error(checkpoint)
    assert "config.json" in message
    assert "JSON" in message


def test_no_weight_files_is_reported(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors").unlink()
    message = load_error(checkpoint)
    assert "model.safetensors" in message
    assert "no weights" in message or "found no" in message


def test_missing_tensors_are_listed(checkpoint: Path) -> None:
    dropped = ["model.layers.1.mlp.up_proj.weight", "model.norm.weight"]

    def drop(tensors: dict[str, torch.Tensor]) -> None:
        for name in dropped:
            del tensors[name]

    rewrite_weights(checkpoint, drop)
    message = load_error(checkpoint)
    assert "missing tensors" in message
    for name in dropped:
        assert name in message
    assert "unexpected" not in message and "mis-shaped" not in message


def test_unexpected_tensors_are_listed(checkpoint: Path) -> None:
    extra = "model.layers.0.self_attn.rotary_emb.extra"

    def add(tensors: dict[str, torch.Tensor]) -> None:
        tensors[extra] = torch.zeros(3)

    rewrite_weights(checkpoint, add)
    message = load_error(checkpoint)
    assert "unexpected tensors" in message
    assert extra in message
    assert "missing" not in message


def test_misshaped_tensors_are_listed_with_both_shapes(checkpoint: Path) -> None:
    name = "model.layers.0.self_attn.k_proj.weight"  # [Hkv*D, hidden] = [32, 64]

    def reshape(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = torch.zeros(16, 64)

    rewrite_weights(checkpoint, reshape)
    message = load_error(checkpoint)
    assert "mis-shaped tensors" in message
    assert name in message
    assert "[16, 64]" in message and "[32, 64]" in message


def test_truncated_safetensors_file_is_named(checkpoint: Path) -> None:
    file = checkpoint / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    message = load_error(checkpoint)
    assert str(file) in message
    assert "truncated" in message


def test_truncated_safetensors_header_is_named(checkpoint: Path) -> None:
    file = checkpoint / "model.safetensors"
    file.write_bytes(file.read_bytes()[:20])  # cut inside the JSON header
    message = load_error(checkpoint)
    assert str(file) in message
    assert "truncated" in message


def test_garbage_safetensors_header_is_named(checkpoint: Path) -> None:
    # A header that parses as JSON but is not a tensor table must not escape as a raw KeyError/TypeError.
    file = checkpoint / "model.safetensors"
    header = b"[1, 2, 3]"
    file.write_bytes(len(header).to_bytes(8, "little") + header)
    message = load_error(checkpoint)
    assert str(file) in message
    assert "corrupt" in message


def test_sharded_checkpoint_has_several_shards_and_an_index(sharded: Path) -> None:
    # Guards the tests below: they only mean something if transformers really wrote shards.
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    assert not (sharded / "model.safetensors").exists()


def test_missing_shard_is_named(sharded: Path) -> None:
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (sharded / shard).unlink()
    message = load_error(sharded)
    assert shard in message
    assert "missing weight file" in message


def test_corrupt_index_is_named(sharded: Path) -> None:
    index = sharded / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"model.norm.weight": ')
    message = load_error(sharded)
    assert str(index) in message
    assert "corrupt shard index" in message


@pytest.mark.parametrize(
    "content",
    [{"metadata": {}}, {"weight_map": ["model-00001-of-00002.safetensors"]}, {"weight_map": {"model.norm.weight": 3}}],
    ids=["no_weight_map", "weight_map_not_a_dict", "file_not_a_string"],
)
def test_malformed_index_is_named(sharded: Path, content: dict) -> None:
    index = sharded / "model.safetensors.index.json"
    index.write_text(json.dumps(content))
    message = load_error(sharded)
    assert str(index) in message
    assert "corrupt shard index" in message


def test_index_naming_the_wrong_shard_for_a_tensor_is_reported(sharded: Path) -> None:
    index_file = sharded / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    weight_map = index["weight_map"]
    files = sorted(set(weight_map.values()))
    name = next(n for n, f in weight_map.items() if f == files[0])
    weight_map[name] = files[1]  # the tensor really lives in files[0]
    index_file.write_text(json.dumps(index))
    message = load_error(sharded)
    assert name in message
    assert files[1] in message


def test_tensor_stored_in_two_shards_is_reported(sharded: Path) -> None:
    weight_map = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    files = sorted(set(weight_map.values()))
    name = next(n for n, f in weight_map.items() if f == files[0])
    second = load_file(sharded / files[1])
    second[name] = load_file(sharded / files[0])[name]
    save_file(second, sharded / files[1], metadata={"format": "pt"})
    message = load_error(sharded)
    assert "more than one file" in message
    assert name in message
    assert files[0] in message and files[1] in message


def edit_config(directory: Path, change) -> None:
    config = json.loads((directory / "config.json").read_text())
    change(config)
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_sequence_length_dependent_rope_is_refused(checkpoint: Path, rope_type: str) -> None:
    rope = {"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0, "original_max_position_embeddings": 256}
    if rope_type == "longrope":
        rope.update(short_factor=[1.0] * 8, long_factor=[2.0] * 8)
    edit_config(checkpoint, lambda c: c.update(rope_parameters=rope))
    message = load_error(checkpoint)
    assert f"unsupported rope_type {rope_type!r}" in message
    assert "llama3" in message and "default" in message


def test_non_silu_activation_is_refused(checkpoint: Path) -> None:
    edit_config(checkpoint, lambda c: c.update(hidden_act="gelu"))
    message = load_error(checkpoint)
    assert "gelu" in message


def test_legacy_rope_scaling_config_gets_transformers_frequencies(checkpoint: Path) -> None:
    # Llama 3.1 checkpoints on the Hub carry the transformers-4 spelling: rope_scaling + top-level rope_theta.
    def legacy(config: dict) -> None:
        config.pop("rope_parameters", None)
        config["rope_theta"] = 500000.0
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }

    edit_config(checkpoint, legacy)
    ours = load_model(checkpoint).model.inv_freq
    theirs = load_hf(checkpoint).model.rotary_emb.inv_freq
    assert torch.equal(ours, theirs.float())
    plain = 1.0 / (500000.0 ** (torch.arange(0, 16, 2).float() / 16))
    assert not torch.allclose(ours, plain)  # the scaling really was applied


def test_unknown_dtype_lists_choices(checkpoint: Path) -> None:
    message = load_error(checkpoint, dtype="float8")
    assert "float8" in message
    assert "bfloat16" in message and "float32" in message


# --------------------------------------------------------------------------------------------------
# Accepted checkpoints
# --------------------------------------------------------------------------------------------------


def test_weights_equal_the_checkpoint_tensors(checkpoint_factory) -> None:
    directory = checkpoint_factory("llama")
    stored = load_file(directory / "model.safetensors")
    params = checkpoint_state(load_model(directory).model)  # fused q/k/v and gate/up seen as their parts
    assert set(params) == set(stored)
    for name, tensor in stored.items():
        assert torch.equal(params[name], tensor), name


def test_sharded_checkpoint_loads_the_same_weights(checkpoint_factory, sharded: Path) -> None:
    loaded = load_model(sharded)
    assert len(loaded.weight_files) >= 3
    reference = dict(load_model(checkpoint_factory("llama")).model.named_parameters())
    params = dict(loaded.model.named_parameters())
    assert set(params) == set(reference)
    for name, tensor in reference.items():
        assert torch.equal(params[name], tensor), name


def test_bfloat16_load_converts_every_parameter_and_keeps_rope_in_float32(checkpoint_factory) -> None:
    directory = checkpoint_factory("llama")
    model = load_model(directory, dtype="bfloat16").model
    stored = load_file(directory / "model.safetensors")
    for name, parameter in checkpoint_state(model).items():
        assert parameter.dtype == torch.bfloat16, name
        assert torch.equal(parameter, stored[name].to(torch.bfloat16)), name
    # Rotary angles are computed in fp32 as transformers does; bf16 frequencies would drift at long range.
    assert model.inv_freq.dtype == torch.float32


def test_bfloat16_model_agrees_with_transformers_in_bfloat16(checkpoint_factory) -> None:
    directory = checkpoint_factory("llama")
    model = load_model(directory, dtype="bfloat16").model
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
    tokens = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(tokens).logits[:, -1].float()
        cache = model.new_cache(2, 24, torch.bfloat16, "cpu")
        ours, _ = model(tokens, torch.zeros(2, dtype=torch.int64), torch.arange(2), cache, output="last_logits")
    cosine = torch.nn.functional.cosine_similarity(ours.float(), expected, dim=-1)
    assert ours.dtype == torch.bfloat16
    assert cosine.min().item() > 0.999, cosine


def test_tied_embeddings_share_storage(checkpoint_factory) -> None:
    directory = checkpoint_factory("llama", tie_word_embeddings=True)
    model = load_model(directory).model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    stored = load_file(directory / "model.safetensors")
    assert torch.equal(model.lm_head.weight, stored["model.embed_tokens.weight"])


def test_tied_checkpoint_that_also_stores_lm_head_loads(checkpoint_factory, tmp_path: Path) -> None:
    # Some tied checkpoints carry a redundant lm_head.weight; it is not "unexpected".
    directory = tmp_path / "tied"
    shutil.copytree(checkpoint_factory("llama", tie_word_embeddings=True), directory)
    rewrite_weights(directory, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].clone()))
    model = load_model(directory).model
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_no_tokenizer_files_means_no_tokenizer(checkpoint_factory) -> None:
    assert load_model(checkpoint_factory("llama")).tokenizer is None


def test_tokenizer_loads_when_tokenizer_files_exist(checkpoint: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "speculative": 5, "decoding": 6}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    )
    wrapped.save_pretrained(checkpoint)
    tokenizer = load_model(checkpoint).tokenizer
    assert tokenizer is not None
    text = "hello speculative world decoding"
    assert tokenizer.encode(text, add_special_tokens=False) == backend.encode(text).ids == [3, 5, 4, 6]
    assert tokenizer.eos_token_id == 2


def test_unreadable_tokenizer_is_reported(checkpoint: Path) -> None:
    (checkpoint / "tokenizer.json").write_text("{broken")
    message = load_error(checkpoint)
    assert "tokenizer" in message
    assert str(checkpoint) in message


def test_eos_ids_come_from_generation_config(checkpoint: Path) -> None:
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    generation["eos_token_id"] = [5, 9]  # config.json says 2
    (checkpoint / "generation_config.json").write_text(json.dumps(generation))
    assert load_model(checkpoint).eos_token_ids == [5, 9]


def test_eos_ids_fall_back_to_config_json(checkpoint: Path) -> None:
    (checkpoint / "generation_config.json").unlink()
    config = json.loads((checkpoint / "config.json").read_text())
    config["eos_token_id"] = 7
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert load_model(checkpoint).eos_token_ids == [7]


# --------------------------------------------------------------------------------------------------
# Prefetched loads (an artifact's shards start moving to the device before the config is parsed)
# --------------------------------------------------------------------------------------------------


def count_takes(monkeypatch) -> list[int]:
    """Spy on the prefetch: the number of tensors each take() handed over (None counted as -1)."""
    handed: list[int] = []
    take = loading._Prefetch.take

    def spy(self, *args, **kwargs):
        taken = take(self, *args, **kwargs)
        handed.append(-1 if taken is None else len(taken))
        return taken

    monkeypatch.setattr(loading._Prefetch, "take", spy)
    return handed


def test_prefetched_load_takes_every_tensor_from_the_prefetch_and_loads_the_same_weights(
    checkpoint_factory, sharded: Path, monkeypatch
) -> None:
    handed = count_takes(monkeypatch)
    files = sorted(sharded.glob("*.safetensors"))
    with loading.prefetched(files, "bfloat16", "cpu"):
        loaded = load_model(sharded, dtype="bfloat16")
    assert -1 not in handed and sum(handed) == sum(len(load_file(file)) for file in files)
    reference = dict(load_model(checkpoint_factory("llama"), dtype="bfloat16").model.named_parameters())
    params = dict(loaded.model.named_parameters())
    assert set(params) == set(reference)
    for name, tensor in reference.items():
        assert params[name].dtype == torch.bfloat16 and torch.equal(params[name], tensor), name


def test_the_prefetch_spreads_one_file_over_its_threads(checkpoint: Path, monkeypatch) -> None:
    """Its threads take tensors, not files, from one queue: a one-file checkpoint moves on all of them.
    Each thread's first read waits at a barrier for the other's; a file read by one thread breaks it."""
    monkeypatch.setattr(loading._Prefetch, "THREADS", 2)
    both, seen = threading.Barrier(2, timeout=30), threading.local()
    read_piece = loading._Prefetch._read_piece

    def meet_first(self, piece, staged):
        if not getattr(seen, "met", False):
            seen.met = True
            both.wait()
        return read_piece(self, piece, staged)

    monkeypatch.setattr(loading._Prefetch, "_read_piece", meet_first)
    file = checkpoint / "model.safetensors"
    stored = load_file(file)
    with loading.prefetched([file], "float32", "cpu"):
        taken = loading._PREFETCH.get().take(file, list(stored), torch.float32, torch.device("cpu"))
    assert taken is not None and set(taken) == set(stored)
    assert all(torch.equal(taken[name], tensor) for name, tensor in stored.items())


@pytest.mark.gpu
def test_gpu_prefetch_stages_through_pinned_buffers_and_loads_the_same_weights(
    checkpoint_factory, sharded: Path, monkeypatch
) -> None:
    """To a GPU the prefetch reads the files itself into pinned buffers; 4 KiB buffers split most
    tensors into several copies, and every one must land where it belongs, in the asked dtype."""
    monkeypatch.setattr(loading._Prefetch, "STAGING_BYTES", 4096)
    handed = count_takes(monkeypatch)
    files = sorted(sharded.glob("*.safetensors"))
    with loading.prefetched(files, "bfloat16", "cuda"):
        loaded = load_model(sharded, dtype="bfloat16", device="cuda")
    assert -1 not in handed and sum(handed) == sum(len(load_file(file)) for file in files)
    reference = dict(load_model(checkpoint_factory("llama"), dtype="bfloat16").model.named_parameters())
    params = dict(loaded.model.named_parameters())
    assert set(params) == set(reference)
    for name, tensor in reference.items():
        assert params[name].dtype == torch.bfloat16 and params[name].is_cuda, name
        assert torch.equal(params[name].cpu(), tensor), name


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_prefetch_to_a_gpu_this_machine_lacks_hands_nothing_and_does_not_hang(checkpoint: Path) -> None:
    """No pinned memory and no device: every file is still marked done (take must not wait forever), and
    take gives nothing, so read_into reads the file itself and reports what is wrong."""
    file = checkpoint / "model.safetensors"
    with loading.prefetched([file], "float32", "cuda"):
        assert loading._PREFETCH.get().take(file, list(load_file(file)), torch.float32, torch.device("cuda")) is None


def test_prefetch_of_another_dtype_is_not_used(checkpoint: Path, monkeypatch) -> None:
    handed = count_takes(monkeypatch)
    with loading.prefetched([checkpoint / "model.safetensors"], "bfloat16", "cpu"):
        model = load_model(checkpoint, dtype="float32").model
    assert handed == [-1]
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_a_prefetch_shortens_the_switch_interval_while_open_and_restores_it(checkpoint: Path) -> None:
    """Its threads need the interpreter for a moment per buffer; beside a busy main thread each such
    moment waits out the switch interval, so the prefetch shortens it, and only while it is open."""
    before = sys.getswitchinterval()
    with loading.prefetched([checkpoint / "model.safetensors"], "float32", "cpu"):
        shortened = sys.getswitchinterval()
    assert shortened == pytest.approx(min(loading._Prefetch.SWITCH_INTERVAL, before)) and shortened < before
    assert sys.getswitchinterval() == before


def test_prefetch_of_a_corrupt_file_leaves_the_error_to_the_load(checkpoint: Path) -> None:
    file = checkpoint / "model.safetensors"
    data = bytearray(file.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    file.write_bytes(bytes(data[: 8 + header_len + 16]) + bytes(len(data) - 8 - header_len - 16 - 1))  # 1 short
    with loading.prefetched([file], "float32", "cpu"):
        message = load_error(checkpoint)
    assert str(file) in message and "truncated" in message


# --------------------------------------------------------------------------------------------------
# Resolved configs (an artifact's record of a config, standing in for config.json at load)
# --------------------------------------------------------------------------------------------------


def raw_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"qwen3_5", "qwen3_next", "qwen3_5_text"}))
def test_a_resolved_config_stands_in_for_config_json(checkpoint_factory, monkeypatch, family: str) -> None:
    """Under known_configs the model and tokenizer are built from the record alone (transformers' config
    parsing is never called) and are the same: spec, rope buffer, every weight."""
    directory = checkpoint_factory(family)
    loaded = load_model(directory)
    assert loading.stands_in_for(loaded.config, raw_config(directory))
    record = loading.config_record(loaded.config)

    def parse(*args, **kwargs):
        raise AssertionError("config.json was parsed by transformers")

    monkeypatch.setattr(loading.AutoConfig, "from_pretrained", parse)
    with loading.known_configs({directory: record}):
        again = load_model(directory)
    assert again.model.spec == loaded.model.spec
    assert torch.equal(again.model.inv_freq, loaded.model.inv_freq)
    assert checkpoint_state(again.model).keys() == checkpoint_state(loaded.model).keys()
    assert all(torch.equal(again.model.state_dict()[k], v) for k, v in loaded.model.state_dict().items())
    assert again.eos_token_ids == loaded.eos_token_ids


def test_a_llama3_rope_config_stands_in_with_the_same_frequencies(checkpoint: Path) -> None:
    edit_config(
        checkpoint,
        lambda config: config.update(
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        ),
    )  # fmt: skip
    loaded = load_model(checkpoint)
    assert loading.stands_in_for(loaded.config, raw_config(checkpoint))
    with loading.known_configs({checkpoint: loading.config_record(loaded.config)}):
        assert torch.equal(load_model(checkpoint).model.inv_freq, loaded.model.inv_freq)


def test_a_checkpoint_written_by_another_transformers_still_stands_in(checkpoint: Path) -> None:
    edit_config(checkpoint, lambda config: config.update(transformers_version="4.57.1"))
    assert loading.stands_in_for(load_model(checkpoint).config, raw_config(checkpoint))


def test_a_record_that_disagrees_with_config_json_does_not_stand_in(checkpoint: Path) -> None:
    loaded = load_model(checkpoint)
    raw = {**raw_config(checkpoint), "rms_norm_eps": 0.5}
    assert loading.disagreements(raw, loading.config_record(loaded.config)) == ["rms_norm_eps"]
    assert not loading.stands_in_for(loaded.config, raw)


def test_models_are_built_without_initializing_parameters(checkpoint_factory, monkeypatch) -> None:
    """Weights come from checkpoints: no init runs (on meta tensors it would import torch._dynamo)."""

    def init(*args, **kwargs):
        raise AssertionError("a parameter was initialized")

    for name in ("normal_", "uniform_", "kaiming_uniform_"):
        monkeypatch.setattr(torch.nn.init, name, init)
    model = loading.build_model(load_model(checkpoint_factory("llama")).config)
    assert next(model.parameters()).device.type == "meta"
