"""Byte-level BPE tokenizer for the embedded base model, trained offline with `tokenizers`.

Byte-level BPE never produces an unknown token, so any Python source (or any text at all) round
trips exactly. `<|endoftext|>` separates files in the training stream and is the model's EOS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

__all__ = ["EOS_TOKEN", "train_bpe", "wrap_fast", "load_tokenizer"]

EOS_TOKEN = "<|endoftext|>"


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of `vocab_size` tokens (EOS is id 0) on `texts`."""
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False keeps "def" at file start and after newlines the same token sequence
    # as in the middle of a file; code has no leading-space convention to preserve.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_iter(texts), trainer=trainer)
    return tok


def _iter(texts: Iterable[str]) -> Iterator[str]:
    yield from texts


def wrap_fast(tok: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    """The HF wrapper that `AutoTokenizer.from_pretrained(dir)` reloads offline."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=None,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Reload a tokenizer saved by `wrap_fast(...).save_pretrained(path)`."""
    return PreTrainedTokenizerFast.from_pretrained(str(path))
