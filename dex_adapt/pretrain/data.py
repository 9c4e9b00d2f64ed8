"""Token streams for pretraining: files -> one EOS-separated token stream -> fixed-length chunks.

The streams are cached in the work dir (safetensors, int32) together with the tokenizer, so a
restarted run sees exactly the same tokens. Batches are a pure function of (seed, step): chunk
order is a per-epoch permutation seeded by `seed + epoch`, which is what makes resume exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .corpus import StdlibSplit, fingerprint, read_source, shuffled, split_stdlib
from .tokenizer import EOS_TOKEN, load_tokenizer, train_bpe, wrap_fast

__all__ = ["PreparedData", "prepare_data", "batch_for_step", "num_chunks"]


class PreparedData:
    """Train/held-out token streams plus the tokenizer and the file-list fingerprints."""

    def __init__(self, train: torch.Tensor, heldout: torch.Tensor, tokenizer, meta: dict):
        self.train = train  # [N_train] int64
        self.heldout = heldout  # [N_heldout] int64
        self.tokenizer = tokenizer
        self.meta = meta


def _stream(tokenizer, root: Path, files: list[str]) -> torch.Tensor:
    texts = [read_source(root, rel) for rel in files]
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    ids: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


def prepare_data(work_dir: Path, *, seed: int, vocab_size: int, context_length: int,
                 max_train_files: int = 0, max_heldout_files: int = 0,
                 split: StdlibSplit | None = None, log=print) -> PreparedData:
    """Build (or reload from `work_dir/data`) the tokenizer and both token streams."""
    data_dir = Path(work_dir) / "data"
    meta_path = data_dir / "meta.json"
    settings = {"seed": seed, "vocab_size": vocab_size, "max_train_files": max_train_files,
                "max_heldout_files": max_heldout_files}
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("settings", settings) != settings:
            raise ValueError(f"{data_dir} was prepared with {meta['settings']}, not {settings}; "
                             "use a fresh work_dir")
        streams = load_file(str(data_dir / "tokens.safetensors"))
        tok = load_tokenizer(data_dir / "tokenizer")
        log(f"data: reloaded {meta['train_tokens']} train / {meta['heldout_tokens']} held-out tokens")
        return PreparedData(streams["train"].long(), streams["heldout"].long(), tok, meta)

    split = split or split_stdlib()
    train_files = shuffled(split.train, seed)
    heldout_files = shuffled(split.heldout, seed)
    if max_train_files:
        train_files = train_files[:max_train_files]
    if max_heldout_files:
        heldout_files = heldout_files[:max_heldout_files]
    log(f"data: {len(train_files)} train / {len(heldout_files)} held-out files under {split.root}")
    texts = (read_source(split.root, rel) for rel in train_files)
    tok = wrap_fast(train_bpe(texts, vocab_size), model_max_length=context_length)
    train = _stream(tok, split.root, train_files)
    heldout = _stream(tok, split.root, heldout_files)
    meta = {
        "stdlib_root": str(split.root),
        "train_files": len(train_files),
        "heldout_files": len(heldout_files),
        # Fingerprints are over the sorted (unshuffled) lists: they name the data, not the order.
        "train_fingerprint_sha256": fingerprint(sorted(train_files)),
        "heldout_fingerprint_sha256": fingerprint(sorted(heldout_files)),
        "train_tokens": int(train.numel()),
        "heldout_tokens": int(heldout.numel()),
        "vocab_size": len(tok),
        "settings": settings,
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(data_dir / "tokenizer"))
    save_file({"train": train, "heldout": heldout}, str(data_dir / "tokens.safetensors"))
    meta_path.write_text(json.dumps(meta, indent=2))
    log(f"data: {meta['train_tokens']} train / {meta['heldout_tokens']} held-out tokens")
    return PreparedData(train.long(), heldout.long(), tok, meta)


def num_chunks(stream: torch.Tensor, context_length: int) -> int:
    return stream.numel() // context_length


def batch_for_step(stream: torch.Tensor, step: int, *, batch_size: int, context_length: int,
                   seed: int) -> torch.Tensor:
    """The [batch_size, context_length] batch of optimizer step `step` (0-based)."""
    n = num_chunks(stream, context_length)
    if n < batch_size:
        raise ValueError(f"training stream has {n} chunks of {context_length}, need {batch_size}")
    per_epoch = n // batch_size
    epoch, k = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=g)[k * batch_size:(k + 1) * batch_size]
    starts = order * context_length
    idx = starts[:, None] + torch.arange(context_length)[None, :]
    return stream[idx]  # [B, T]
