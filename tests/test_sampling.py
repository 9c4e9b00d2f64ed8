"""Reference-token sampling and exit candidates (sampling.py, DESIGN.md §5)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from dex_adapt.sampling import Sampler, SamplingConfig, propose


def random_logits(seed: int, vocab: int = 50, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * scale


def reference_kept(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None):
    """Straightforward reference of HF's order: temperature, then top-k, then top-p.

    Returns {token: probability} over the kept tokens (float64, plain Python).
    top-k keeps every token whose logit is >= the k-th largest (ties included);
    top-p keeps tokens in descending order until the kept mass reaches p (the crossing token kept).
    """
    scaled = [float(x) / temperature for x in logits.tolist()]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = order
    if top_k is not None and top_k < len(scaled):
        kth = scaled[order[top_k - 1]]
        kept = [i for i in order if scaled[i] >= kth]
    z = max(scaled[i] for i in kept)
    weights = {i: math.exp(scaled[i] - z) for i in kept}
    total = sum(weights.values())
    probs = {i: w / total for i, w in weights.items()}
    if top_p is not None and top_p < 1:
        mass, nucleus = 0.0, []
        for i in kept:
            if mass >= top_p:
                break
            nucleus.append(i)
            mass += probs[i]
        total = sum(probs[i] for i in nucleus)
        probs = {i: probs[i] / total for i in nucleus}
    return probs


def cumulative_masses(logits, temperature, top_k):
    """Kept masses before each token in top-p order, to keep random p away from float boundaries."""
    probs = reference_kept(logits, temperature, top_k, None)
    mass, out = 0.0, []
    for p in sorted(probs.values(), reverse=True):
        mass += p
        out.append(mass)
    return out


def test_greedy_is_argmax():
    sampler = Sampler(SamplingConfig())
    for seed in range(20):
        logits = random_logits(seed)
        for position in (0, 5, 99):
            assert sampler(logits, position) == int(logits.argmax())
    assert SamplingConfig().greedy and not SamplingConfig(temperature=0.5).greedy


CONFIGS = [(t, k, p) for t in (0.5, 1.0, 2.0) for k in (None, 1, 3, 10, 50, 80) for p in (None, 0.1, 0.5, 0.9, 1.0)]


@pytest.mark.parametrize("temperature,top_k,top_p", CONFIGS)
def test_filtered_probs_match_the_reference(temperature, top_k, top_p):
    for seed in range(10):
        logits = random_logits(seed)
        if top_p is not None and top_p < 1:
            # keep p at least 1e-4 away from every cumulative boundary (float32 vs float64)
            assert all(abs(m - top_p) > 1e-4 for m in cumulative_masses(logits, temperature, top_k)), seed
        expected = reference_kept(logits, temperature, top_k, top_p)
        probs = Sampler(SamplingConfig(temperature, top_k, top_p)).filtered_probs(logits)
        assert probs.dtype == torch.float32 and probs.shape == logits.shape
        assert set(torch.nonzero(probs).flatten().tolist()) == set(expected)
        want = torch.zeros_like(probs)
        for i, p in expected.items():
            want[i] = p
        torch.testing.assert_close(probs, want, rtol=1e-5, atol=1e-6)


def test_filtered_probs_match_hf_warpers():
    """The same kept set and probabilities as transformers' own temperature/top-k/top-p warpers."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    for seed in range(30):
        rng = random.Random(seed)
        t, k, p = rng.choice([0.3, 0.7, 1.0, 1.6]), rng.choice([None, 1, 5, 20]), rng.choice([None, 0.3, 0.8, 0.95])
        logits = random_logits(seed)
        scores = TemperatureLogitsWarper(t)(None, logits[None].clone())
        if k is not None:
            scores = TopKLogitsWarper(k)(None, scores)
        if p is not None:
            scores = TopPLogitsWarper(p)(None, scores)
        hf = torch.softmax(scores[0], -1)
        ours = Sampler(SamplingConfig(t, k, p)).filtered_probs(logits)
        assert torch.equal(hf > 0, ours > 0), (t, k, p)
        torch.testing.assert_close(ours, hf, rtol=1e-5, atol=1e-6)


