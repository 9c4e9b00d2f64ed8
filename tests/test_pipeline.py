"""Pipelined DEX over gloo: same tokens and ticks as the single-process executor; per-rank loading;
a dead or hung rank brings every rank down, named, within the fault timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from dex_adapt.decoder import DexConfig, DexDecoder
from dex_adapt.exploration import ExplorationSet
from dex_adapt.pipeline import load_stage_model, materialized_parameters, owned_tensor_names, partial_load
from dex_adapt.sampling import SamplingConfig

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "dexcoder-16l"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.manual_seed(3)
    config = Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                         eos_token_id=5, initializer_range=0.25, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny_qwen3")
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def test_owned_tensor_names_is_a_pure_split():
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"] + [
        f"model.layers.{i}.mlp.up_proj.weight" for i in range(8)]
    first = owned_tensor_names(names, (0, 3), first_stage=True)
    later = owned_tensor_names(names, (3, 8), first_stage=False)
    assert "model.embed_tokens.weight" in first and "model.embed_tokens.weight" not in later
    assert [n for n in first if "layers" in n] == [f"model.layers.{i}.mlp.up_proj.weight" for i in range(3)]
    assert [n for n in later if "layers" in n] == [f"model.layers.{i}.mlp.up_proj.weight" for i in range(3, 8)]
    assert "lm_head.weight" in first and "model.norm.weight" in later


def test_each_rank_materialises_only_its_own_layers(tiny_dir):
    full = Qwen3ForCausalLM.from_pretrained(tiny_dir)
    per_layer = sum(p.numel() for p in full.model.layers[0].parameters())
    embed = full.model.embed_tokens.weight.numel()
    norm = full.model.norm.weight.numel()
    exploration = ExplorationSet((2, 5, 6), 6)
    counts = []
    for rank, (start, end) in enumerate(exploration.stages):
        model = load_stage_model(str(tiny_dir), (start, end), first_stage=rank == 0)
        # Tied head: the first stage shares one tensor for embeddings and head; later stages hold the head.
        assert materialized_parameters(model) == (end - start) * per_layer + norm + embed
        for i, layer in enumerate(model.model.layers):
            on_meta = all(p.device.type == "meta" for p in layer.parameters())
            assert on_meta == (not start <= i < end)
        assert (model.model.embed_tokens.weight.device.type == "meta") == (rank > 0)
        counts.append(materialized_parameters(model))
    assert sum(counts) < 3 * sum(p.numel() for p in full.parameters())
    assert max(counts) < sum(p.numel() for p in full.parameters())


def _run_pipeline(args, timeout=600, env=None):
    cmd = [sys.executable, "-m", "dex_adapt.cli.decode", "--pipeline", "--threads", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _single_process(model_dir, exits, prompts, sampling, max_new):
    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    decoder = DexDecoder(model, DexConfig(exits=exits), sampling)
    return [decoder.generate(p, max_new) for p in prompts]


GREEDY = SamplingConfig()
SAMPLED = SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, seed=5)


def _sampling_args(sampling: SamplingConfig) -> list[str]:
    if sampling.greedy:
        return []
    return ["--temperature", str(sampling.temperature), "--top-k", str(sampling.top_k),
            "--top-p", str(sampling.top_p), "--seed", str(sampling.seed)]


@pytest.mark.parametrize("exits", [(3, 6), (1, 4, 6)], ids=["N2", "N3"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_pipeline_matches_single_process_and_plain_decoding(tiny_dir, tmp_path, exits, sampling):
    prompts = [[1, 2, 3], [7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11]]
    out = tmp_path / "out.json"
    args = ["--model", str(tiny_dir), "--exits", ",".join(map(str, exits)), "--max-new-tokens", "24",
            "--verify", "--json", str(out), "--fault-timeout", "60"]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    result = _run_pipeline(args + _sampling_args(sampling))
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads(out.read_text())["prompts"]
    expected = _single_process(tiny_dir, exits, prompts, sampling, 24)
    for record, (ids, stats) in zip(records, expected):
        assert record["verified"] is True  # against HF generate (greedy) / the plain AR sampler
        assert record["output_ids"] == ids
        assert record["ticks"] == stats.ticks
        assert record["stage_forwards"] == stats.stage_forwards
    assert len(result.stdout.strip().splitlines()) == len(prompts)  # only rank 0 reports


@pytest.mark.skipif(not (SHIPPED / "model.safetensors").exists(), reason="shipped model not trained yet")
@pytest.mark.parametrize("explorers", [2, 3], ids=["N2", "N3"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_pipeline_on_the_shipped_model(tmp_path, explorers, sampling):
    out = tmp_path / "out.json"
    result = _run_pipeline(["--model", str(SHIPPED), "--explorers", str(explorers), "--prompt", "def add(a, b):",
                            "--max-new-tokens", "16", "--verify", "--json", str(out), *_sampling_args(sampling)])
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(out.read_text())["prompts"][0]
    model = Qwen3ForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32).eval()
    decoder = DexDecoder(model, DexConfig(explorers=explorers), sampling)
    ids, stats = decoder.generate(_encode(SHIPPED, "def add(a, b):"), 16)
    assert record["verified"] is True and record["output_ids"] == ids and record["ticks"] == stats.ticks


def _encode(path, text):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path).encode(text)


@pytest.mark.parametrize("mode", ["kill", pytest.param("hang", marks=pytest.mark.slow)])
def test_a_failed_rank_brings_every_rank_down_named(tiny_dir, mode):
    timeout = 15
    start = time.monotonic()
    result = _run_pipeline(["--model", str(tiny_dir), "--exits", "2,4,6", "--prompt-ids", "1,2,3",
                            "--max-new-tokens", "100", "--fault-timeout", str(timeout)],
                           timeout=300, env={"DEX_FAULT_INJECT": f"1:5:{mode}"})
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert "rank 1" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    # Start-up (imports, loading) aside, the failure is noticed within the fault timeout.
    assert elapsed < 120 + timeout
    leftovers = subprocess.run(["pgrep", "-f", "DEX_FAULT_INJECT|dex_adapt.cli.decode --pipeline"],
                               capture_output=True, text=True).stdout.split()
    assert str(os.getpid()) not in leftovers
    assert not [p for p in leftovers if _is_our_child(p, str(tiny_dir))]


@pytest.mark.slow
def test_torchrun_launch_matches_single_process(tiny_dir, tmp_path):
    out = tmp_path / "out.json"
    import socket

    with socket.socket() as sock:  # torchrun hands --master-port 0 to the workers verbatim: pick one
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
           "-m", "dex_adapt.cli.decode", "--model", str(tiny_dir), "--exits", "3,6", "--prompt-ids", "4,5,6",
           "--max-new-tokens", "20", "--threads", "1", "--json", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(out.read_text())["prompts"][0]
    ((ids, stats),) = _single_process(tiny_dir, (3, 6), [[4, 5, 6]], SamplingConfig(), 20)
    assert record["output_ids"] == ids and record["ticks"] == stats.ticks


def _is_our_child(pid: str, marker: str) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


_HEARTBEAT_EXIT = """
import sys, time
import torch.distributed as dist
from dex_adapt.pipeline.dist import DistContext, Heartbeat
dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", 0, 1, is_master=True), rank=0, world_size=1)
heartbeat = Heartbeat(DistContext(0, 1, 0), interval_s=0.0)  # always inside a store call
time.sleep(0.3)
heartbeat.stop()
assert not heartbeat._thread.is_alive()
dist.destroy_process_group()
"""


def test_stopped_heartbeat_lets_the_process_exit_cleanly():
    # A heartbeat thread still inside a store call at interpreter exit aborts the process
    # ("terminate called without an active exception", exit 134, every time without the join);
    # stop() must join it.
    result = subprocess.run([sys.executable, "-c", _HEARTBEAT_EXIT], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-1000:]


def test_a_sharded_checkpoint_is_read_through_its_index_opening_only_owned_shards(tiny_dir, tmp_path, monkeypatch):
    full = Qwen3ForCausalLM.from_pretrained(tiny_dir)
    sharded = tmp_path / "sharded"
    full.save_pretrained(sharded, max_shard_size="40KB")
    weight_map = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) > 3

    opened = []
    real_open = partial_load.safe_open
    monkeypatch.setattr(partial_load, "safe_open", lambda f, **kw: opened.append(Path(f).name) or real_open(f, **kw))
    model = load_stage_model(str(sharded), (2, 5), first_stage=False)

    owned = owned_tensor_names(weight_map, (2, 5), first_stage=False) + ["model.embed_tokens.weight"]  # tied head
    assert sorted(opened) == sorted({weight_map[n] for n in owned})  # never a shard it does not need
    reference = dict(full.named_parameters(remove_duplicate=False))
    for name, p in model.named_parameters():
        if p.device.type != "meta":
            torch.testing.assert_close(p, reference[name], rtol=0, atol=0)
    assert materialized_parameters(model) == 3 * sum(p.numel() for p in full.model.layers[0].parameters()) + \
        full.model.norm.weight.numel() + full.lm_head.weight.numel()
