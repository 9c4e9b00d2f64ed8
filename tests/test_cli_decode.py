"""``dex-decode``: the JSON schema of issue 2, prompts from every source, one-line errors with exit 2.

Most tests call ``dex_adapt.cli.decode.main`` in-process on tiny random models saved with
``save_pretrained``; one runs the installed ``dex-decode`` console script in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dex_adapt.ar import hf_greedy
from dex_adapt.cli.decode import main

from tiny_models import TinySpec, build_model, save_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPEC = TinySpec("qwen3", seed=5, layers=4, hidden=32, heads=2, kv_heads=1, vocab=64, max_positions=64)
RECORD_KEYS = {"prompt", "output_ids", "text", "committed", "ticks", "ticks_per_token", "speedup_vs_ar",
               "accepted_by_exit", "fallbacks", "stage_forwards", "wall_s", "verified"}
SUMMARY_KEYS = RECORD_KEYS - {"prompt", "output_ids", "text"}
CONFIG_KEYS = {"model", "adapters", "exits", "explorers", "width", "decs", "policy", "max_branches",
               "max_new_tokens", "temperature", "top_k", "top_p", "seed", "dtype", "device"}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Model directories: ``plain`` (no tokenizer), ``tok`` (same weights + tokenizer), ``gpt2``."""
    from transformers import AutoModelForCausalLM, GPT2Config

    root = tmp_path_factory.mktemp("models")
    model = build_model(SPEC)
    model.save_pretrained(root / "plain")
    model.save_pretrained(root / "tok")
    save_tokenizer(root / "tok", SPEC.vocab)
    torch.manual_seed(0)
    gpt2 = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    AutoModelForCausalLM.from_config(gpt2).save_pretrained(root / "gpt2")
    return {name: str(root / name) for name in ("plain", "tok", "gpt2")} | {"model": model}


def cli(argv, capsys) -> tuple[int, str, str]:
    """Run ``main(argv)``; argparse errors raise SystemExit, everything else returns a status."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def check_schema(doc: dict, num_stages: int) -> None:
    """Every key and type of issue 2's ``--json`` schema, and the derived numbers."""
    assert set(doc) == {"config", "prompts", "summary"}
    assert set(doc["config"]) >= CONFIG_KEYS  # the issue leaves "config" open: at least these
    assert doc["config"]["explorers"] == num_stages == len(doc["config"]["exits"])
    assert doc["prompts"], "no prompt records"
    for r in doc["prompts"]:
        assert set(r) == RECORD_KEYS
        assert isinstance(r["prompt"], str) or (isinstance(r["prompt"], list)
                                                and all(type(t) is int for t in r["prompt"]))
        assert isinstance(r["output_ids"], list) and all(type(t) is int for t in r["output_ids"])
        assert r["text"] is None or isinstance(r["text"], str)
        for key in ("committed", "ticks", "fallbacks", "stage_forwards"):
            assert type(r[key]) is int, key
        for key in ("ticks_per_token", "speedup_vs_ar", "wall_s"):
            assert isinstance(r[key], float), key
        assert r["verified"] in (True, False, None)
        assert r["committed"] == len(r["output_ids"]) >= 1
        assert isinstance(r["accepted_by_exit"], list) and len(r["accepted_by_exit"]) == num_stages - 1
        assert all(type(a) is int and a >= 0 for a in r["accepted_by_exit"])
        assert r["ticks_per_token"] == pytest.approx(r["ticks"] / r["committed"])
        assert r["speedup_vs_ar"] == pytest.approx(num_stages / r["ticks_per_token"])
        assert r["wall_s"] >= 0 and r["stage_forwards"] >= r["ticks"] >= r["committed"]
    s, rs = doc["summary"], doc["prompts"]
    assert set(s) == SUMMARY_KEYS
    for key in ("committed", "ticks", "fallbacks", "stage_forwards"):
        assert s[key] == sum(r[key] for r in rs) and type(s[key]) is int
    assert s["accepted_by_exit"] == [sum(col) for col in zip(*(r["accepted_by_exit"] for r in rs))]
    assert s["wall_s"] == pytest.approx(sum(r["wall_s"] for r in rs))
    assert s["ticks_per_token"] == pytest.approx(s["ticks"] / s["committed"])
    assert s["speedup_vs_ar"] == pytest.approx(num_stages / s["ticks_per_token"])
    verified = [r["verified"] for r in rs]
    assert s["verified"] == (None if None in verified else all(verified))