def test_top_k_keeps_ties():
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0, 0.0])
    probs = Sampler(SamplingConfig(1.0, top_k=2)).filtered_probs(logits)
    assert set(torch.nonzero(probs).flatten().tolist()) == {1, 3}
    probs = Sampler(SamplingConfig(1.0, top_k=3)).filtered_probs(logits)
    assert set(torch.nonzero(probs).flatten().tolist()) == {1, 2, 3, 4}


def test_top_p_keeps_the_crossing_token():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = lambda p: set(torch.nonzero(Sampler(SamplingConfig(1.0, top_p=p)).filtered_probs(logits)).flatten().tolist())
    assert kept(0.4) == {0}
    assert kept(0.6) == {0, 1}
    assert kept(0.9) == {0, 1, 2}
    assert kept(0.99) == {0, 1, 2, 3}
    assert kept(1e-6) == {0}  # never empty


def test_same_seed_and_position_same_token():
    config = SamplingConfig(temperature=1.0, seed=123)
    logits = random_logits(0, scale=1.0)
    a, b = Sampler(config), Sampler(config)
    first = [a(logits, p) for p in range(200)]
    # Order of calls and interleaved other positions do not matter: (seed, position) alone decides.
    assert [b(logits, p) for p in reversed(range(200))][::-1] == first
    assert [a(logits, p) for p in range(200)] == first


def test_different_seeds_and_positions_differ_somewhere():
    logits = random_logits(1, scale=0.5)  # flat-ish: many tokens likely
    draws = {seed: [Sampler(SamplingConfig(1.0, seed=seed))(logits, p) for p in range(64)] for seed in range(5)}
    for s in range(5):
        for t in range(s + 1, 5):
            assert draws[s] != draws[t]
    assert len(set(draws[0])) > 5  # positions give different draws too


def test_samples_follow_the_filtered_distribution_and_never_leave_it():
    logits = random_logits(2, vocab=12, scale=1.0)
    for k, p in [(None, None), (4, None), (None, 0.7), (6, 0.8)]:
        sampler = Sampler(SamplingConfig(0.9, k, p, seed=5))
        probs = sampler.filtered_probs(logits)
        n = 4000
        counts = torch.bincount(torch.tensor([sampler(logits, pos) for pos in range(n)]), minlength=12).double()
        assert bool((counts[probs == 0] == 0).all())
        # 4000 draws: each frequency within 5 standard deviations of its probability.
        sd = torch.sqrt(probs.double() * (1 - probs.double()) / n)
        assert bool(((counts / n - probs.double()).abs() <= 5 * sd + 1e-9).all()), (k, p)


def test_top_k_one_is_argmax_at_any_temperature():
    for seed in range(10):
        logits = random_logits(seed)
        sampler = Sampler(SamplingConfig(temperature=5.0, top_k=1, seed=seed))
        assert all(sampler(logits, p) == int(logits.argmax()) for p in range(20))


def test_sampling_config_validation():
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-0.1)
    with pytest.raises(ValueError, match="top-k"):
        SamplingConfig(temperature=1.0, top_k=0)
    for bad in (0.0, -0.5, 1.01):
        with pytest.raises(ValueError, match="top-p"):
            SamplingConfig(temperature=1.0, top_p=bad)
    SamplingConfig(temperature=1.0, top_k=1, top_p=1.0)


def test_propose_masks_excluded_and_reports_unmasked_probability():
    logits = torch.stack([random_logits(s, vocab=20) for s in range(4)])
    probs = torch.softmax(logits, -1)
    ranked = probs.argsort(-1, descending=True)
    exclude = (
        (),  # nothing excluded: argmax
        (int(ranked[1, 0]),),  # the argmax excluded: runner-up
        (int(ranked[2, 0]), int(ranked[2, 1]), -1),  # two excluded, -1 (an exit that proposed nothing) ignored
        (int(ranked[3, 5]),),  # excluding a non-argmax token changes nothing
    )
    tokens, conf = propose(logits, exclude)
    assert tokens.tolist() == [int(ranked[0, 0]), int(ranked[1, 1]), int(ranked[2, 2]), int(ranked[3, 0])]
    expected = probs.gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(conf, expected)
    assert tokens.dtype == torch.long and conf.shape == (4,)


def test_propose_accepts_half_precision_logits():
    logits = random_logits(0, vocab=30)[None].to(torch.bfloat16)
    tokens, conf = propose(logits, ((),))
    assert int(tokens[0]) == int(logits.float().argmax()) and conf.dtype == torch.float32
