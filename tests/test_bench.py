"""decode/bench.py --quick on a tiny random model: every method, the schema, and cross-checks."""

from __future__ import annotations

import json

import pytest
import torch

from dex_adapt.bench import METHODS, RUN_FIELDS, BenchConfig, default_nonuniform, divisor_explorers, exploration_sets
from scripts import load_script


def test_sweep_sets():
    assert divisor_explorers(16) == (2, 4, 8, 16)
    assert divisor_explorers(6) == (2, 3, 6)
    assert default_nonuniform(16) == ((8, 12, 14, 16), (2, 4, 8, 16))
    sets = exploration_sets(BenchConfig(explorers=(4, 2)), 16)
    assert [x.exits for x in sets] == [(8, 16), (2, 4, 8, 16), (4, 8, 12, 16), (8, 12, 14, 16)]


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    from tiny_models import TinySpec, build_model

    root = tmp_path_factory.mktemp("bench")
    model = build_model(TinySpec("qwen3", seed=0, layers=4, hidden=32, vocab=64, max_positions=128))
    with torch.no_grad():  # small residual writes: shallow exits often agree with the final token
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(0.1)
            layer.self_attn.o_proj.weight.mul_(0.1)
    model.save_pretrained(root / "tiny")
    out = root / "out"
    rc = load_script("decode/bench.py").main(["--quick", "--model", str(root / "tiny"), "--prompt-ids", "3,17,42,8",
                                   "--prompt-ids", "5,6", "--max-new-tokens", "8", "--no-progress",
                                   "--out", str(out)])
    return rc, out


def test_quick_bench_holds_every_method_with_the_schema(quick_bench):
    rc, out = quick_bench
    assert rc == 0
    bench = json.loads((out / "bench.json").read_text())
    assert bench["model"] == "tiny" and len(bench["prompts"]) == 2
    runs = bench["runs"]
    assert {r["method"] for r in runs} == set(METHODS)
    for r in runs:
        assert set(RUN_FIELDS) <= set(r), r
        assert isinstance(r["adapters"], bool)
    for r in runs:
        if r["method"] in ("hf_generate", "hf_early_exit"):
            assert r["ticks_per_token"] is None and r["tokens_per_s"] > 0
        else:
            assert r["explorers"] == len(r["exits"]) and r["ticks_per_token"] > 0
    dex = [r for r in runs if r["method"] == "dex"]
    assert all(r["lossless"] for r in dex) and all(r["tokens_per_s"] > 0 for r in dex)
    assert {r["decs"] for r in dex} == {True, False} and {r["policy"] for r in dex if r["width"]} == {"confidence", "fifo"}
    assert all(r["lossless"] for r in runs if r["method"].startswith("hf_"))
    for family in ("single_exit", "layerskip"):
        for exits in {tuple(r["exits"]) for r in runs if r["method"] == family}:
            group = [r for r in runs if r["method"] == family and tuple(r["exits"]) == exits]
            (best,) = [r for r in group if r["best"]]
            assert best["ticks_per_token"] == min(r["ticks_per_token"] for r in group)
    assert all(r.get("checked") for r in runs if r["method"] == "layerskip" and r["best"])


def test_quick_bench_dex_matches_the_bounds(quick_bench):
    """DEX without DECS at unbounded width *is* the shallowest-match bound (run vs pure function);
    AR costs N ticks per token; nothing beats 1 tick per token."""
    _, out = quick_bench
    runs = json.loads((out / "bench.json").read_text())["runs"]
    bound = {tuple(r["exits"]): r["ticks_per_token"] for r in runs if r["method"] == "shallowest_match"}
    for r in runs:
        if r["method"] == "dex" and r["width"] is None and not r["decs"]:
            assert r["ticks_per_token"] == pytest.approx(bound[tuple(r["exits"])], abs=1e-12)
        if r["method"] == "ar":
            assert r["ticks_per_token"] == r["explorers"] and r["speedup_vs_ar"] == 1.0
        if r["ticks_per_token"] is not None:
            assert r["ticks_per_token"] >= 1.0


def test_quick_bench_writes_table_and_plots(quick_bench):
    _, out = quick_bench
    md = (out / "bench.md").read_text()
    assert "| lens | 2,4 | 2 |" in md and "Admission policy" in md and "Wall clock" in md
    for png in ("ticks_per_token", "speedup", "headroom", "stage_forwards", "ead_histogram", "agreement"):
        assert (out / f"{png}.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_bad_input_is_one_line(tmp_path, capsys):
    from tiny_models import TinySpec, build_model

    build_model(TinySpec("qwen3", layers=4, hidden=32, vocab=64)).save_pretrained(tmp_path / "m")
    rc = load_script("decode/bench.py").main(["--model", str(tmp_path / "m"), "--prompt-ids", "1,2", "--explorers", "5",
                                   "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench.py: error:") and "explorers" in err[0]


def test_replot_merges_runs_without_decoding(quick_bench, tmp_path):
    _, out = quick_bench
    again = tmp_path / "replot"
    assert load_script("decode/bench.py").main(["--replot", str(out / "bench.json"), str(out / "bench.json"),
                                     "--out", str(again)]) == 0
    merged = json.loads((again / "bench.json").read_text())
    original = json.loads((out / "bench.json").read_text())
    assert len(merged["runs"]) == len(original["runs"])  # duplicates dropped
    assert (again / "bench.md").read_text() == (out / "bench.md").read_text()
    assert (again / "ticks_per_token.png").is_file()
