"""SGLang 0.5.23's own loader judges config.json's nested ModelOpt block with a top-level list beside it (#28 attack):
it reads the top level (model_config.py copies the nested quant_algo there; ModelOptFp4Config.from_config takes the
flat branch), whether or not a quant_algo was already there. `fix --target sglang==0.5.23` keeps that list's entries
and adds its own; the output loads with no error, and a layer only the nested list names stays NVFP4."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_captured
from tests.sglang.fixtures import FIXTURES

from .probe import TARGET, load_in_sglang, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]

# top level written beside the nested block, nested exclude_modules
LAYOUTS = {
    "top-list-differs": ({"ignore": ["lm_head"]}, ["model.embed_tokens"]),
    "nested-names-a-packed-layer": ({"ignore": ["lm_head", "fc"]}, ["lm_head", "fc", "layers.0.mlp.down_proj"]),
    "top-quant-algo": ({"quant_algo": "NVFP4", "ignore": ["lm_head", "fc"]}, ["lm_head", "fc", "layers.0.mlp.down_proj"]),
}


def test_fixed_outputs_keep_sglangs_top_level_list_and_load(capsys, tmp_path):
    outs = {}
    for name, (top, nested) in LAYOUTS.items():
        src = FIXTURES["modelopt-eagle3-draft"][1](tmp_path / name)
        config = json.loads((src / "config.json").read_text())
        config["quantization_config"].update(top)
        config["quantization_config"]["quantization"]["exclude_modules"] = nested
        (src / "config.json").write_text(json.dumps(config))
        code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / f"{name}-out", "--target", TARGET, "--quiet")
        assert code == 0, (name, err)
        outs[name] = tmp_path / f"{name}-out"
    loaded = load_in_sglang(list(outs.values()))
    for name, out in outs.items():
        line = loaded[out]
        assert line["ok"], (name, line)
        if "layers.0.mlp.down_proj" in LAYOUTS[name][1]:
            assert line["layers"]["model.layers.0.mlp.down_proj"]["scheme"] == "nvfp4", (name, line["layers"])
