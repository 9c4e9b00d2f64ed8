"""decode/bench_pipeline.py: the dex-decode commands it runs, and --quick end to end on a tiny model (N = 2)."""

from __future__ import annotations

import json

import pytest

from dex_adapt.pipeline.bench import PipelineBenchConfig, decode_argv, summarise_decode
from scripts import load_script


def test_ar_is_dex_with_a_budget_of_one_branch():
    cfg = PipelineBenchConfig(model="m", explorers=4, width=3, max_branches=64, adapters="ckpt")
    ar, dex = (decode_argv(cfg, [[1, 2], [3, 4, 5]], mode) for mode in ("ar", "dex"))
    for argv in (ar, dex):
        assert "--pipeline" in argv and argv[argv.index("--explorers") + 1] == "4"
        assert [argv[i + 1] for i, a in enumerate(argv) if a == "--prompt-ids"] == ["1,2", "3,4,5"]
    assert ar[ar.index("--max-branches") + 1] == "1" and "--adapters" not in ar and "--width" not in ar
    assert dex[dex.index("--max-branches") + 1] == "64" and dex[dex.index("--width") + 1] == "3"
    assert dex[dex.index("--adapters") + 1] == "ckpt"


def test_summary_leaves_out_the_warmup_prompt():
    row = {"committed": 4, "ticks": 8, "wall_s": 0.5, "stage_forwards": 9, "fallbacks": 1, "accepted_by_exit": [2],
           "output_ids": [1, 2, 3, 4]}
    record = {"prompts": [dict(row, wall_s=9.0), row, dict(row, ticks=6, accepted_by_exit=[1])]}
    s = summarise_decode(record, warmup=1)
    assert (s["committed"], s["ticks"], s["wall_s"], s["accepted_by_exit"]) == (8, 14, 1.0, [3])
    assert s["tokens_per_s"] == 8.0 and s["ticks_per_token"] == 14 / 8 and s["per_tick_s"] == 1.0 / 14


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from _tiny_base import make_tiny_base

    return make_tiny_base(str(tmp_path_factory.mktemp("bench_pipeline") / "tiny"), layers=6, hidden=32)


