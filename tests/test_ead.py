"""EAD: the definition on hand-made predictions, the recorder against plain decoding, the dex-ead CLI."""

from __future__ import annotations

import json

import pytest
import torch

from dex_adapt.ead import PromptTrace, ead_depth, ead_summary, exit_of_depth, exit_summary, exit_trace
from dex_adapt.exploration import ExplorationSet


def agreeing_model(layers: int = 4, seed: int = 0):
    """A tiny random Qwen3 whose layers write little into the residual stream, so shallow exits
    often (not always) agree with the final token: every EAD case occurs."""
    from tiny_models import TinySpec, build_model

    model = build_model(TinySpec("qwen3", seed=seed, layers=layers, hidden=32, vocab=64, max_positions=128))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(0.1)
            layer.self_attn.o_proj.weight.mul_(0.1)
    return model


def test_ead_depth_is_the_start_of_the_final_agreeing_run():
    assert ead_depth([7, 7, 7, 7], 7) == 1
    assert ead_depth([5, 7, 7, 7], 7) == 2
    assert ead_depth([7, 5, 7, 7], 7) == 3  # an early transient match does not count
    assert ead_depth([1, 2, 3, 9], 9) == 4
    assert ead_depth([9, 9, 9, 8], 9) == 4  # a sampled token the final argmax did not pick: only depth L
    assert ead_depth([4], 4) == 1


def test_exit_of_depth():
    exits = (4, 8, 12, 16)
    assert [exit_of_depth(d, exits) for d in (1, 4, 5, 8, 9, 16)] == [0, 0, 1, 1, 2, 3]
    with pytest.raises(ValueError):
        exit_of_depth(17, exits)


HAND = PromptTrace(
    prompt_ids=[1, 2],
    tokens=[7, 8, 9],
    lens=[[7, 7, 7, 7], [8, 1, 8, 8], [0, 0, 0, 9]],
    adapted=[[7, 7, 7, 7], [8, 8, 8, 8], [0, 9, 9, 9]],
    max_new_tokens=3,
)


def test_exit_trace_and_summaries_on_hand_predictions():
    x = ExplorationSet((2, 4), 4)
    et = exit_trace(HAND, x)
    assert et.candidates == ((7, 7), (1, 8), (0, 9))
    assert et.ead_exit == (0, 1, 1)  # EADs 1, 3, 4 -> exits containing them
    assert exit_trace(HAND, x, adapters=True).ead_exit == (0, 0, 0)  # EADs 1, 1, 2
    s = ead_summary([HAND])
    assert s["ead_histogram"] == [1, 0, 1, 1] and s["mean_ead"] == pytest.approx(8 / 3)
    assert s["agreement"] == pytest.approx([2 / 3, 1 / 3, 2 / 3, 1.0])
    assert ead_summary([HAND], adapters=True)["ead_histogram"] == [2, 1, 0, 0]
    per_exit = exit_summary([HAND], ExplorationSet((1, 2, 4), 4))
    assert per_exit["oracle_exit_histogram"] == [1, 0, 2]
    assert per_exit["shallowest_match_histogram"] == [2, 0, 1]  # x_1 matches at depth 1 (transiently)
    with pytest.raises(ValueError):
        PromptTrace([1], [2], [[2]], None, 1).table(adapters=True)


def test_recorded_predictions_are_plain_decoding_and_the_exits():
    from dex_adapt.ar import hf_greedy
    from dex_adapt.ead import record_traces

    model = agreeing_model()
    prompts = [[3, 17, 42, 8], [5, 6]]
    traces = record_traces(model, prompts, 10)
    for prompt, trace in zip(prompts, traces):
        assert trace.tokens == hf_greedy(model, prompt, 10, set())
        assert all(row[-1] == x for row, x in zip(trace.lens, trace.tokens))
        with torch.no_grad():  # one full forward; the lens by hand: lm_head(norm(h_d)), h_L's logits
            out = model(torch.tensor([prompt + trace.tokens[:-1]]), output_hidden_states=True)
            lens = [model.lm_head(model.model.norm(out.hidden_states[d]))[0] for d in range(1, 4)] + [out.logits[0]]
        for t, row in enumerate(trace.lens):
            pos = len(prompt) - 1 + t
            assert row == [int(logits[pos].argmax()) for logits in lens], (t, row)
    depths = ead_summary(traces)["ead_histogram"]
    assert depths[0] > 0 and sum(depths[1:]) > 0  # the model exercises both easy and hard tokens


@pytest.fixture(scope="module")
def base_and_adapters(tmp_path_factory):
    from peft import get_peft_model

    from dex_adapt.adapters import InducingConfig, exit_adapters, save_exit_adapters

    root = tmp_path_factory.mktemp("ead")
    base = root / "base"
    agreeing_model().save_pretrained(base)
    peft_model = get_peft_model(agreeing_model(), InducingConfig(bottleneck_size=8, exit_depths=[2, 3]))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for adapter in exit_adapters(peft_model).values():
            for p in adapter.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    ckpt = root / "adapters"
    save_exit_adapters(peft_model, str(ckpt), base=str(base))
    return str(base), str(ckpt)


def test_dex_ead_cli_writes_json_and_plots(base_and_adapters, tmp_path, capsys):
    from dex_adapt.cli.ead import main

    base, ckpt = base_and_adapters
    out = tmp_path / "ead"
    assert main(["--model", base, "--adapters", ckpt, "--prompt-ids", "3,17,42,8", "--prompt-ids", "5,6",
                 "--max-new-tokens", "8", "--exits", "2,4", "--out", str(out)]) == 0
    result = json.loads((out / "ead.json").read_text())
    assert result["adapter_depths"] == [2, 3] and result["num_layers"] == 4
    for kind in ("lens", "adapters"):
        s = result[kind]
        assert s["tokens"] == 16 and sum(s["ead_histogram"]) == 16 and len(s["agreement"]) == 4
        assert s["agreement"][-1] == 1.0
    assert result["lens"]["agreement"][0] == result["adapters"]["agreement"][0]  # no adapter at depth 1
    (entry,) = result["exploration_sets"]
    assert entry["exits"] == [2, 4] and len(entry["lens"]["oracle_exit"]) == 2
    assert sum(entry["adapters"]["shallowest_match_histogram"]) == 16
    for png in ("ead_histogram.png", "agreement.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mean EAD" in capsys.readouterr().out


def test_dex_ead_cli_bad_input_is_one_line(tmp_path, capsys):
    from dex_adapt.cli.ead import main

    assert main(["--model", str(tmp_path / "missing"), "--prompt-ids", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dex-ead: error:")
