"""Pretraining of the embedded base model: tiny end-to-end run, exact resume, config errors."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "train"))

import eval_base  # noqa: E402
import pretrain_base  # noqa: E402

from dex_adapt.pretrain.config import ConfigError, PretrainConfig, config_from_dict, load_config  # noqa: E402
from dex_adapt.pretrain.corpus import is_test_path, split_stdlib  # noqa: E402
from dex_adapt.pretrain.data import batch_for_step  # noqa: E402
from dex_adapt.pretrain.model import build_model, early_exit_loss, layer_drop_probs  # noqa: E402
from dex_adapt.pretrain.model_card import render_card  # noqa: E402
from dex_adapt.pretrain.trainer import lr_at  # noqa: E402

TINY = str(ROOT / "configs" / "pretrain" / "tiny-test.yaml")


def _run(tmp: Path, *extra: str) -> int:
    return pretrain_base.main(["--config", TINY, "--out-dir", str(tmp / "out"), "--work-dir", str(tmp / "work"),
                               *extra])


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("straight")
    assert _run(tmp, "--max-steps", "4") == 0
    return tmp


def test_end_to_end_output_loads_offline(straight):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = straight / "out"
    tok = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert tok.eos_token == "<|endoftext|>"
    assert model.config.eos_token_id == tok.eos_token_id
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == tok.eos_token_id
    assert all(t.dtype == torch.bfloat16 for t in load_file(str(out / "model.safetensors")).values())
    text = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level BPE round-trips exactly
    for name in ("loss.csv", "loss.png", "training_summary.json"):
        assert (out / name).is_file()
    # the weights are as readable as the config next to them (safetensors alone would make them 0600)
    assert (out / "model.safetensors").stat().st_mode == (out / "config.json").stat().st_mode
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == 4 and summary["tokens_seen"] == 4 * 4 * 64
    assert len(summary["data"]["train_fingerprint_sha256"]) == 64


def test_resume_continues_exactly(tmp_path, straight):
    assert _run(tmp_path, "--max-steps", "2") == 0
    assert _run(tmp_path, "--max-steps", "4") == 0
    with (tmp_path / "work" / "loss.csv").open() as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]
    assert torch.load(tmp_path / "work" / "state.pt", weights_only=False)["step"] == 4
    # Batches are a pure function of the step and RNG state is restored: 2+2 steps == 4 steps.
    a = load_file(str(tmp_path / "out" / "model.safetensors"))
    b = load_file(str(straight / "out" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)



def test_a_resume_with_another_batch_size_counts_the_tokens_it_saw(tmp_path):
    assert _run(tmp_path, "--max-steps", "2") == 0  # 2 steps of 4 x 64
    wider = tmp_path / "wider.yaml"
    wider.write_text(Path(TINY).read_text().replace("batch_size: 4", "batch_size: 8"))
    assert pretrain_base.main(["--config", str(wider), "--out-dir", str(tmp_path / "out"),
                               "--work-dir", str(tmp_path / "work"), "--max-steps", "4"]) == 0
    with (tmp_path / "work" / "loss.csv").open() as f:
        assert [int(r["tokens"]) for r in csv.DictReader(f)] == [256, 512, 1024, 1536]
    summary = json.loads((tmp_path / "out" / "training_summary.json").read_text())
    assert summary["steps"] == 4 and summary["tokens_seen"] == 1536
    assert eval_base.main(["--model-dir", str(tmp_path / "out"), "--card-only"]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "resumed with other batch sizes: steps 1-2 at batch 4, steps 3-4 at batch 8" in card
    assert "**1,536 tokens seen**" in card

def test_config_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_layerz: 3\n")
    assert pretrain_base.main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown key" in err and "num_layerz" in err and "\n" not in err
    bad.write_text("num_layers: two\n")
    assert pretrain_base.main(["--config", str(bad)]) == 2
    assert "num_layers" in capsys.readouterr().err
    assert pretrain_base.main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_config_types_and_invariants():
    with pytest.raises(ConfigError, match="wants int"):
        config_from_dict({"batch_size": 2.5})
    with pytest.raises(ConfigError, match="wants int"):
        config_from_dict({"max_steps": True})
    with pytest.raises(ConfigError, match="num_heads"):
        config_from_dict({"hidden_size": 100})
    assert config_from_dict({"lr": 1}).lr == 1.0  # ints are fine for float fields
    for name in ("dexcoder-16l", "dexcoder-16l-ee", "tiny-test"):
        load_config(ROOT / "configs" / "pretrain" / f"{name}.yaml")


def test_lr_schedule_warmup_then_cosine():
    cfg = PretrainConfig(lr=1.0, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)
    assert lr_at(110, cfg) == pytest.approx(0.1)
    timed = PretrainConfig(lr=1.0, warmup_steps=10, max_steps=1000, time_budget_s=100.0, min_lr_ratio=0.1)
    assert lr_at(20, timed, elapsed_s=100.0) == pytest.approx(0.1)  # the time budget ends the decay


def test_corpus_split_holds_out_tests():
    assert is_test_path("test/test_os.py") and is_test_path("ctypes/test/test_cast.py")
    assert is_test_path("idlelib/idle_test/test_run.py") and not is_test_path("os.py")
    assert not is_test_path("unittest/case.py")
    split = split_stdlib()
    assert split.train and split.heldout and not set(split.train) & set(split.heldout)
    assert list(split.train) == sorted(split.train)
    assert not any("site-packages" in p for p in split.train)


def test_batches_are_a_function_of_step():
    stream = torch.arange(10_000)
    a = batch_for_step(stream, 7, batch_size=3, context_length=16, seed=1)
    assert a.shape == (3, 16)
    assert torch.equal(a, batch_for_step(stream, 7, batch_size=3, context_length=16, seed=1))
    assert not torch.equal(a, batch_for_step(stream, 8, batch_size=3, context_length=16, seed=1))


def test_early_exit_loss_trains_every_exit():
    cfg = PretrainConfig(num_layers=4, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1,
                         head_dim=16, context_length=16, vocab_size=64)
    model = build_model(cfg, 64, 0)
    ids = torch.randint(0, 64, (2, 16))
    g = torch.Generator().manual_seed(0)
    total, final = early_exit_loss(model, ids, layers_per_step=3, ee_scale=1.0, p_max=0.0, generator=g)
    assert total.item() > final.item() > 0
    # With no dropout and no exits, the final-layer CE is exactly HF's loss.
    _, final0 = early_exit_loss(model, ids, layers_per_step=0, ee_scale=1.0, p_max=0.0, generator=g)
    torch.testing.assert_close(final0, model(input_ids=ids, labels=ids).loss.detach())
    total.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert layer_drop_probs(5, 0.2) == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])


def test_eval_base_writes_table_json_and_card(straight):
    out = straight / "out"
    assert eval_base.main(["--model-dir", str(out), "--snippets", "2", "--snippet-chars", "300",
                           "--humaneval", "1", "--new-tokens", "4", "--write-card"]) == 0
    ev = json.loads((out / "depth_agreement.json").read_text())
    assert ev["num_layers"] == 2 and ev["heldout_ppl"] > 1
    for rates in ev["agreement"].values():
        assert len(rates) == 2 and rates[-1] == 1.0
    card = (out / "README.md").read_text()
    assert "| layer d |" in card and "train/eval_base.py --model-dir" in card and "sha256" in card
    for c in ev["completions"]:  # an empty body is named as such, not passed off as parsing code
        head = next(line for line in card.splitlines() if line.startswith(f"**{c['task_id']}** (parses:"))
        assert ("no body" in head) == (not c["completion"].strip()), head
    summary = json.loads((out / "training_summary.json").read_text())
    ev["completions"] = [{"task_id": "a", "prompt": 'def f():\n    """doc"""\n', "completion": "\n", "parses": True},
                         {"task_id": "b", "prompt": "def g():", "completion": "\n    return 1\n", "parses": True}]
    both = render_card("x", summary, ev, None, {})
    assert "**a** (parses: True; no body" in both and "**b** (parses: True)\n" in both
    assert eval_base.main(["--model-dir", str(out / "missing")]) == 2


def test_export_replaces_the_output_directory_whole(tmp_path, straight, monkeypatch):
    import shutil

    from dex_adapt.pretrain import trainer

    shutil.copytree(straight / "work", tmp_path / "work")  # finished run: rerunning only re-exports
    out = tmp_path / "out"
    out.mkdir()
    (out / "depth_agreement.json").write_text("{}")  # an evaluation of older weights
    assert _run(tmp_path, "--max-steps", "4") == 0
    assert not (out / "depth_agreement.json").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "work"]  # no staging left behind

    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "plot_loss", killed)
    assert _run(tmp_path, "--max-steps", "4") == 130  # Ctrl-C during the export
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the last export, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "work"]
