"""Token blocks for self-distillation: a corpus plus the base model's own continuations.

Both halves are built once with `datasets` and cached on disk under `data.cache_dir`, keyed by a
hash of everything that shapes them (sources, tokenizer, block length, caps; for continuations
also the base fingerprint and the sampling settings), so a resumed or repeated run reads the same
blocks. Documents are packed into `seq_len` blocks separated by EOS; the distillation loss is
taken at every position (the teacher is the base itself, so there is no label to mask).

Continuations matter because the decoder's exits see the model's own prefixes, not a corpus'
(DESIGN.md §6).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterable, Iterator

import torch
from tqdm.auto import tqdm

from .config import DataSection

__all__ = ["iter_texts", "pack_blocks", "corpus_blocks", "load_prompts", "continuation_blocks"]

_TEXT_EXTENSIONS = (".txt", ".py", ".md", ".rst")


def iter_texts(sources: list[str], text_field: str = "text", seed: int = 0) -> Iterator[str]:
    """Documents from each source in turn (see `DataSection.train_sources` for the forms)."""
    from datasets import load_dataset

    for source in sources:
        if source.startswith("stdlib:"):
            from dex_adapt.pretrain.corpus import read_source, shuffled, split_stdlib

            part = source.split(":", 1)[1]
            if part not in ("train", "heldout"):
                raise ValueError(f"data source {source!r}: use stdlib:train or stdlib:heldout")
            split = split_stdlib()
            for rel in shuffled(getattr(split, part), seed):
                yield read_source(split.root, rel)
        elif source.startswith("hub:"):
            for row in load_dataset(source[4:], split="train", streaming=True):
                yield row[text_field]
        else:
            paths = sorted(glob.glob(source, recursive=True))
            if not paths:
                raise FileNotFoundError(f"data source {source!r} matches no file")
            for path in paths:
                yield from _file_texts(path, text_field)


def _file_texts(path: str, text_field: str) -> Iterator[str]:
    from datasets import load_dataset

    if path.endswith(_TEXT_EXTENSIONS):
        ds = load_dataset("text", data_files=path, sample_by="document", split="train")
        text_field = "text"
    elif path.endswith((".jsonl", ".json")):
        ds = load_dataset("json", data_files=path, split="train")
    elif path.endswith(".parquet"):
        ds = load_dataset("parquet", data_files=path, split="train")
    else:
        raise ValueError(f"data file {path!r}: unsupported extension (txt, py, md, rst, jsonl, json, parquet)")
    if text_field not in ds.column_names:
        raise ValueError(f"data file {path!r} has no column {text_field!r} (columns: {ds.column_names})")
    for row in ds:
        yield row[text_field]


def pack_blocks(token_docs: Iterable[list[int]], seq_len: int, eos_id: int, max_blocks: int = 0) -> list[list[int]]:
    """Concatenate documents (each followed by EOS) and cut `seq_len` blocks; drop the remainder."""
    blocks: list[list[int]] = []
    buffer: list[int] = []
    for ids in token_docs:
        buffer.extend(ids)
        buffer.append(eos_id)
        while len(buffer) >= seq_len:
            blocks.append(buffer[:seq_len])
            buffer = buffer[seq_len:]
            if max_blocks and len(blocks) >= max_blocks:
                return blocks
    return blocks


def _cache_path(cfg: DataSection, kind: str, spec: dict) -> str:
    key = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return os.path.join(cfg.cache_dir, f"{kind}-{key}")


def _tokenizer_id(tokenizer) -> str:
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(vocab.encode()).hexdigest()[:16]


def _eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the base model's tokenizer has no EOS token; documents cannot be separated")
    return tokenizer.eos_token_id


def corpus_blocks(cfg: DataSection, tokenizer, which: str, accelerator=None):
    """`datasets.Dataset` with `input_ids` blocks from `train_sources` or `eval_sources` (cached)."""
    from datasets import Dataset, load_from_disk

    sources = cfg.train_sources if which == "train" else cfg.eval_sources
    max_blocks = cfg.max_train_blocks if which == "train" else cfg.max_eval_blocks
    spec = {"sources": sources, "field": cfg.text_field, "seq_len": cfg.seq_len, "max": max_blocks,
            "seed": cfg.seed, "tokenizer": _tokenizer_id(tokenizer)}
    path = _cache_path(cfg, f"corpus-{which}", spec)
    if not _is_main(accelerator):
        _wait(accelerator)
        return load_from_disk(path)
    if not os.path.isdir(path):
        docs = (tokenizer(text, add_special_tokens=False)["input_ids"]
                for text in iter_texts(sources, cfg.text_field, cfg.seed) if text)
        blocks = pack_blocks(docs, cfg.seq_len, _eos_id(tokenizer), max_blocks)
        if not blocks:
            raise ValueError(f"data sources {sources} gave no {cfg.seq_len}-token block")
        Dataset.from_dict({"input_ids": blocks}).save_to_disk(path)
        _write_spec(path, spec)
    _wait(accelerator)
    return load_from_disk(path)


def load_prompts(spec: str, limit: int = 0, seed: int = 0) -> list[str]:
    """Prompts for the base's own continuations.

    `stdlib:train`: snippets (2-12 whole lines) of the base's training files, so the evaluation
    prompts stay unseen; `humaneval`: the HumanEval prompts (then HumanEval is no longer a clean
    evaluation set for DEX with these adapters); `none`; or a jsonl file with a `prompt` field.
    """
    if spec == "none":
        return []
    if spec == "stdlib:train":
        return _stdlib_prompts(limit or 256, seed)
    if spec == "humaneval":
        from dex_adapt.prompts import humaneval_prompts

        prompts = [task["prompt"] for task in humaneval_prompts()]
    else:
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"prompt file not found: {spec}")
        with open(spec) as f:
            prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    return prompts[:limit] if limit else prompts


def _stdlib_prompts(n: int, seed: int) -> list[str]:
    import random

    from dex_adapt.pretrain.corpus import read_source, shuffled, split_stdlib

    split, rng, out = split_stdlib(), random.Random(seed), []
    for rel in shuffled(split.train, seed + 1):
        lines = read_source(split.root, rel).splitlines(keepends=True)
        if len(lines) < 4:
            continue
        start = rng.randrange(len(lines) - 2)
        snippet = "".join(lines[start:start + rng.randint(2, 12)])[:600]
        if snippet.strip():
            out.append(snippet)
        if len(out) == n:
            break
    return out


@torch.no_grad()
def _generate(model, tokenizer, prompts: list[str], cfg: DataSection, synced: bool, rank: int,
              num_batches: int) -> list[list[int]]:
    """Prompt + sampled continuation ids for each prompt (left-padded batches, pads stripped)."""
    eos = _eos_id(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    device = next(model.parameters()).device
    torch.manual_seed(cfg.seed * 1000 + rank)
    out: list[list[int]] = []
    bs = cfg.generation_batch_size
    # The same number of generate() calls on every rank: ZeRO-3 forwards are collective.
    for b in tqdm(range(num_batches), desc="continuations", disable=rank != 0):
        batch = prompts[b * bs:(b + 1) * bs] or prompts[:1] or ["\n"]
        encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in batch]
        width = max(len(e) for e in encoded)
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], device=device)
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)
        sample = cfg.generation_temperature > 0
        gen = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=cfg.max_new_tokens, do_sample=sample,
            temperature=cfg.generation_temperature if sample else None, top_k=0 if sample else None,
            top_p=1.0 if sample else None, pad_token_id=pad, eos_token_id=eos, synced_gpus=synced,
        )
        if b * bs >= len(prompts):
            continue  # a filler batch that kept this rank in step
        for row, enc in zip(gen.tolist(), encoded):
            cont = row[width:]
            if eos in cont:
                cont = cont[:cont.index(eos)]
            out.append(enc + cont)
    return out


def continuation_blocks(cfg: DataSection, tokenizer, model, fingerprint: str, accelerator=None,
                        synced_generate: bool = False):
    """Blocks of `prompt + continuation` by the base model itself (cached); None when no prompts."""
    from datasets import Dataset, load_from_disk

    prompts = load_prompts(cfg.prompts, cfg.num_prompts, cfg.seed)
    if not prompts:
        return None
    prompts = [p for p in prompts for _ in range(cfg.continuations_per_prompt)]
    spec = {"prompts": hashlib.sha256("\x00".join(prompts).encode()).hexdigest(), "base": fingerprint,
            "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.generation_temperature,
            "seed": cfg.seed, "seq_len": cfg.seq_len, "tokenizer": _tokenizer_id(tokenizer)}
    path = _cache_path(cfg, "continuations", spec)
    if os.path.isdir(path):  # every rank sees the cache (shared filesystem assumed, as for the base)
        return load_from_disk(path)
    rank = accelerator.process_index if accelerator is not None else 0
    world = accelerator.num_processes if accelerator is not None else 1
    mine = prompts[rank::world]
    per_rank = -(-len(prompts) // world)
    num_batches = -(-per_rank // cfg.generation_batch_size)
    sequences = _generate(model, tokenizer, mine, cfg, synced_generate, rank, num_batches)
    if accelerator is not None and world > 1:
        from accelerate.utils import gather_object

        sequences = gather_object(sequences)
    if _is_main(accelerator):
        blocks = pack_blocks(sequences, cfg.seq_len, _eos_id(tokenizer))
        Dataset.from_dict({"input_ids": blocks}).save_to_disk(path)
        _write_spec(path, spec)
    _wait(accelerator)
    return load_from_disk(path)


def _is_main(accelerator) -> bool:
    return accelerator is None or accelerator.is_main_process


def _wait(accelerator) -> None:
    if accelerator is not None:
        accelerator.wait_for_everyone()


def _write_spec(path: str, spec: dict) -> None:
    with open(os.path.join(path, "dex_spec.json"), "w") as f:
        json.dump(spec, f, indent=2, sort_keys=True, default=str)
