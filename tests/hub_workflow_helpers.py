"""Shared fixtures and helpers of the Hub workflow tests (test_hub_sources.py, test_hub_fix_*.py,
test_hub_workflow_failures.py): tools.hub_server.LocalHub with the real huggingface_hub client.

HF_ENDPOINT points at the local server (127.0.0.1, dynamic port), HF_HUB_DISABLE_XET=1 and telemetry
off (also set in the root conftest). The request log is the evidence of what was downloaded and
uploaded. Each test file imports the fixtures it uses from here (`hub_env` is autouse there); the
source checkpoint `broken` and its local fix `local_fix` are session fixtures in tests/conftest.py,
built once for all these files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from huggingface_hub import constants
from huggingface_hub.utils import disable_progress_bars

from repair.cli import main
from tools.hub_server import LocalHub

SRC = "alice/src"
SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]  # 1: untouched, 2: pre_projection, 3: post_projection
CARD = "---\nlicense: apache-2.0\ntags:\n- gemma\nbase_model: google/gemma-4-assistant\nbase_model_relation: quantized\n---\n# Broken assistant\n\nSource card text that must be kept.\n"


# ----------------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(autouse=True)
def hub_env(monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # in case huggingface_hub was imported before the env vars
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "saved-token"))  # no real saved login leaks in
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with disable_progress_bars():
        yield


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with LocalHub(tmp_path / "hub") as h:
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        monkeypatch.setenv("HF_TOKEN", h.token)
        yield h


def run(capsys, *args) -> tuple[int, str, str]:
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def full_gets(hub, repo=SRC) -> list[str]:
    """Files of `repo` downloaded whole (GET without Range)."""
    prefix = f"/{repo}/resolve/"
    return [r.path.rsplit("/", 1)[1] for r in hub.requests if r.method == "GET" and r.path.startswith(prefix) and r.range is None]


def ranged(hub, name: str) -> list[tuple[int, int]]:
    """[start, end) of every ranged GET of one file."""
    out = []
    for r in hub.requests:
        if r.method == "GET" and r.path.endswith("/" + name) and r.range:
            start, end = r.range.removeprefix("bytes=").split("-")
            out.append((int(start), int(end) + 1))
    return out


def uploads(hub) -> list[str]:
    return [r.path for r in hub.requests if r.method == "PUT" and r.path.startswith("/__lfs/")]


def commits(hub, repo) -> list:
    return [r for r in hub.requests if r.method == "POST" and r.path.startswith(f"/api/models/{repo}/commit/")]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_equals_local_fix(remote: dict[str, bytes], local: Path, label: str, *, card_replaced: bool = True) -> None:
    """Byte-equal to a local `fix` except README.md (the fork's card) and the report's source fields:
    `source.path` (the local folder vs `owner/name@sha`) and README.md's output sha256 (the card)."""
    mine = folder_files(local)
    assert set(remote) - {".gitattributes"} == set(mine)
    differ = {n for n in mine if mine[n] != remote[n]}
    assert differ == ({"README.md", "repair_report.json"} if card_replaced else {"repair_report.json"})
    ours, theirs = json.loads(mine["repair_report.json"]), json.loads(remote["repair_report.json"])
    assert theirs["source"]["path"] == label
    their_outputs = {o["name"]: o["sha256"] for o in theirs["outputs"]}
    if card_replaced:
        assert their_outputs["README.md"] == sha256(remote["README.md"])
    ours["source"]["path"] = label
    ours["outputs"] = theirs["outputs"]
    assert ours == theirs
