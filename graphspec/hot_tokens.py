"""Build a token map (drafters/token_map.py) from text: the N target token ids a corpus uses most.

The target checkpoint's tokenizer encodes every text file of the corpus (a file, or the *.txt, *.md,
*.jsonl, ... files under a directory, recursively, in sorted order); ids are ranked by count, ties by
the smaller id. The tokenizer's special tokens (eos, bos, pad, ... and the generation config's eos ids)
always come first, so a draft can always propose the end of an answer. This is FR-Spec's recipe
(frequency over a corpus, arXiv 2502.14856) and what SGLang's --speculative-token-map files hold.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from graphspec.errors import InputError

TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".json", ".py", ".rst", ".csv", ".tsv", ".html", ".xml")
CHUNK_CHARS = 1 << 20  # texts are encoded in pieces of about this size (tokens at the cuts barely matter)


def corpus_files(corpus: str | Path) -> list[Path]:
    """The text files of `corpus` (a file, or a directory searched recursively for TEXT_SUFFIXES)."""
    corpus = Path(corpus)
    if corpus.is_file():
        return [corpus]
    if not corpus.is_dir():
        raise InputError(f"corpus {corpus}: no such file or directory")
    files = sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise InputError(f"corpus {corpus} holds no text files ({', '.join(TEXT_SUFFIXES)})")
    return files


def special_ids(tokenizer: object, checkpoint: Path | None = None) -> list[int]:
    """The tokenizer's special token ids (all_special_ids) and the eos ids of the checkpoint's
    generation_config.json / config.json, sorted."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
    for name in ("generation_config.json", "config.json"):
        if checkpoint is not None and (checkpoint / name).is_file():
            eos = json.loads((checkpoint / name).read_text()).get("eos_token_id")
            ids.update(int(i) for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int))
    return sorted(ids)


def count_tokens(tokenizer: object, texts: Iterable[str]) -> Counter[int]:
    """How often each token id occurs in `texts` (no special tokens added)."""
    # A fast tokenizer's backend encodes without transformers' "longer than model_max_length" warning,
    # which means nothing here (no model sees these ids).
    backend = getattr(tokenizer, "backend_tokenizer", None)
    counts: Counter[int] = Counter()
    for text in texts:
        for start in range(0, len(text), CHUNK_CHARS):
            piece = text[start : start + CHUNK_CHARS]
            if backend is not None:
                counts.update(backend.encode(piece, add_special_tokens=False).ids)
            else:
                counts.update(tokenizer.encode(piece, add_special_tokens=False))  # type: ignore[attr-defined]
    return counts


def rank_ids(counts: Counter[int], always: Iterable[int], size: int, vocab_size: int) -> list[int]:
    """`always` (in order), then the most frequent other ids (ties by id), `size` ids in all, each in
    0..vocab_size - 1."""
    first = [i for i in dict.fromkeys(always) if 0 <= i < vocab_size]
    if size < len(first):
        raise InputError(f"size {size} is smaller than the {len(first)} special tokens a map always holds")
    taken = set(first)
    ranked = sorted((i for i in counts if i not in taken and 0 <= i < vocab_size), key=lambda i: (-counts[i], i))
    return first + ranked[: size - len(first)]


def build_token_map(target: str | Path, corpus: str | Path, size: int) -> tuple[list[int], dict[str, int]]:
    """(ids, facts) for the target checkpoint's tokenizer over `corpus`: see the module docstring.
    facts: files, tokens counted, distinct ids seen, vocabulary size, and the share of the corpus's
    tokens the map covers (per mille: an upper bound on how often the target's token is in the map)."""
    from transformers import AutoConfig, AutoTokenizer

    target = Path(target)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"size must be a positive int, got {size!r}")
    files = corpus_files(corpus)
    if not target.is_dir():
        raise InputError(f"target {target}: no such checkpoint directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(target)
    except (OSError, ValueError) as error:
        raise InputError(f"target {target}: no tokenizer could be loaded ({error})") from None
    vocab_size = int(AutoConfig.from_pretrained(target).vocab_size)
    if size > vocab_size:
        raise InputError(f"size {size} exceeds the target's vocabulary of {vocab_size} ids")
    counts = count_tokens(tokenizer, (file.read_text(errors="replace") for file in files))
    ids = rank_ids(counts, special_ids(tokenizer, target), size, vocab_size)
    total = sum(counts.values())
    covered = sum(counts[i] for i in ids)
    facts = {
        "files": len(files),
        "tokens": total,
        "distinct": len(counts),
        "vocab_size": vocab_size,
        "coverage_per_mille": round(1000 * covered / total) if total else 0,
    }
    return ids, facts
