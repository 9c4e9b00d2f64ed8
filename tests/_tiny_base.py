"""A tiny random Qwen3 base + byte-level BPE tokenizer on disk, for trainer tests (no download)."""

from __future__ import annotations

import json
import os


def python_snippets(n: int = 40) -> list[str]:
    """Small deterministic Python documents (stand-in corpus)."""
    docs = []
    for i in range(n):
        docs.append(
            f"def f{i}(x, y):\n    \"\"\"Return x plus {i} times y.\"\"\"\n    total = x + {i} * y\n"
            f"    for k in range({i % 7 + 1}):\n        total += k\n    return total\n"
        )
    return docs


def make_tiny_base(path: str, layers: int = 4, hidden: int = 32, seed: int = 0, initializer_range: float = 0.3) -> str:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(python_snippets(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    config = Qwen3Config(
        vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=256,
        tie_word_embeddings=False, eos_token_id=fast.eos_token_id, pad_token_id=fast.eos_token_id,
        bos_token_id=None, initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def write_corpus(dir_path: str) -> tuple[str, str, str]:
    """(train jsonl, eval jsonl, prompts jsonl) under dir_path."""
    os.makedirs(dir_path, exist_ok=True)
    docs = python_snippets(60)
    paths = []
    for name, rows in (("train.jsonl", docs[:48]), ("eval.jsonl", docs[48:])):
        p = os.path.join(dir_path, name)
        with open(p, "w") as f:
            for d in rows:
                f.write(json.dumps({"text": d}) + "\n")
        paths.append(p)
    p = os.path.join(dir_path, "prompts.jsonl")
    with open(p, "w") as f:
        for i in range(6):
            f.write(json.dumps({"prompt": f"def g{i}(a, b):\n    "}) + "\n")
    paths.append(p)
    return tuple(paths)


def tiny_config(root: str, base: str, out: str, **train) -> str:
    """A distill YAML for the tiny base; `train` overrides train-section fields."""
    import yaml

    train_jsonl, eval_jsonl, prompts = write_corpus(os.path.join(root, "data"))
    cfg = {
        "model": {"path": base},
        "adapter": {"bottleneck_size": 16},
        "data": {"train_sources": [train_jsonl], "eval_sources": [eval_jsonl], "seq_len": 32,
                 "max_train_blocks": 64, "max_eval_blocks": 8, "prompts": prompts, "max_new_tokens": 24,
                 "generation_batch_size": 4, "cache_dir": os.path.join(root, "cache")},
        "train": {"output_dir": out, "steps": 30, "micro_batch_size": 4, "lr": 0.01, "warmup_steps": 2,
                  "log_every": 5, "save_every": 0, "report_to": "tensorboard", "threads": 1, **train},
    }
    path = os.path.join(root, f"distill-{os.path.basename(out)}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def tiny_model(seed: int = 0, layers: int = 4, hidden: int = 32, vocab: int = 96):
    """A tiny random Qwen3ForCausalLM built from a config (no tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()
