"""Session-wide fixtures: real ModelOpt exports and the Hub tests' source checkpoint (built once), and helpers to read outputs."""

from __future__ import annotations

import hashlib
import os
import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tools import modelopt_export

# An exception no check raised is one line and exit 3 for a user (cli/main.py _bug); here it is raised as it is, so a
# failing test shows where (tests/test_no_tracebacks.py asks the user's form with this unset)
os.environ.setdefault("CKPT_REPAIR_TRACEBACK", "1")

# A suite started in the background by a non-interactive shell (`nohup pytest ... &`) inherits SIGINT ignored, and the
# CLI rightly keeps a parent's SIG_IGN (cli/main.py): every Ctrl-C test would then see no interrupt. The tests ask what
# a user at a terminal gets, so they start from Python's own handler, which their child processes inherit as default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

LLAMA_31 = "llama-3.1-8b-instruct-fp4"


def pytest_collection_modifyitems(config, items):
    """`make test` deselects vllm- and sglang-marked tests, and `make test-vllm` / `make test-sglang` collect
    tests/vllm / tests/sglang only: a tier-marked test anywhere else would silently run in neither, so it stops the run."""
    here = Path(__file__).resolve().parent
    for tier in ("vllm", "sglang"):
        stray = [i.nodeid for i in items if i.get_closest_marker(tier) and here / tier not in Path(str(i.path)).resolve().parents]
        if stray:
            raise pytest.UsageError(f"{tier}-marked tests outside tests/{tier} run in neither CI step; move them there: {stray}")


@pytest.fixture(scope="session")
def modelopt_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("modelopt")


@pytest.fixture(scope="session")
def broken_export(modelopt_dir) -> Path:
    """ModelOpt's export with the bug: pre/post_projection packed to NVFP4 (calibrated: has input_scale)."""
    return modelopt_export.export_modelopt(modelopt_dir / "broken", exclude_projections=False)


@pytest.fixture(scope="session")
def correct_export(modelopt_dir) -> Path:
    """ModelOpt's export of the same model with pre/post_projection excluded: what a correct export is."""
    return modelopt_export.export_modelopt(modelopt_dir / "correct", exclude_projections=True)


@pytest.fixture(scope="session")
def mixed_export(tmp_path_factory) -> Path:
    """ModelOpt's own MIXED_PRECISION export (tools/modelopt_mixed_export.py), made once per session."""
    from tools.modelopt_mixed_export import export_mixed_llama

    return export_mixed_llama(tmp_path_factory.mktemp("modelopt-mixed") / "export")


@pytest.fixture(scope="session")
def qwen36_export(tmp_path_factory) -> Path:
    """The published Qwen3.6-35B-A3B-NVFP4 layout (tools/real_fixture.py write_qwen36), made once per session; read-only."""
    from tools.real_fixture import write_qwen36

    return write_qwen36(tmp_path_factory.mktemp("qwen36") / "src")


@pytest.fixture(scope="session")
def real_models(tmp_path_factory) -> dict[str, Path]:
    """The tiny checkpoints with published models' real configs and names (tools/real_fixture.py REAL_MODELS), written
    once per session for every module that reads them; read-only (a test that edits one copies it first)."""
    from tools.real_fixture import REAL_MODELS, write_real_model

    root = tmp_path_factory.mktemp("real_models")
    return {key: write_real_model(root / key, key) for key in REAL_MODELS}


@pytest.fixture(scope="session")
def llama31(tmp_path_factory) -> Path:
    """Llama 3.1 8B Instruct FP4's published weight map (LLAMA_31), once per session; read-only."""
    from tools.real_fixture import real_weight_map, write_llama

    return write_llama(tmp_path_factory.mktemp("llama31") / LLAMA_31, LLAMA_31, real_weight_map(LLAMA_31))


@pytest.fixture(scope="session")
def modelopt_llama(tmp_path_factory) -> Path:
    """ModelOpt's own NVFP4 export of a tiny Llama (tools/modelopt_export.py), once per session; read-only."""
    return modelopt_export.export_tiny_llama(tmp_path_factory.mktemp("modelopt-llama") / "modelopt-llama")


@pytest.fixture(scope="session")
def ct_export(broken_export, modelopt_dir) -> Path:
    """The buggy ModelOpt export converted to compressed-tensors NVFP4 by compressed-tensors' own converter."""
    from tools import ct_export as convert

    return convert.convert_modelopt(broken_export, modelopt_dir / "compressed-tensors")


@pytest.fixture(scope="session")
def original_model(modelopt_dir) -> Path:
    return modelopt_export.save_original(modelopt_dir / "original")


@pytest.fixture(scope="session")
def broken(tmp_path_factory) -> Path:
    """The Hub tests' source (tests/hub_workflow_helpers.py): the tiny broken assistant in three shards (only
    shards 2 and 3 change), with a model card. Modules that define their own `broken` override it."""
    from repair.demo.examples import TINY, write_assistant
    from tests.hub_workflow_helpers import CARD

    folder = write_assistant(tmp_path_factory.mktemp("hubsrc") / "broken", TINY, shards=[["pre_projection"], ["post_projection"]])
    (folder / "README.md").write_text(CARD)
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 4096}\n')
    return folder


@pytest.fixture(scope="session")
def local_fix(broken, tmp_path_factory) -> Path:
    """`fix` of `broken` into a local folder: what the Hub tests compare a fork or PR with."""
    from repair.cli import main

    out = tmp_path_factory.mktemp("localfix") / "fixed"
    main(["fix", str(broken), "-o", str(out), "--quiet"])
    return out


def load_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder, via the safetensors library (an independent reader)."""
    out = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(file, "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})
    return out


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def tree_hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def run_cli(*args) -> int:
    """Run the real CLI in-process; return its exit code."""
    from repair.cli import main

    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def run_captured(capsys, *args) -> tuple[int, str, str]:
    """Run the real CLI in-process and return (exit code, stdout, stderr) of that run only."""
    capsys.readouterr()
    code = run_cli(*args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
