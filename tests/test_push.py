"""dex-push against a local HTTP stand-in for the Hub API that records what was uploaded."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class HubStandIn(BaseHTTPRequestHandler):
    """The few Hub endpoints `create_repo` + `upload_folder` use; every file is a regular upload."""

    calls: list[tuple[str, str]] = []
    repos: dict[str, dict] = {}  # repo_id -> {"private": bool, "files": {path: bytes}}

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _json(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _url(self, path: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/{path}"

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self):
        self.calls.append(("GET", self.path))
        if self.path.startswith("/api/whoami"):
            return self._json(200, {"name": "tester", "type": "user", "orgs": []})
        return self._json(404, {"error": "not found"})

    def do_POST(self):
        body = self._body()
        self.calls.append(("POST", self.path))
        if self.path == "/api/repos/create":
            req = json.loads(body)
            repo_id = f"{req.get('organization') or 'tester'}/{req['name']}"
            private = bool(req.get("private")) or req.get("visibility") == "private"
            self.repos.setdefault(repo_id, {"private": private, "files": {}})
            return self._json(200, {"url": self._url(repo_id), "name": repo_id})
        if self.path == "/api/validate-yaml":
            # The real Hub rejects a card whose metadata is malformed; check what we rely on.
            import yaml

            content = json.loads(body)["content"]
            meta = yaml.safe_load(content.split("---")[1]) if content.startswith("---") else {}
            errors = [{"message": f"missing {k}"} for k in ("library_name", "base_model") if not meta.get(k)]
            if str(meta.get("base_model", "")).startswith((".", "/")):
                errors.append({"message": "base_model is not a model id"})
            return self._json(400 if errors else 200, {"errors": errors, "warnings": []})
        if "/preupload/" in self.path:
            files = json.loads(body)["files"]
            return self._json(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                              for f in files]})
        if "/commit/" in self.path:
            repo_id = self.path.split("/api/models/", 1)[1].split("/commit/", 1)[0]
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item.get("key") == "file":
                    value = item["value"]
                    self.repos[repo_id]["files"][value["path"]] = base64.b64decode(value["content"])
            return self._json(200, {"commitUrl": self._url(f"{repo_id}/commit/" + "1" * 40), "commitOid": "1" * 40,
                                    "success": True})
        return self._json(404, {"error": f"unexpected POST {self.path}"})


@pytest.fixture
def hub():
    HubStandIn.calls, HubStandIn.repos = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", HubStandIn
    server.shutdown()


@pytest.fixture
def ckpt(tmp_path):
    """A real (untrained) inducing-adapter checkpoint with a metrics.json, as the trainer writes it."""
    from peft import get_peft_model

    import dex_adapt  # noqa: F401
    from dex_adapt.adapters import InducingConfig, save_exit_adapters
    from _tiny_base import tiny_model

    out = tmp_path / "ckpt"
    save_exit_adapters(get_peft_model(tiny_model(), InducingConfig()), str(out))
    metrics = {
        "command": "accelerate launch train/distill.py --config x.yaml", "base_model": "base",
        "eval": {"sources": ["stdlib:heldout"], "blocks": 2, "tokens": 64,
                 "exits": [{"depth": d, "lens_agree": 0.1 * d, "adapter_agree": 0.2 * d, "lens_kl": 1.0 / d,
                            "adapter_kl": 0.5 / d} for d in (1, 2, 3)]},
        "train": {"steps": 5, "tokens_per_step": 128, "final_loss": 0.5, "seconds_per_micro_step": 0.02,
                  "seconds_per_base_forward": 0.01, "step_over_forward": 2.0},
    }
    (out / "metrics.json").write_text(json.dumps(metrics))
    (out / "state").mkdir()  # resumable state next to it must never be uploaded
    (out / "state" / "optimizer.bin").write_bytes(b"x")
    from dex_adapt.distill.publish import write_model_card

    write_model_card(str(out))
    return out


sys.path.insert(0, str(Path(__file__).parent))


def push(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dex_adapt.cli.push", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "HF_TOKEN": "hf_test_token", **(env or {})}, timeout=120)


def test_push_uploads_card_config_weights_and_metrics(hub, ckpt):
    endpoint, recorder = hub
    proc = push(str(ckpt), "--repo-id", "tester/tiny-dex", "--private", env={"HF_ENDPOINT": endpoint})
    assert proc.returncode == 0, proc.stderr
    repo = recorder.repos["tester/tiny-dex"]
    assert repo["private"] is True
    assert sorted(repo["files"]) == ["README.md", "adapter_config.json", "adapter_model.safetensors", "metrics.json"]
    assert repo["files"]["adapter_model.safetensors"] == (ckpt / "adapter_model.safetensors").read_bytes()
    card = repo["files"]["README.md"].decode()
    assert card.startswith("---\nlibrary_name: peft\n") and "base_model:" in card
    assert "- dex" in card and "PeftModel.from_pretrained" in card and "tester/tiny-dex" in card
    assert "| 3 | 0.300 | 0.600 |" in card  # the per-exit agreement table
    assert ("POST", "/api/repos/create") in recorder.calls


def test_dry_run_prints_exactly_what_would_be_uploaded(hub, ckpt):
    endpoint, recorder = hub
    proc = push(str(ckpt), "--repo-id", "tester/tiny-dex", "--dry-run", "--endpoint", endpoint)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"would upload to {endpoint}/tester/tiny-dex (public model repo):"
    listed = [line.split()[0] for line in lines[1:]]
    assert listed == ["README.md", "adapter_config.json", "adapter_model.safetensors", "metrics.json"]
    size = (ckpt / "adapter_model.safetensors").stat().st_size
    assert f"adapter_model.safetensors  {size} bytes  sha256:" in proc.stdout
    assert recorder.calls == [] and recorder.repos == {}


def test_trainer_push_option_uses_the_same_path(hub, ckpt, monkeypatch):
    from dex_adapt.distill.publish import push_checkpoint

    endpoint, recorder = hub
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    files = push_checkpoint(str(ckpt), "tester/other", endpoint=endpoint, print_fn=lambda *_: None)
    assert [f["path"] for f in files] == sorted(recorder.repos["tester/other"]["files"])


@pytest.mark.parametrize("args, message", [
    (["/no/such/ckpt", "--repo-id", "a/b"], "adapter checkpoint directory not found"),
    (["{ckpt}", "--repo-id", "no-slash"], "--repo-id must look like user/name"),
])
def test_bad_input_is_one_line_and_nonzero(ckpt, args, message):
    proc = push(*[a.format(ckpt=ckpt) for a in args], "--dry-run")
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.count("\n") == 1