def test_print_commands_and_bad_input(tiny_model_dir, capsys):
    script = load_script("decode/bench_pipeline.py")
    assert script.main(["--quick", "--model", tiny_model_dir, "--print-commands"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("dex-decode --model") for line in lines)
    assert "--max-branches 1 " in lines[0]
    assert script.main(["--model", tiny_model_dir, "--ar-json", "x.json"]) == 2
    assert "--dex-json" in capsys.readouterr().err


PROMPTS = [[3, 17, 42, 8, 9, 10, 11, 12, 13, 40], [5, 6, 7, 50, 51]]
WARMUP = PROMPTS[0][:8]  # the script's warm-up: the first prompt's first 8 tokens


def _decode_record(model_dir, max_branches, max_new=8):
    """What ``dex-decode --explorers 2 --json`` writes, from the single-process decoder (same tokens, ticks)."""
    from transformers import AutoModelForCausalLM

    from dex_adapt.decoder import DexConfig, DexDecoder

    decoder = DexDecoder(AutoModelForCausalLM.from_pretrained(model_dir).eval(),
                         DexConfig(explorers=2, max_branches=max_branches))
    rows = []
    for ids in (WARMUP, *PROMPTS):
        output, stats = decoder.generate(ids, max_new)
        rows.append({"output_ids": output, **stats.to_dict()})
    return {"prompts": rows}


def check_result(result, markdown, prompt_tokens):
    assert result["model"] == "tiny" and result["command"].startswith("python decode/bench_pipeline.py ")
    assert result["machine"]["torch_threads"] == 1 and result["machine"]["cpu_count"] >= 1
    config = result["config"]
    assert config["explorers"] == 2 and config["max_new_tokens"] == 8 and config["exits"] == [3, 6]
    assert config["prompt_tokens"] == prompt_tokens and config["warmup_prompt_tokens"] == 8
    assert result["lossless"] is True and result["ticks_match"] is True
    hf, ar, dex = result["hf_generate"], result["runs"]["ar"], result["runs"]["dex"]
    assert hf["committed"] == ar["committed"] == dex["committed"] > 0
    assert ar["ticks_per_token"] == 2.0 and ar["stage_forwards"] == ar["ticks"]  # N ticks per token, no speculation
    assert dex["ticks"] <= ar["ticks"] and len(dex["per_prompt"]) == len(prompt_tokens)
    for run in (hf, ar, dex):
        assert run["wall_s"] > 0 and run["tokens_per_s"] > 0
    assert set(result["speedup"]) == {"dex_vs_ar_pipelined", "dex_vs_hf", "ar_pipelined_vs_hf", "dex_vs_ar_ticks"}
    commands = result["decode_commands"]
    assert commands["ar"].startswith("dex-decode ") and "--max-branches 1" in commands["ar"]
    assert len(result["stage_s"]["ar"]) == len(result["stage_s"]["dex"]) == len(result["stages_together"]["wall"]) == 2
    assert result["stage_s"]["wall_over_compute"] > 0 and result["stages_together"]["wall_over_compute"] > 0
    assert result["replay"]["ar"]["several_stages_fraction"] == 0.0  # pipelined AR: one rank computes per tick
    for mode in ("ar", "dex"):
        tick = result["tick_model"][mode]
        assert tick["predicted_s"] > 0 and tick["measured_s"] > 0
        assert tick["measured_s"] == pytest.approx(result["runs"][mode]["wall_s"] / result["runs"][mode]["ticks"])
        assert {"replay_compute_s", "bookkeeping_s", "waiting_for_cores_s", "rest_s",
                "prefill_per_prompt_s"} <= set(tick)
    assert "pipelined DEX (N=2" in markdown and "HF generate" in markdown and "Command: `python" in markdown


def test_benchmark_from_records_of_runs_made_elsewhere(tiny_model_dir, tmp_path):
    """The multi-node path (--ar-json/--dex-json): everything but the launch, in a few seconds."""
    for mode, budget in (("ar", 1), ("dex", 256)):
        (tmp_path / f"{mode}.json").write_text(json.dumps(_decode_record(tiny_model_dir, budget)))
    out = tmp_path / "out"
    argv = ["--model", tiny_model_dir, "--explorers", "2", "--max-new-tokens", "8", "--reps", "3", "--out", str(out),
            "--ar-json", str(tmp_path / "ar.json"), "--dex-json", str(tmp_path / "dex.json")]
    for ids in PROMPTS:
        argv += ["--prompt-ids", ",".join(map(str, ids))]
    assert load_script("decode/bench_pipeline.py").main(argv) == 0
    check_result(json.loads((out / "pipeline.json").read_text()), (out / "pipeline.md").read_text(),
                 [len(p) for p in PROMPTS])
    bad = dict(_decode_record(tiny_model_dir, 1))
    bad["prompts"] = bad["prompts"][1:]  # no warm-up prompt: refused
    (tmp_path / "ar.json").write_text(json.dumps(bad))
    assert load_script("decode/bench_pipeline.py").main(argv) == 2


@pytest.mark.slow  # two pipelined launches of 2 processes each: 60-100 s on the shared 2-core machine
def test_quick_benchmark_launches_both_pipelines(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    assert load_script("decode/bench_pipeline.py").main(["--quick", "--model", tiny_model_dir, "--out", str(out)]) == 0
    result = json.loads((out / "pipeline.json").read_text())
    assert result["config"]["num_prompts"] == 2
    check_result(result, (out / "pipeline.md").read_text(), result["config"]["prompt_tokens"])
    assert all(n == 24 for n in result["config"]["prompt_tokens"])  # HumanEval prompts cut to their last 24 tokens