def greedy(dirs, ids, max_new):
    return hf_greedy(dirs["model"], ids, max_new, set())


def test_issue_command_writes_the_schema(dirs, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    code, out, err = cli(["--model", dirs["plain"], "--explorers", 4, "--prompt-ids", "1,2,3", "--verify",
                          "--max-new-tokens", 12, "--json", out_json], capsys)
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    check_schema(doc, 4)
    (r,) = doc["prompts"]
    assert r["prompt"] == [1, 2, 3] and r["text"] is None and r["verified"] is True
    assert r["output_ids"] == greedy(dirs, [1, 2, 3], 12)
    assert out.strip() == ",".join(map(str, r["output_ids"]))  # no tokenizer: ids on stdout
    c = doc["config"]
    assert c["exits"] == [1, 2, 3, 4] and c["model"] == dirs["plain"] and c["adapters"] is None
    assert (c["width"], c["decs"], c["policy"], c["max_branches"]) == (None, True, "fifo", 256)
    assert (c["temperature"], c["top_k"], c["top_p"], c["seed"]) == (0.0, None, None, 0)
    assert (c["max_new_tokens"], c["dtype"], c["device"]) == (12, "float32", "cpu")
    assert doc["summary"]["verified"] is True
    assert not [f for f in os.listdir(tmp_path) if f != "out.json"]  # no temporary files left
    s = doc["summary"]
    assert err.strip().splitlines()[-1] == (
        f"dex-decode: 1 prompt, 12 tokens in {s['ticks']} ticks ({s['ticks_per_token']:.2f} ticks/token; pipelined "
        f"AR needs 4: tick-model speedup {s['speedup_vs_ar']:.2f}x), kept children by exit {s['accepted_by_exit']}, "
        f"{s['fallbacks']} fallbacks; verified: identical to plain AR decoding")


def test_repeated_prompt_ids_and_options(dirs, tmp_path, capsys):
    out_json = tmp_path / "sub" / "out.json"
    prompts = [[1, 2, 3], [7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11]]
    argv = ["--model", dirs["plain"], "--exits", "1,3,4", "--width", 2, "--no-decs", "--policy", "confidence",
            "--max-branches", 5, "--max-new-tokens", 8, "--json", out_json]
    for p in prompts:
        argv += ["--prompt-ids", ",".join(map(str, p))]
    code, out, err = cli(argv, capsys)
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    check_schema(doc, 3)
    assert [r["prompt"] for r in doc["prompts"]] == prompts
    assert [r["output_ids"] for r in doc["prompts"]] == [greedy(dirs, p, 8) for p in prompts]
    assert all(r["verified"] is None for r in doc["prompts"]) and doc["summary"]["verified"] is None
    assert out.splitlines() == [",".join(map(str, r["output_ids"])) for r in doc["prompts"]]
    assert "prompts" in err  # progress bar on stderr for a multi-prompt run
    assert err.strip().splitlines()[-1].startswith("dex-decode: 3 prompts, 24 tokens in ")
    assert err.strip().endswith("; not verified (add --verify to compare with plain AR decoding)")
    c = doc["config"]
    assert (c["exits"], c["width"], c["decs"], c["policy"], c["max_branches"]) == ([1, 3, 4], 2, False, "confidence", 5)


def test_sampling_with_verify(dirs, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    code, _, err = cli(["--model", dirs["plain"], "--explorers", 2, "--prompt-ids", "4,5,6", "--temperature", 0.8,
                        "--top-k", 20, "--top-p", 0.9, "--seed", 7, "--max-new-tokens", 10, "--verify",
                        "--json", out_json], capsys)
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    check_schema(doc, 2)
    assert doc["prompts"][0]["verified"] is True
    assert (doc["config"]["temperature"], doc["config"]["top_k"], doc["config"]["top_p"]) == (0.8, 20, 0.9)


def test_prompts_jsonl_with_a_tokenizer(dirs, tmp_path, capsys):
    from transformers import AutoTokenizer

    prompts_file = tmp_path / "p.jsonl"
    texts = ["def add ( a , b ) :", "the quick brown fox", "hello world"]
    prompts_file.write_text("\n".join(json.dumps({"prompt": t, "id": i}) for i, t in enumerate(texts)) + "\n\n")
    out_json = tmp_path / "out.json"
    code, out, err = cli(["--model", dirs["tok"], "--explorers", 4, "--prompt", "for i in range", "--prompts",
                          prompts_file, "--max-new-tokens", 6, "--verify", "--json", out_json], capsys)
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    check_schema(doc, 4)
    tok = AutoTokenizer.from_pretrained(dirs["tok"])
    assert [r["prompt"] for r in doc["prompts"]] == ["for i in range", *texts]  # --prompt first, then the file
    for r in doc["prompts"]:
        assert r["output_ids"] == greedy(dirs, tok.encode(r["prompt"]), 6)
        assert r["text"] == tok.decode(r["output_ids"]) and r["verified"] is True
    assert out.splitlines() == [r["text"] for r in doc["prompts"]]


def test_prompt_ids_with_a_tokenizer_still_decode_text(dirs, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    code, _, err = cli(["--model", dirs["tok"], "--explorers", 1, "--prompt-ids", "2,3", "--max-new-tokens", 4,
                        "--json", out_json], capsys)
    assert code == 0, err
    (r,) = json.loads(out_json.read_text())["prompts"]
    assert r["prompt"] == [2, 3] and isinstance(r["text"], str)
    assert r["fallbacks"] == r["committed"] - 1 and r["ticks"] == r["committed"]  # N = 1 is plain AR


def test_prompt_filling_the_context_but_one_decodes_one_token(dirs, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    ids = [(3 * i) % SPEC.vocab for i in range(SPEC.max_positions - 1)]
    code, _, err = cli(["--model", dirs["plain"], "--explorers", 2, "--prompt-ids", ",".join(map(str, ids)),
                        "--verify", "--json", out_json], capsys)
    assert code == 0, err
    (r,) = json.loads(out_json.read_text())["prompts"]
    assert r["committed"] == 1 and r["verified"] is True and r["output_ids"] == greedy(dirs, ids, 1)


def test_help(capsys):
    code, out, _ = cli(["--help"], capsys)
    assert code == 0
    assert "usage: dex-decode" in out
    for flag in ("--model", "--explorers", "--exits", "--width", "--no-decs", "--prompt-ids", "--prompts",
                 "--verify", "--json", "--temperature", "--top-k", "--top-p", "--seed", "--dtype", "--device"):
        assert flag in out


def bad_inputs(d, tmp: Path, write: bool = True) -> dict[str, list]:
    bad_jsonl, no_field = tmp / "bad.jsonl", tmp / "nofield.jsonl"
    if write:
        bad_jsonl.write_text('{"prompt": "hello"}\n{"prompt": \n')
        no_field.write_text('{"text": "hello"}\n')
    base = ["--model", d["plain"]]
    return {
        "missing model path": ["--model", tmp / "nowhere", "--prompt-ids", "1,2"],
        "unsupported architecture": ["--model", d["gpt2"], "--prompt-ids", "1,2"],
        "exit out of range (too deep)": base + ["--exits", "1,2,5", "--prompt-ids", "1,2"],
        "exit out of range (zero)": base + ["--exits", "0,4", "--prompt-ids", "1,2"],
        "exits not increasing": base + ["--exits", "3,2,4", "--prompt-ids", "1,2"],
        "exits repeated": base + ["--exits", "2,2,4", "--prompt-ids", "1,2"],
        "exits without the final depth": base + ["--exits", "1,2", "--prompt-ids", "1,2"],
        "exits not integers": base + ["--exits", "1,x,4", "--prompt-ids", "1,2"],
        "explorers and exits": base + ["--explorers", "2", "--exits", "2,4", "--prompt-ids", "1,2"],
        "too many explorers": base + ["--explorers", "5", "--prompt-ids", "1,2"],
        "explorers 0": base + ["--explorers", "0", "--prompt-ids", "1,2"],
        "width 0": base + ["--width", "0", "--prompt-ids", "1,2"],
        "width negative": base + ["--width", "-3", "--prompt-ids", "1,2"],
        "empty prompt ids": base + ["--prompt-ids", ""],
        "empty prompt ids (comma)": base + ["--prompt-ids", ","],
        "empty text prompt": ["--model", d["tok"], "--prompt", ""],
        "prompt longer than the context": base + ["--prompt-ids", ",".join(["1"] * SPEC.max_positions)],
        "prompt id outside the vocabulary": base + ["--prompt-ids", f"1,{SPEC.vocab}"],
        "prompt ids not integers": base + ["--prompt-ids", "1,a,2"],
        "no prompt": base,
        "text prompt without a tokenizer": base + ["--prompt", "hello"],
        "malformed JSONL": ["--model", d["tok"], "--prompts", bad_jsonl],
        "JSONL without a prompt field": ["--model", d["tok"], "--prompts", no_field],
        "missing prompts file": ["--model", d["tok"], "--prompts", tmp / "none.jsonl"],
        "top-p out of range": base + ["--prompt-ids", "1", "--temperature", "1", "--top-p", "1.5"],
        "negative temperature": base + ["--prompt-ids", "1", "--temperature", "-1"],
        "unknown dtype": base + ["--prompt-ids", "1", "--dtype", "int8"],
        "missing adapters": base + ["--adapters", tmp / "noadapters", "--prompt-ids", "1"],
    }


BAD = list(bad_inputs({"plain": "", "tok": "", "gpt2": ""}, Path("unused"), write=False))


@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_one_line_and_exit_2(name, dirs, tmp_path, capsys):
    argv = bad_inputs(dirs, tmp_path)[name]
    out_json = tmp_path / "out.json"
    code, out, err = cli(argv + ["--json", out_json], capsys)
    lines = err.strip().splitlines()
    assert code == 2, f"{name}: exit {code}, stderr {err!r}"
    assert len(lines) == 1 and lines[0].startswith("dex-decode: error: "), f"{name}: stderr {err!r}"
    assert "Traceback" not in err
    assert not out_json.exists()
    assert out == ""


@pytest.mark.parametrize("name,needle", [
    ("missing model path", "not found"),
    ("unsupported architecture", "Qwen3ForCausalLM"),
    ("exit out of range (too deep)", "out of range"),
    ("exits not increasing", "increasing"),
    ("width 0", "--width"),
    ("empty prompt ids", "empty"),
    ("prompt longer than the context", "context"),
    ("malformed JSONL", "bad.jsonl:2"),
    ("missing prompts file", "not found"),
])
def test_bad_input_messages_say_what_is_wrong(name, needle, dirs, tmp_path, capsys):
    code, _, err = cli(bad_inputs(dirs, tmp_path)[name], capsys)
    assert code == 2 and needle in err, err


def test_verification_failure_exits_1_naming_position_and_margin(dirs, tmp_path, capsys, monkeypatch):
    from dex_adapt.decoder import DexDecoder

    real = DexDecoder.generate

    def wrong_third_token(self, *args, **kwargs):
        output, stats = real(self, *args, **kwargs)
        output[2] = (output[2] + 1) % SPEC.vocab
        return output, stats

    monkeypatch.setattr(DexDecoder, "generate", wrong_third_token)
    out_json = tmp_path / "out.json"
    code, _, err = cli(["--model", dirs["plain"], "--explorers", 4, "--prompt-ids", "1,2,3", "--verify",
                        "--max-new-tokens", 8, "--json", out_json], capsys)
    assert code == 1
    (line,) = [l for l in err.splitlines() if "verify failed" in l]
    assert "position 5" in line and "new token 2" in line  # 3 prompt tokens + index 2
    assert "logit margin" in line
    margin = float(line.rsplit("logit margin", 1)[1].strip())
    assert margin > 0  # the plain token is the argmax: a positive margin over the wrong one
    doc = json.loads(out_json.read_text())
    assert doc["prompts"][0]["verified"] is False and doc["summary"]["verified"] is False
    assert "; NOT identical to plain AR decoding" in err


def test_console_script_in_a_subprocess(dirs, tmp_path):
    """The installed ``dex-decode`` with the exact command of issue 2 (default --max-new-tokens)."""
    script = Path(sys.executable).with_name("dex-decode")
    assert script.exists(), f"console script not installed next to {sys.executable}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(script), "--model", dirs["plain"], "--explorers", "4", "--prompt-ids", "1,2,3",
                           "--verify", "--json", "out.json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    check_schema(doc, 4)
    (r,) = doc["prompts"]
    assert r["verified"] is True and r["committed"] == 61  # 64 default new tokens, capped by the context
    assert r["output_ids"] == greedy(dirs, [1, 2, 3], 61)
    # Bad input found after the libraries and the model are loaded, in a real process: still one
    # line on stderr (no library warnings), exit 2.
    proc = subprocess.run([str(script), "--model", dirs["plain"], "--exits", "1,2,5", "--prompt-ids", "1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
