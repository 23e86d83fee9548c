"""doctor's refusal of a `compress_ratios` SGLang 0.5.23 does not build is SGLang's own, on the same files.

Each checkpoint (tests/test_sglang_compress_ratios.py's: nvidia's ModelOpt DeepSeek-V4 layout, the V4.1-shaped one)
is built by SGLang's own constructor as it is (tools/sglang_layer_values.py --refusal): it refuses exactly where doctor
says build-refused, in the words doctor quotes; a list it builds is built, and doctor says no refusal (and, for the
published class name `DeepseekV41ForCausalLM`, no unregistered architecture: SGLang builds it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair.errors import one_line
from tests.test_sglang_compress_ratios import _doctor, _with
from tests.test_sglang_dsv4_drops import nvidia_modelopt
from tests.test_sglang_dsv41_drops import v41
from tools.sglang_layer_drops import in_sglang

from .probe import SGLANG_VENV, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
CASES = {"v4-3": (nvidia_modelopt, [0, 4, 3]), "v4-string": (nvidia_modelopt, [0, "4", 128]),
         "v4-short": (nvidia_modelopt, [0, 4]), "v4-built": (nvidia_modelopt, [0, 4, 128]),
         "v41-3": (v41, [0, 0, 2, 2, 2, 1, 1, 3]), "v41-short": (v41, [0, 0, 2, 2, 2, 1]),
         "v41-past": (v41, [0, 0, 2, 2, 2, 1, 1, 1, 9]), "v41-built": (v41, [0, 0, 2, 2, 2, 1, 1, 1]),
         # the published class name, which SGLang's config class renames (its registry_renamed): the same build
         "v41-named-3": (lambda f: _published_name(v41(f)), [0, 0, 2, 2, 2, 1, 1, 3]),
         "v41-named-built": (lambda f: _published_name(v41(f)), [0, 0, 2, 2, 2, 1, 1, 1])}


def _published_name(folder: Path) -> Path:
    config = json.loads((folder / "config.json").read_text()) | {"architectures": ["DeepseekV41ForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_doctor_refuses_what_sglang_refuses(capsys, tmp_path: Path):
    folders = {case: _with(write(tmp_path / case), ratios) for case, (write, ratios) in CASES.items()}
    sglang = dict(zip(folders, in_sglang(SGLANG_VENV, "--refusal", *map(str, folders.values()),
                                         tool=Path(__file__).parents[2] / "tools" / "sglang_layer_values.py")))
    for case, folder in folders.items():
        findings = _doctor(capsys, folder)
        refused = [f for f in findings if f["code"] == "build-refused"]
        if sglang[case] is None:
            assert refused == [] and "unregistered-architecture" not in [f["code"] for f in findings], case
            continue
        assert len(refused) == 1, (case, sglang[case])
        assert refused[0]["runtime_error"] == one_line(sglang[case]["error"]), case  # as every message escapes it
        assert sglang[case]["where"] in refused[0]["message"], case
