"""Shared fixtures and helpers of the LocalHub server tests (test_hub_server_*.py).

The real huggingface_hub client talks to tools.hub_server.LocalHub (127.0.0.1 only, no network). Each
test file imports the fixtures it uses from here (`_client_env` is autouse there); importing this module
first sets the client's environment variables.
"""

import os

os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.pop("HF_HUB_OFFLINE", None)
os.environ.pop("TRANSFORMERS_OFFLINE", None)

import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from huggingface_hub import HfApi, constants  # noqa: E402
from huggingface_hub.utils import disable_progress_bars  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from tools.hub_server import LocalHub  # noqa: E402

REPO = "alice/src-model"


@pytest.fixture(autouse=True)
def _client_env(monkeypatch, tmp_path):
    # In case huggingface_hub was imported (by another test module) before the env vars above were set.
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "default-cache"))
    with disable_progress_bars():
        yield


@pytest.fixture
def hub(tmp_path):
    with LocalHub(tmp_path / "hub") as h:
        yield h


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.endpoint, token=hub.token)


@pytest.fixture
def src_folder(tmp_path):
    folder = tmp_path / "src"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "gemma"}')
    (folder / "sub" / "notes.txt").write_text("hello\n")
    save_file({"w": np.arange(100_000, dtype=np.float32), "b": np.zeros((4, 2), dtype=np.float16)},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _raw(hub, method, path, *, body=None, headers=None, token=True):
    """A stdlib request to the hub: (status, headers, body bytes)."""
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {hub.token}"
    req = urllib.request.Request(hub.endpoint + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()

