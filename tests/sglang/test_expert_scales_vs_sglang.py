"""SGLang 0.5.23's own code on a routed expert whose gate (w1) and up (w3) global scales differ, run on CPU
(tools/sglang_expert_probe.py: process_weights_after_loading up to the CUDA repack, the alpha helpers), against the
release's data (tools/sglang_expert_scales.py read it with ast): marlin keeps the gate's and logs, the TRT-LLM kernel's
scales carry both, and the compressed-tensors Marlin scheme refuses. Which backend reads which alpha in `apply` needs
a GPU's kernels: there the ast reading is the judge."""

from __future__ import annotations

import pytest

from repair.targets.runtime_rules import shipped_rules
from .probe import SGLANG_PY, requires_sglang, run_tool_probe

pytestmark = [pytest.mark.sglang, requires_sglang]


@pytest.fixture(scope="module")
def ran() -> dict:
    return run_tool_probe("sglang_expert_probe.py")


def fact() -> dict:
    (rules,) = [r for r in shipped_rules() if r.label == "sglang 0.5.23"]
    return rules.experts_gate_up_scale_2


def test_marlin_keeps_the_gates_and_logs_what_the_data_says(ran):
    marlin = fact()["modelopt_fp4"]["backends"]["marlin"]
    kept = {ran["gate"]: "gate", ran["up"]: "up"}
    assert {kept[v] for v in ran["marlin"]["handed"]} == {marlin["keeps"]}, ran
    assert marlin["log"] in ran["marlin"]["logged"], ran


def test_the_trtllm_kernels_scales_carry_both_halves(ran):
    """g1_alphas (the gate half, every backend's) is column 0; g1_scale_c (the TRT-LLM kernel's up half) column 1:
    flashinfer_trtllm keeps both, a backend reading g1_alphas alone keeps the gate's."""
    gate_alpha, up_alpha = ran["alphas"]
    assert set(gate_alpha) == {ran["gate"]} and set(up_alpha) == set(ran["trtllm_scale_c"]) == {ran["up"]}, ran
    keeps = {k: b["keeps"] for k, b in fact()["modelopt_fp4"]["backends"].items()}
    assert keeps["flashinfer_trtllm"] == "both" and keeps["flashinfer_cutlass"] == "gate", keeps


def test_the_compressed_tensors_marlin_scheme_refuses_in_the_words_recorded(ran):
    recorded = fact()["compressed-tensors"]["backends"]["CompressedTensorsW4A16Nvfp4MoE"]["refuses"]
    head, _, tail = recorded.removeprefix("ValueError: ").partition("...")
    assert ran["ct_w4a16_refused"] and ran["ct_w4a16_refused"].startswith(head.strip()), ran
    assert " ".join(ran["ct_w4a16_refused"].split()).endswith(" ".join(tail.split())), (ran, recorded)


def test_a_weight_only_compressed_tensors_moe_is_built_with_the_scheme_recorded_for_it(ran):
    """SGLang's own get_moe_scheme on a weight-only NVFP4 config picks the scheme the data records for w4a16_nvfp4,
    without asking for a GPU: the one that refuses any difference."""
    weight_only = fact()["compressed-tensors"]["by_precision"]["w4a16_nvfp4"]
    assert [d["backend"] for d in weight_only["default"]] == [ran["ct_weight_only_scheme"]], (weight_only, ran)
    assert weight_only["backends"][ran["ct_weight_only_scheme"]]["refuses"], weight_only


@pytest.mark.parametrize("method", ["modelopt_fp4", "modelopt_mixed"])
def test_the_default_backend_by_gpu_is_the_one_sglang_picks(ran, method):
    """Each GPU's default in the data (the first whose condition holds) is what SGLang's own server args and
    create_moe_runner pick for it with `--quantization` unset, `modelopt_fp4` or `modelopt_mixed`."""
    default = fact()[method]["default"]

    def recorded(major: int, flag: str | None) -> str:
        for d in default:
            if f"{major}.x" in d["when"] and ("--quantization" not in d["when"] or f"--quantization {flag} " in d["when"]) \
                    or (d["when"].startswith("on a CUDA GPU of compute capability 8.0 to 9.x") and major in (8, 9)) \
                    or d["when"] == "otherwise":
                return d["backend"]
        raise AssertionError(default)
    for major in (8, 9, 10, 11, 12):
        for flag in (None, method):
            assert ran["picked"][f"{major}.0 {flag}"] == recorded(major, flag), (major, flag, ran["picked"], default)


