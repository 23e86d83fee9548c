"""Which of config.json's `architectures` a vLLM release builds (repair/arch/registry.py), from each profile's own
registry (tools/vllm_registry.py; tests/vllm/test_registry_vs_vllm.py checks every verdict here against vLLM itself):
the first listed name the release registers; none registered: its Transformers backend for the first name when
transformers has that class; else vLLM refuses the model while reading the config, in its own words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair import arch
from tests.conftest import run_captured
from tests.test_doctor_load_refused import DBRX, DBRX_ERROR, write_dbrx

REGISTRY = {p.label: p.registry for p in arch.PROFILES if p.runtime == "vllm"}
NEWEST, OLDEST = REGISTRY["vllm 0.32.0"], REGISTRY["vllm 0.28.0"]
# a name vLLM 0.32 retired that 0.28 still builds (its own message names the release), taken from the data
RETIRED = next(n for n in sorted(NEWEST.retired) if n in OLDEST.names and n not in NEWEST.fallback)
FALLBACK = next(n for n in sorted(NEWEST.fallback) if n.endswith("ForCausalLM"))  # transformers' class, no vLLM one


def doctor_json(capsys, folder: Path, *args: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--json", *args)
    assert code in (0, 1) and "Traceback" not in err, err
    return code, json.loads(out)


def dbrx(tmp_path: Path, listed, quantized: bool = True) -> Path:
    return write_dbrx(tmp_path / "ckpt", quantized=quantized, config=dict(DBRX, architectures=listed))


def unregistered(found: dict) -> list[dict]:
    return [f for f in found["findings"] if f["code"] == "unregistered-architecture"]


def test_no_listed_name_registered_is_refused_in_vllms_words_on_every_rank(tmp_path, capsys):
    code, found = doctor_json(capsys, dbrx(tmp_path, ["NotARealForCausalLM"]), "--target", "vllm==0.32.0", "--tp", "2")
    error = "ValueError: " + NEWEST.unsupported.replace("{architectures}", "['NotARealForCausalLM']")
    [f] = unregistered(found)
    assert code == 1 and f["runtime_error"] == error and f["severity"] == "error", f
    assert [(s["rank"], s["error"]) for s in found["runtime_stops_at"]] == [(0, error), (1, error)]
    assert not [f for f in found["findings"] if f["code"] == "load-refused"]  # no DBRX class is built: no KeyError claimed


def test_fix_for_that_release_refuses_in_one_line(tmp_path, capsys):
    folder, out_dir = dbrx(tmp_path, ["NotARealForCausalLM"]), tmp_path / "fixed"
    code, out, err = run_captured(capsys, "fix", folder, "-o", out_dir, "--target", "vllm==0.32.0")
    [line] = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and "[unregistered-architecture]" in line and "not supported for now" in line, err
    assert "nothing was written" in line and not out_dir.exists()


def test_the_first_registered_name_is_built_even_after_thousands_of_unknown_ones(tmp_path, capsys):
    """vLLM skips every unregistered name (10^5 of them here) and builds DBRX, whose load_weights fails."""
    listed = [f"Unknown{i}ForCausalLM" for i in range(100_000)] + ["DbrxForCausalLM"]
    code, found = doctor_json(capsys, dbrx(tmp_path, listed), "--target", "vllm==0.32.0")
    assert code == 1 and not unregistered(found)
    assert [f["runtime_error"] for f in found["findings"] if f["code"] == "load-refused"] == [DBRX_ERROR]


def test_a_name_one_release_retired_is_refused_by_it_only_with_its_own_message(tmp_path, capsys):
    folder = dbrx(tmp_path, [RETIRED])
    code, found = doctor_json(capsys, folder, "--target", "vllm==0.32.0")
    [f] = unregistered(found)
    assert code == 1 and f["runtime_error"] == f"ValueError: {NEWEST.retired[RETIRED]}" and "vllm 0.28.0" in f["message"], f
    assert not unregistered(doctor_json(capsys, folder, "--target", "vllm==0.28.0")[1])


def test_a_transformers_class_vllm_does_not_register_is_a_note_about_the_backend(tmp_path, capsys):
    code, found = doctor_json(capsys, dbrx(tmp_path, [FALLBACK, "NotARealForCausalLM"], quantized=False),
                              "--target", "vllm==0.32.0")
    assert not unregistered(found) and not found["runtime_stops_at"]
    [note] = [n for n in found["notes"] if n["code"] == "unregistered-architecture"]
    assert "Transformers backend" in note["message"] and FALLBACK in note["message"], note
    # the backend builds AutoModel.from_config(config) (vLLM 0.32 models/transformers/base.py:179; SGLang's the
    # same): the model config.json's model_type names, not the class the listed name is
    assert "AutoModel makes of config.json (its model_type)" in note["message"] and f"builds transformers' {FALLBACK}" not in note["message"]


def test_another_runtime_is_not_judged_by_vllms_registry(tmp_path, capsys):
    code, found = doctor_json(capsys, dbrx(tmp_path, ["NotARealForCausalLM"]), "--target", "vllm==0.32.0,sglang==0.5.23")
    verdicts = {t["target"]: t for t in found["targets"]}
    [vllm], [sglang] = unregistered(verdicts["vllm==0.32.0"]), unregistered(verdicts["sglang==0.5.23"])
    assert "not supported for now" in vllm["runtime_error"] and "Cannot find model module" in sglang["runtime_error"]


def test_the_gemma4_assistant_is_not_judged_by_the_registry(tmp_path, capsys):
    """vLLM 0.32 registers no Gemma4AssistantForCausalLM: it loads the assistant as a draft model, renamed
    Gemma4MTPModel (config/speculative.py), which the hand row describes."""
    from repair.demo.examples import write_assistant

    folder = write_assistant(tmp_path / "assistant")
    assert json.loads((folder / "config.json").read_text())["architectures"][0] not in NEWEST.names
    assert not unregistered(doctor_json(capsys, folder, "--target", "vllm==0.32.0")[1])


@pytest.mark.parametrize("listed,where", [("DbrxForCausalLM", "architectures"), ({"0": "DbrxForCausalLM"}, "architectures"),
                                          (7, "architectures"), (["DbrxForCausalLM", None, {"a": 1}], "architectures.1"),
                                          ([["DbrxForCausalLM"]], "architectures.0")])
def test_architectures_not_a_list_of_strings_is_refused_as_vllms_config_validation_does(tmp_path, capsys, listed, where):
    """vLLM's ModelConfig validates `architectures` as a list of strings (pydantic): anything else is refused before
    any class is looked up, in the words the profile records (`malformed`); fix refuses in one line."""
    folder = dbrx(tmp_path, listed)
    code, found = doctor_json(capsys, folder, "--target", "vllm==0.32.0", "--tp", "2")
    [f] = unregistered(found)
    assert code == 1 and f["runtime_error"].startswith(f"ValidationError: {where}: Input should be a valid "), f
    assert [s["error"] for s in found["runtime_stops_at"]] == [f["runtime_error"]] * 2
    assert not [f for f in found["findings"] if f["code"] == "load-refused"]
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", "vllm==0.32.0")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "[unregistered-architecture]" in err, err


# null, empty or absent: tests/test_unlisted_architectures.py (the profile's `unlisted`)


def test_a_huge_name_is_cut_in_every_message(tmp_path, capsys):
    code, found = doctor_json(capsys, dbrx(tmp_path, ["X" * 1_000_000]), "--target", "vllm==0.32.0")
    [f] = unregistered(found)
    assert code == 1 and max(len(g["message"]) + len(g.get("runtime_error") or "") for g in found["findings"]) < 5000


def test_a_name_cannot_forge_an_output_line(tmp_path, capsys):
    """A listed name holding a newline and an escape sequence: every line doctor prints that repeats it stays one."""
    folder = dbrx(tmp_path, ["Foo\nerror: forged\x1b[31m"])
    code, out, err = run_captured(capsys, "doctor", folder, "--target", "vllm==0.32.0")
    assert code == 1 and not [line for line in out.splitlines() if line.startswith("error: forged")], out
    assert "\x1b" not in out


def test_sglang_builds_the_first_name_it_registers_and_is_not_judged_without_one():
    """SGLang 0.5.23's resolve_model_cls builds the first listed name its registry has (its rules file's `registry`,
    the wheel's EntryClass lists; tests/sglang/test_registry_vs_sglang.py asks SGLang); with none registered its
    Transformers backend's recorded gate refuses (tests/test_sglang_fallback.py); 0.5.9 records its registry but not
    that gate, so with none registered the first listed name is read, as before, and no error is claimed."""
    from repair.targets.profiles import resolve

    sglang, older = resolve("sglang==0.5.23"), resolve("sglang==0.5.9")
    assert sglang.built({"architectures": ["NotARealForCausalLM", "DbrxForCausalLM"]}).name == "DbrxForCausalLM"
    assert "Cannot find model module" in sglang.built({"architectures": ["NotARealForCausalLM"]}).error
    assert older.built({"architectures": ["NotARealForCausalLM"]}).error is None
    assert older.built({"architectures": ["NotARealForCausalLM"]}).name == "NotARealForCausalLM"


def test_a_release_older_than_every_profile_is_not_judged_by_the_oldest_registry(tmp_path, capsys):
    """vLLM 0.25 is older than every shipped profile: a name 0.28 does not register may be one 0.25 did."""
    code, found = doctor_json(capsys, dbrx(tmp_path, ["NotARealForCausalLM"]), "--target", "vllm==0.25.0")
    assert not unregistered(found)


def test_remote_code_in_auto_map_is_a_note_saying_what_each_flag_does(tmp_path, capsys):
    """auto_map names an AutoModel class: vLLM's fallback loads it under --trust-remote-code (registry.py
    _try_resolve_transformers), and refuses without: doctor cannot know the flag, so it says both, as a note."""
    folder = write_dbrx(tmp_path / "remote", quantized=True, config=dict(
        DBRX, architectures=["MyRemoteForCausalLM"], auto_map={"AutoConfig": "x.C", "AutoModelForCausalLM": "x.M"}))
    code, found = doctor_json(capsys, folder, "--target", "vllm==0.32.0")
    assert not unregistered(found) and not found["runtime_stops_at"]
    [note] = [n for n in found["notes"] if n["code"] == "unregistered-architecture"]
    assert "--trust-remote-code" in note["message"] and "not supported for now" in note["message"], note


@pytest.mark.parametrize("name", ["DbrxForSequenceClassification", "DbrxModel", "DbrxForRewardModeling"])
def test_a_task_suffix_on_a_registered_class_is_that_class_not_a_refusal(tmp_path, capsys, name):
    """vLLM builds DbrxForCausalLM converted for these (registry.py _normalize_arch, its suffix table recorded as
    `suffixes`): no unregistered-architecture error, and the DBRX row applies."""
    from repair.targets.profiles import resolve

    assert resolve("vllm==0.32.0").built({"architectures": [name]}).name == "DbrxForCausalLM"
    assert not unregistered(doctor_json(capsys, dbrx(tmp_path, [name]), "--target", "vllm==0.32.0")[1])


@pytest.mark.parametrize("listed,built", [
    (["DbrxModel", "LlamaForCausalLM"], "DbrxForCausalLM"),  # the runner is read from DbrxModel: pooling, converted
    (["LlamaForSequenceClassification", "DbrxForCausalLM"], "LlamaForCausalLM"),
    (["NotARealForCausalLM", "DbrxModel"], None),  # runner "generate": DbrxModel's "Model" suffix is not matched
    (["NotARealForCausalLM", "DbrxForSequenceClassification"], None)])
def test_listed_names_are_tried_in_order_under_the_runner_the_first_suffix_sets(listed, built):
    """vLLM tries each listed name in order, a task-suffixed one normalized under the runner and convert type its
    ModelConfig read from the first name that has one (config/model.py _get_default_runner_type, registry.py
    _normalize_arch): not the first registered name wherever it stands (tests/vllm/test_registry_vs_vllm.py asks vLLM)."""
    from repair.targets.profiles import resolve

    found = resolve("vllm==0.32.0").built({"architectures": listed})
    assert found.name == built and (found.error is None) == (built is not None), found


def test_sglang_reads_the_row_of_the_class_it_builds_not_of_the_first_listed(tmp_path, capsys, real_models):
    """SGLang 0.5.23 builds DeepseekV3ForCausalLM for [unknown, DeepseekV3ForCausalLM] (its `registry`): the rows it
    borrows are that class's (DeepSeek-R1's published exclusions split fused_qkv_a_proj), as for the plain list."""
    import shutil

    plain = real_models["deepseek-r1"]
    listed = shutil.copytree(plain, tmp_path / "listed")
    config = json.loads((listed / "config.json").read_text())
    (listed / "config.json").write_text(json.dumps(dict(config, architectures=["NotARealForCausalLM", *config["architectures"]])))
    said = [{(f["code"], f["subject"]) for f in doctor_json(capsys, folder, "--target", "sglang==0.5.23")[1]["findings"]}
            for folder in (plain, listed)]
    assert said[0] == said[1] and any(code == "fused-shards" for code, _ in said[0]), said


def test_a_release_past_the_newest_profile_gets_a_note_not_a_refusal(tmp_path, capsys):
    """Registries grow with every release (0.30 -> 0.32 added ExaoneMoEForCausalLM, among others): vLLM 0.33 may
    register a class 0.32 does not, so the newest profile's "not supported" is said as a note; doctor exits 0 and
    `fix --target` is not refused for it."""
    folder = dbrx(tmp_path, ["NotARealForCausalLM"])
    code, found = doctor_json(capsys, folder, "--target", "vllm==0.33.0")
    assert code == 0 and not unregistered(found) and not found["runtime_stops_at"], found["findings"]
    [note] = [n for n in found["notes"] if n["code"] == "unregistered-architecture"]
    assert "vllm 0.32.0" in note["message"] and "0.33.0" in note["message"] and "not supported for now" in note["message"], note
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "fixed", "--target", "vllm==0.33.0", "--dry-run")
    assert code == 0 and "unregistered" not in err, err


def test_a_release_between_profiles_is_refused_only_when_the_newer_profile_refuses_too(tmp_path, capsys):
    """0.31 takes 0.30's rows; a class 0.32 registers and 0.30 does not may be 0.31's (a note); one neither registers
    is not (vLLM's error, as for a profiled release)."""
    code, found = doctor_json(capsys, dbrx(tmp_path, ["NotARealForCausalLM"]), "--target", "vllm==0.31.0")
    [f] = unregistered(found)
    assert code == 1 and f["severity"] == "error", f
    code, found = doctor_json(capsys, dbrx(tmp_path / "b", ["ExaoneMoEForCausalLM"]), "--target", "vllm==0.31.0")
    assert not unregistered(found), found["findings"]
    [note] = [n for n in found["notes"] if n["code"] == "unregistered-architecture"]
    assert "vllm 0.32.0" in note["message"], note


def test_a_retired_name_is_refused_past_the_newest_profile_too(tmp_path, capsys):
    """A retired name carries vLLM's own "was supported until" message: no later release brings it back."""
    code, found = doctor_json(capsys, dbrx(tmp_path, [RETIRED]), "--target", "vllm==0.33.0")
    [f] = unregistered(found)
    assert code == 1 and f["severity"] == "error" and f["runtime_error"] == f"ValueError: {NEWEST.retired[RETIRED]}", f
