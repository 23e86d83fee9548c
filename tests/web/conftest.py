"""The web tier (`make test-web`): `ckpt-repair serve` as a subprocess, the local Hub (tools.hub_server) in
this process, both on 127.0.0.1, and Debian's chromium driven by Playwright (never `playwright install`).

Every test here is marked `web` (`make test` leaves them out); without the web extra they are not even
collected. One Hub, one app server and its log are shared by the session; each browser session is a
fresh chromium with its own --user-data-dir, so two sessions are two users' browsers.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REQUIRED = ("gradio", "gradio_client", "playwright")
if any(importlib.util.find_spec(name) is None for name in REQUIRED):
    collect_ignore_glob = ["test_*.py"]  # the web extra is not installed here: `make test-web` installs it

os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.pop("HF_HUB_OFFLINE", None)

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.web)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class App:
    """`ckpt-repair serve` in a subprocess, its output in a log file."""

    def __init__(self, folder: Path, env: dict, *extra: str, command: list[str] | None = None, cwd: Path = REPO):
        self.folder, self.port = folder, free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = folder / "state"
        self.log = folder / "serve.log"
        self.env = env
        with open(self.log, "wb") as log:
            command = command or [sys.executable, "-m", "repair", "serve", "--port", str(self.port), "--state", str(self.state), *extra]
            self.proc = subprocess.Popen(command, cwd=cwd, env={**env, "GRADIO_SERVER_PORT": str(self.port)}, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"serve did not answer in 90 s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def hub_env(hub, home: Path, token: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "GRADIO_"))}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(home), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1",
               GRADIO_ANALYTICS_ENABLED="False", GRADIO_TEMP_DIR=str(home / "gradio"), PYTHONPATH=str(REPO))
    if token:
        env["HF_TOKEN"] = token
    return env


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    from tools.hub_server import LocalHub

    with LocalHub(tmp_path_factory.mktemp("hub")) as h:
        yield h


@pytest.fixture(scope="session")
def app(hub, tmp_path_factory):
    folder = tmp_path_factory.mktemp("app")
    server = App(folder, hub_env(hub, folder / "home", hub.token), "--workers", "2")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def screens(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("screens")


@pytest.fixture(scope="session")
def playwright_driver():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture
def browser_session(playwright_driver, tmp_path):
    """A fresh chromium (its own --user-data-dir) per call; all closed at the end of the test."""
    opened = []

    def open_session(name: str = "user"):
        context = playwright_driver.chromium.launch_persistent_context(
            str(tmp_path / f"profile-{name}"), executable_path=CHROMIUM, headless=True, args=FLAGS, viewport={"width": 1280, "height": 1600})
        opened.append(context)
        return context

    yield open_session
    for context in opened:
        context.close()


@pytest.fixture(scope="session")
def repos(hub, tmp_path_factory) -> dict[str, str]:
    """Small repos on the session's Hub, by role: the broken tiny assistant, a BF16 model (not quantized), a
    private repo of another account, and a model whose only defect is in its config (the fix commits JSON only)."""
    import json

    import torch
    from safetensors.torch import save_file

    from repair.demo.examples import TINY, write_assistant

    base = tmp_path_factory.mktemp("repos")
    tiny = write_assistant(base / "tiny", TINY, shards=[["pre_projection"], ["post_projection"]])
    hub.add_repo("alice/tiny-assistant", tiny)
    hub.add_repo("carol/secret-assistant", tiny, private=True)
    plain = base / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    save_file({"model.layers.0.mlp.down_proj.weight": torch.zeros(64, 128, dtype=torch.bfloat16)}, str(plain / "model.safetensors"))
    hub.add_repo("alice/plain-bf16", plain)
    config_only = write_assistant(base / "config-only", TINY, broken=False)  # handshake layers BF16, but declared quantized:
    for name, key in (("config.json", None), ("hf_quant_config.json", "quantization")):
        value = json.loads((config_only / name).read_text())
        section = value[key] if key else value["quantization_config"]
        listed = "exclude_modules" if key else "ignore"
        section[listed] = [m for m in section[listed] if "projection" not in m]
        (config_only / name).write_text(json.dumps(value, indent=2))
    hub.add_repo("alice/config-only", config_only)
    return {"tiny": "alice/tiny-assistant", "private": "carol/secret-assistant", "plain": "alice/plain-bf16", "config_only": "alice/config-only"}


@pytest.fixture(scope="session")
def big_repo(hub, tmp_path_factory):
    """The broken Gemma 4 31B-shape assistant (tests/test_hub_fix_31b.py): a 512 MB embedding shard that never changes."""
    from repair.demo.examples import GEMMA4_31B, assistant_config, write_assistant
    from tests.hub_workflow_helpers import CARD
    from tests.test_hub_fix_31b import _weights_31b

    src = write_assistant(tmp_path_factory.mktemp("big") / "src", GEMMA4_31B, shards=[["model.layers"], ["pre_projection", "post_projection"]],
                          weights=_weights_31b(assistant_config(GEMMA4_31B)))
    (src / "README.md").write_text(CARD)
    hub.add_repo("alice/gemma-31b-assistant", src)
    return "alice/gemma-31b-assistant"