def installed_as_wheel(folder, edit=lambda name, text: text):
    """The installed release's files the reading needs, zipped under a wheel's name (`edit` may change one)."""
    import zipfile

    (site,) = SGLANG_PY.parent.parent.glob("lib/python3*/site-packages")
    path = folder / "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(path, "w") as out:
        for file in [*(site / "sglang" / "srt" / "layers").rglob("*.py"), site / "sglang" / "srt" / "arg_groups" / "overrides.py"]:
            name = str(file.relative_to(site))
            out.writestr(name, edit(name, file.read_text(encoding="utf-8")))
    return path


def test_the_shipped_data_is_the_reading_of_the_installed_release(tmp_path):
    from tools.sglang_expert_scales import read_wheel

    release, _, facts = read_wheel(installed_as_wheel(tmp_path))
    assert release == "0.5.23" and facts == fact(), facts


def test_the_reading_follows_a_changed_column_and_stops_on_a_changed_shape(tmp_path):
    """Marlin keeping column 1 is read as the up's; a helper no longer split into both columns stops the tool."""
    from tools.sglang_expert_scales import read_wheel

    marlin = "w13_weight_scale_2 = layer.w13_weight_scale_2[:, 0]"
    up = lambda name, text: text.replace(marlin, marlin.replace("0]", "1]")) if name.endswith("modelopt_quant.py") else text  # noqa: E731
    (tmp_path / "up").mkdir()
    _, _, facts = read_wheel(installed_as_wheel(tmp_path / "up", up))
    assert facts["modelopt_fp4"]["backends"]["marlin"]["keeps"] == "up", facts
    split = "up_scale = w13_weight_scale_2[:, 1]"
    one = lambda name, text: text.replace(split, "up_scale = gate_scale") if name.endswith("modelopt_quant.py") else text  # noqa: E731
    (tmp_path / "one").mkdir()
    with pytest.raises(SystemExit, match="no longer splits"):
        read_wheel(installed_as_wheel(tmp_path / "one", one))


def test_the_reading_follows_the_server_args_pick_and_stops_on_another_test(tmp_path):
    """The server args' modelopt_fp4 pick on SM110/SM120 (arg_groups/overrides.py) is read from its test: another GPU
    named there is read as written; a condition the reading does not know stops the tool."""
    from tools.sglang_expert_scales import read_wheel

    test = "(get_platform().is_sm120 or get_platform().is_sm110)"
    on = lambda new: lambda name, text: text.replace(test, new) if name.endswith("overrides.py") else text  # noqa: E731
    (overrides,) = SGLANG_PY.parent.parent.glob("lib/python3*/site-packages/sglang/srt/arg_groups/overrides.py")
    assert test in overrides.read_text(encoding="utf-8")  # the premise: the edits below change SGLang's own test
    (tmp_path / "sm12").mkdir()
    _, _, facts = read_wheel(installed_as_wheel(tmp_path / "sm12", on("get_platform().is_sm120")))
    assert facts["modelopt_fp4"]["default"][0]["when"].startswith("on a GPU of compute capability 12.x "), facts
    (tmp_path / "odd").mkdir()
    with pytest.raises(SystemExit, match="read it anew"):
        read_wheel(installed_as_wheel(tmp_path / "odd", on("(get_platform().is_sm120 or view.tp_size > 1)")))
    pick = 'moe_runner_backend = "flashinfer_cutlass"'
    again = lambda name, text: text.replace(pick, pick.replace("cutlass", "trtllm")) if name.endswith("overrides.py") else text  # noqa: E731
    (tmp_path / "again").mkdir()
    with pytest.raises(SystemExit, match="under two conditions"):  # flashinfer_trtllm is create_moe_runner's `otherwise`
        read_wheel(installed_as_wheel(tmp_path / "again", again))
