"""Single-process executor: collapse frees KV, so the pool tracks the committed prefix."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dex_adapt.decoder import DexConfig, DexDecoder
from dex_adapt.executor import SingleProcessExecutor
from dex_adapt.sampling import Sampler, SamplingConfig


def test_discarded_subtrees_free_their_kv_over_1000_tokens(monkeypatch):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         eos_token_id=None, bos_token_id=None, initializer_range=0.3)
    model = LlamaForCausalLM(config).eval()
    decoder = DexDecoder(model, DexConfig(explorers=4))
    executors = []
    original = SingleProcessExecutor.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        executors.append(self)

    monkeypatch.setattr(SingleProcessExecutor, "__init__", spy)
    prompt = [1, 2, 3]
    output, stats = decoder.generate(prompt, max_new_tokens=1000)  # long enough to show the pool does not grow
    assert len(output) == 1000
    cache = executors[0].cache
    # Committed: the prompt prefix (2 tokens) + one slot per committed anchor.
    assert cache.committed_slots == len(prompt) - 1 + 1000
    # The pool never exceeded committed prefix + the most branches alive at once.
    assert cache.high_water <= cache.committed_slots + stats.max_live_branches
    assert stats.max_live_branches <= 2 ** 4
    assert cache.live_slots <= stats.max_live_branches
    assert executors[0].runner.hidden.keys() <= {b for b in executors[0].cache.slot_of}


def test_sampled_decode_matches_plain_ar_sampler():
    from dex_adapt.ar import ar_decode

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=80, hidden_size=48, intermediate_size=96, num_hidden_layers=5,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         eos_token_id=2, initializer_range=0.3)
    model = LlamaForCausalLM(config).eval()
    sampling = SamplingConfig(temperature=0.9, top_k=30, top_p=0.95, seed=11)
    prompt = [5, 9, 13, 17]
    expected, _ = ar_decode(model, prompt, 40, Sampler(sampling), {2})
    for exits in [(5,), (1, 5), (2, 3, 5), (1, 2, 3, 4, 5)]:
        output, _ = DexDecoder(model, DexConfig(exits=exits), sampling).generate(prompt, 40)
        assert output == expected, exits
