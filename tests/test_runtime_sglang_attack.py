"""`--target sglang==X` against hostile exclusion lists and careless use (issue 28).

Layouts are the real qwen3-32b fixture (tools/real_fixture.py) with one exclusion list changed; the rule each test
names is SGLang's (repair/targets/data/sglang-*.json name the wheel files; runtimes_beyond_vllm.md §1.2).
"""

from __future__ import annotations

import json

import pytest

from repair.errors import UsageError
from repair.targets import profiles
from tests.conftest import run_captured
from tests.test_runtime_sglang import QKV_MIX, doctor, errors, layout


def test_fix_never_lists_only_some_shards_of_a_fused_layer_a_glob_builds_bf16(capsys, tmp_path):
    """`*` makes SGLang 0.5.23 build every layer BF16 (is_layer_excluded's glob); the stored NVFP4 k/v are
    dequantized. Listing k_proj and v_proj by exact name but not the BF16 q_proj would make is_layer_skipped raise
    its fused-shard ValueError: the output must be clean for the target (fix's own self-check, not exit 3)."""
    folder = layout(tmp_path, "qwen3-32b", bf16=r"^model\.layers\.0\.self_attn\.q_proj$|^lm_head$", exclude=["*", "lm_head"])
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", folder, "-o", out, "--target", "sglang==0.5.23")
    assert code == 0, err
    code, report = doctor(capsys, out)
    assert code == 0 and errors(report) == {}
    assert all(e["runtime_error"] != QKV_MIX for e in report["findings"])


@pytest.mark.parametrize("spec", ["sglang==0.5.23,vllm==0.32.0", "vllm==0.32.0,sglang==0.5.23", "sglang==0.5.23;vllm==0.32.0"])
def test_a_list_of_targets_is_not_read_as_its_first_one(spec):
    """`resolve` takes one target: given a list it must not silently check its first (a user asking for both would
    read "healthy" for a runtime never checked); `resolve_many` is what splits a list."""
    with pytest.raises(UsageError, match="separate several targets with single commas"):
        profiles.resolve(spec)


def test_release_suffixes_still_resolve():
    assert profiles.resolve("sglang==0.5.23rc1").profile.rules.source == "sglang-0.5.23.json"
    assert profiles.resolve("sglang==0.5.10.post1").profile.rules.source == "sglang-0.5.10.json"
    assert profiles.resolve("vllm==0.32.0+cu128").version == (0, 32, 0)  # a local version, as pip spells it


def test_a_fused_layer_refused_while_building_names_no_empty_rank(capsys, tmp_path):
    """The fused-shard ValueError stops every rank; the text must not print `(rank )`."""
    folder = layout(tmp_path, "qwen3-32b", bf16=r"^model\.layers\.0\.self_attn\.q_proj$|^lm_head$",
                    exclude=["lm_head", "model.layers.0.self_attn.q_proj"])
    code, out, _ = run_captured(capsys, "doctor", folder, "--target", "sglang==0.5.23", "--tp", "2")
    assert code == 1 and QKV_MIX in out and "(rank )" not in out


HANGING = "(a+)+$"  # SGLang escapes only `.` and `*`: re.fullmatch of this would hang on a long enough name


@pytest.mark.parametrize("where, file, place", [
    ("nested-top", "config.json", "quantization_config.ignore"),
    ("nested", "config.json", "quantization_config.quantization.exclude_modules"),
    ("flat", "config.json", "quantization_config.ignore"),
    ("hf", "hf_quant_config.json", "quantization.exclude_modules")])
@pytest.mark.parametrize("target", ["sglang==0.5.23", "vllm==0.32.0,sglang==0.5.9"])
def test_a_hanging_entry_is_refused_in_one_line_naming_its_file_and_list(capsys, tmp_path, where, file, place, target):
    """A backtracking pattern in an exclusion list SGLang turns into a regex (the top-level `ignore` beside a nested
    ModelOpt block among them) is refused in one line (exit 2) that names the file and the list it came from."""
    import json

    from tests.sglang.fixtures import FIXTURES

    key = {"nested-top": "modelopt-eagle3-draft", "nested": "modelopt-eagle3-draft", "flat": "modelopt-glm4-moe", "hf": "qwen3-32b"}[where]
    src = FIXTURES[key][1](tmp_path / where)
    doc = json.loads((src / file).read_text())
    section = doc
    for part in place.split(".")[:-1]:
        section = section[part]
    section[place.split(".")[-1]] = (section.get(place.split(".")[-1]) or []) + [HANGING]
    (src / file).write_text(json.dumps(doc))
    for command in (("doctor", src, "--target", target), ("fix", src, "-o", tmp_path / "out", "--target", target)):
        code, out, err = run_captured(capsys, *command)
        assert code == 2 and err.count("\n") == 1 and f"{file} {place}" in err and "would backtrack" in err, (command[0], err)
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ignored", [7, 70])
def test_compressed_tensors_targets_are_compiled_once_whatever_the_ignore_list(monkeypatch, tmp_path, ignored):
    """doctor --target sglang asks SGLang's rule entry by entry (unused entries); each rule compiled the config
    groups' `re:` targets again, so the work grew as ignore entries x targets (20,000 targets: 46 s). Every pattern
    is compiled a bounded number of times now (per release that reads it): linear in the config's size, whatever the
    verdict."""
    import json

    from repair.doctor.diagnose import diagnose
    from repair.io import patterns
    from repair.io.checkpoint import open_checkpoint
    from tools.real_fixture import REAL_MODELS, write_real_model

    src = write_real_model(tmp_path / "ct", "ct-llama-dense", REAL_MODELS["ct-llama-dense"])
    config = json.loads((src / "config.json").read_text())
    qc = config["quantization_config"]
    qc["ignore"] += [rf"re:.*\.nowhere{i}$" for i in range(ignored)]
    group = qc["config_groups"]["group_0"]
    group["targets"] += [rf"re:model\.layers\.{i}\.mlp\.(gate|up)_proj\.x" for i in range(300)]
    (src / "config.json").write_text(json.dumps(config))
    compiled = []
    real = patterns.RegexSet.compile.__func__

    def counting(cls, listed, *args, **kwargs):
        listed = tuple(listed)
        compiled.append(len(listed))
        return real(cls, listed, *args, **kwargs)
    monkeypatch.setattr(patterns.RegexSet, "compile", classmethod(counting))
    diagnose(open_checkpoint(src), profiles.resolve("sglang==0.5.23"), 1)
    # the target's own reading, and for entries it leaves the other shipped releases' (doctor/unused_entries.py): each
    # compiles the list at most once, so the work stays linear in the config's size
    readings = 4 + len(profiles.shipped_targets())
    assert sum(compiled) <= readings * (len(qc["ignore"]) + len(group["targets"])), (sum(compiled), len(compiled))
