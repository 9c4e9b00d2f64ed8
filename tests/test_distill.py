"""The self-distillation trainer on a tiny random base: learning, exact resume, config errors, ZeRO-2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _tiny_base import make_tiny_base, tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_trainer(config: str, *sets: str) -> int:
    sys.path.insert(0, str(ROOT / "train"))
    import distill

    return distill.main(["--config", config, *[a for s in sets for a in ("--set", s)]])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_tiny_base(str(tmp_path_factory.mktemp("tiny") / "base"))


def adapter_weights(out_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(out_dir, "adapter_model.safetensors"))


def test_loss_falls_and_agreement_rises(tmp_path, base):
    out = str(tmp_path / "out")
    assert run_trainer(tiny_config(str(tmp_path), base, out, steps=40)) == 0
    metrics = json.loads(Path(out, "metrics.json").read_text())
    history = metrics["train"]["loss_history"]
    assert history[-1][1] < 0.9 * history[0][1], history
    exits = metrics["eval"]["exits"]
    assert [e["depth"] for e in exits] == [1, 2, 3]
    mean = lambda k: sum(e[k] for e in exits) / len(exits)  # noqa: E731
    assert mean("adapter_agree") > mean("lens_agree") + 0.02, exits
    assert all(e["adapter_kl"] < e["lens_kl"] for e in exits), exits
    # a genuine PEFT checkpoint + card + TensorBoard events; the seam loads it onto the base
    names = set(os.listdir(out))
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "metrics.json", "logs"} <= names
    assert list(Path(out, "logs").rglob("events.out.tfevents.*"))
    from transformers import AutoModelForCausalLM

    from dex_adapt.adapters import base_model_path, load_exit_adapters

    assert os.path.samefile(base_model_path(out), base)
    assert sorted(load_exit_adapters(out, AutoModelForCausalLM.from_pretrained(base))) == [1, 2, 3]
    card = Path(out, "README.md").read_text()
    assert "library_name: peft" in card and "| 3 |" in card
    assert metrics["train"]["step_over_forward"] > 0


def test_resume_ends_with_the_same_adapter_weights(tmp_path, base):
    common = ("train.steps=6", "train.exits_per_step=2", "train.grad_accum=2", "train.log_every=2")
    straight = str(tmp_path / "straight")
    assert run_trainer(tiny_config(str(tmp_path), base, straight), *common) == 0
    resumed = str(tmp_path / "resumed")
    config = tiny_config(str(tmp_path), base, resumed)
    assert run_trainer(config, *common, "train.stop_after=3") == 0
    assert not os.path.exists(os.path.join(resumed, "adapter_model.safetensors"))
    state = Path(resumed, "state", "step-3")
    # the resumable state holds adapter weights + optimizer, never the frozen base
    from safetensors.torch import load_file

    saved = load_file(str(state / "model.safetensors"))
    assert saved and all(".inducing_adapter." in k for k in saved)
    assert run_trainer(config, *common, "train.resume=true") == 0
    a, b = adapter_weights(straight), adapter_weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_config_errors_are_one_line(tmp_path, base, capsys):
    assert run_trainer(str(tmp_path / "missing.yaml")) == 2
    assert "config file not found" in capsys.readouterr().err
    config = tiny_config(str(tmp_path), base, str(tmp_path / "o"))
    assert run_trainer(config, "train.stepz=3") == 2
    err = capsys.readouterr().err
    assert "unknown key(s) ['stepz']" in err and err.count("\n") == 1
    assert run_trainer(config, "train.steps=many") == 2
    assert "train.steps wants int" in capsys.readouterr().err
    assert run_trainer(config, "model.path=" + str(tmp_path / "no-such-base")) == 1
    assert capsys.readouterr().err.startswith("error: ")


def two_rank_launch(accelerate_config: str, config: str) -> tuple[list[str], dict]:
    """`accelerate launch` of train/distill.py on 2 CPU ranks (DeepSpeed's CPU accelerator, gloo)."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch",
           "--config_file", str(ROOT / f"configs/accelerate/{accelerate_config}.yaml"), "--num_processes", "2",
           "--mixed_precision", "no", str(ROOT / "train/distill.py"), "--config", config, "--set", "train.threads=1"]
    return cmd, env


@pytest.mark.slow  # ~70 s on 2 shared CPU cores: two ranks each import torch+transformers+deepspeed
def test_deepspeed_zero2_two_cpu_ranks(tmp_path, base):
    """`accelerate launch` starts 2 CPU ranks; DeepSpeed's CPU accelerator runs ZeRO-2 over gloo."""
    out = str(tmp_path / "z2")
    config = tiny_config(str(tmp_path), base, out, steps=8, exits_per_step=2)
    cmd, env = two_rank_launch("zero2", config)
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads(Path(out, "metrics.json").read_text())
    assert metrics["distributed"] == {"type": "DistributedType.DEEPSPEED", "processes": 2}
    assert metrics["train"]["tokens_per_step"] == 4 * 2 * 32
    assert sorted(adapter_weights(out)) and all(".inducing_adapter." in k for k in adapter_weights(out))
    print(f"zero2 2-rank run: {time.time() - start:.0f}s")


@pytest.mark.slow  # ~2.5 min: two 2-rank launches
def test_deepspeed_zero3_two_cpu_ranks_stop_and_resume(tmp_path, base):
    """ZeRO-3 (frozen base sharded at load) saves only adapter state, and resumes from it."""
    out = str(tmp_path / "z3")
    config = tiny_config(str(tmp_path), base, out, steps=8, exits_per_step=2)
    cmd, env = two_rank_launch("zero3", config)
    first = subprocess.run(cmd + ["--set", "train.stop_after=4"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "frozen base partitioned at load" in first.stdout
    for states in Path(out, "state").rglob("*model_states.pt"):  # the frozen base is never written
        module = torch.load(states, weights_only=False, map_location="cpu")["module"]
        assert module and all(".inducing_adapter." in k for k in module), sorted(module)[:3]
    second = subprocess.run(cmd + ["--set", "train.resume=true"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resumed from" in second.stdout and Path(out, "adapter_model.safetensors").is_file()

@pytest.mark.parametrize("name", ["dexcoder-16l", "dexcoder-16l-ee", "qwen3-32b"])
def test_shipped_configs_load(name):
    from dex_adapt.distill.config import load_config

    cfg = load_config(ROOT / "configs" / "distill" / f"{name}.yaml")
    assert cfg.model.path and cfg.train.steps > 0 and cfg.adapter.exit_depths is None


def test_config_types_are_checked_inside_lists(tmp_path):
    from dex_adapt.distill.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=r"adapter.exit_depths wants"):
        config_from_dict({"model": {"path": "x"}, "adapter": {"exit_depths": [1, "two"]}})
    with pytest.raises(ConfigError, match="unknown section"):
        config_from_dict({"model": {"path": "x"}, "optim": {}})
    with pytest.raises(ConfigError, match="model.path is required"):
        config_from_dict({})
    cfg = config_from_dict({"model": {"path": "x"}, "train": {"lr": 1}})
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
