"""SGLang 0.5.23's own loader on an exclusion list written null (#28 attack: `"ignore": null` beside a nested ModelOpt
block, and the same in the flat form and in hf_quant_config.json): ModelOptFp4Config.from_config raises while reading
the config, and doctor's `runtime_stops_at` is that error, verbatim; `fix --target sglang==0.5.23` writes a list
there and SGLang loads the output."""

from __future__ import annotations

import pytest

from tests.test_runtime_sglang import NULL_LISTS, null_list_layout

from .probe import TARGET, load_in_sglang, repair_json, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("sglang_null_lists")
    out = {}
    for name in NULL_LISTS:
        src = null_list_layout(root, name)
        code, report = repair_json("fix", src, "-o", root / f"{name}-out", "--target", TARGET)
        assert code == 0, (name, report)
        out[name] = (src, root / f"{name}-out")
    return out


@pytest.fixture(scope="module")
def loaded(folders) -> dict:
    return load_in_sglang([d for pair in folders.values() for d in pair])


@pytest.mark.parametrize("name", sorted(NULL_LISTS))
def test_doctor_says_sglangs_config_error_and_the_fix_loads(name, folders, loaded):
    src, out = folders[name]
    line = loaded[src]
    assert not line["ok"] and line["stage"] == "build", line
    code, report = repair_json("doctor", src, "--target", TARGET)
    assert code == 1 and [s["error"] for s in report["runtime_stops_at"]] == [f"{line['error_type']}: {line['error']}"]
    fixed = loaded[out]
    assert fixed["ok"], (fixed.get("error_type"), fixed.get("error"), fixed.get("errors"))
