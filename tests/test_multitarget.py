"""Several targets at once (#28.3): `--target a,b,c` in doctor (side by side, worst exit code, JSON of the
one-target objects) and in fix (one output every target passes with doctor --strict, the report lists them).

The several targets here are vLLM releases and bf16, whose verdicts on the buggy Gemma 4 assistant differ:
vLLM 0.21-0.24 build every drafter linear in BF16 (the packed layers fail to load), vLLM >= 0.25 follow the
checkpoint's config (it loads; the packed handshake layers are warnings), bf16 wants no quantization at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair.demo.examples import TINY, write_assistant
from repair.errors import UsageError
from repair.targets.profiles import resolve_many
from tests.conftest import run_captured

OLD, NEW = "vllm==0.22.1", "vllm==0.32.0"


def run(capsys, *args) -> tuple[int, str]:
    code, out, err = run_captured(capsys, *args)
    return code, out + err


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    return write_assistant(tmp_path_factory.mktemp("mt") / "broken", TINY, broken=True)


def test_resolve_many_keeps_order_and_collapses_a_release_named_twice():
    assert [t.spec for t in resolve_many(f"{NEW}, vllm==0.32 ,{OLD},bf16,{NEW}")] == [NEW, OLD, "bf16"]
    assert [t.spec for t in resolve_many(None)] == [NEW]


def test_runtime_names_are_case_insensitive_as_pip_reads_them(capsys, broken):
    """pip reads `VLLM==0.32.0` and `SGLang==0.5.23` as vllm and sglang (package names are case-insensitive): so does
    --target, naming each the canonical way in what it prints and records; a release named twice counts once."""
    mixed = resolve_many("VLLM==0.32.0,SGLang==0.5.23,TrtLLM==1.0,Bf16,vllm==0.32.0")
    plain = resolve_many("vllm==0.32.0,sglang==0.5.23,trtllm==1.0,bf16")
    assert [t.spec for t in mixed] == [t.spec for t in plain] == ["vllm==0.32.0", "sglang==0.5.23", "trtllm==1.0", "bf16"]
    assert [t.profile for t in mixed] == [t.profile for t in plain]
    code, out = run(capsys, "doctor", broken, "--target", "SGLang==0.5.23")
    assert code in (0, 1) and "target sglang==0.5.23 " in out, out


@pytest.mark.parametrize("spec, canonical", [("VLLM == 0.32.0", "vllm==0.32.0"), ("trtllm ==1.1", "trtllm==1.1"),
                                             ("SGLang== 0.5.23", "sglang==0.5.23")])
def test_a_spelled_out_spec_is_printed_and_recorded_the_canonical_way(spec, canonical):
    """Spaces around `==` (as pip accepts them) are not part of the target's name in what is printed and recorded:
    `doctor --json`'s `target` and fix's report read the same whatever the user typed."""
    assert [t.spec for t in resolve_many(spec)] == [canonical]


def test_a_semicolon_between_targets_names_the_comma(capsys, broken):
    """Several targets are supported (commas): a `;` between them is refused saying so, not "not supported yet"."""
    code, out = run(capsys, "doctor", broken, "--target", "vllm==0.32.0;bf16")
    assert code == 2 and "comma" in out and "not supported" not in out, out


@pytest.mark.parametrize("spec, part", [(f"{NEW},vllm=0.22", "part 2"), (f"{NEW},,bf16", "part 2"), (f"bf16,{NEW},", "part 3"),
                                        ("vllm==0.20.0,bf16", "part 1")])
def test_a_bad_part_names_itself_in_one_line(capsys, broken, spec, part):
    with pytest.raises(UsageError, match=part):
        resolve_many(spec)
    code, out = run(capsys, "doctor", broken, "--target", spec)
    assert code == 2 and part in out and len(out.strip().splitlines()) == 1 and "Traceback" not in out


def test_doctor_json_with_several_targets_holds_each_one_target_object_unchanged(capsys, broken):
    code, out = run(capsys, "doctor", broken, "--json", "--target", f"{OLD},{NEW},bf16")
    several = json.loads(out)
    assert code == 1 and several["exit_code"] == 1 and list(several) == ["exit_code", "targets"]
    for spec, got in zip((OLD, NEW, "bf16"), several["targets"]):
        alone_code, alone = run(capsys, "doctor", broken, "--json", "--target", spec)
        assert got == json.loads(alone) and got["exit_code"] == alone_code
    assert [t["exit_code"] for t in several["targets"]] == [1, 0, 1]


def test_doctor_exit_code_is_the_worst_target(capsys, broken):
    assert run(capsys, "doctor", broken, "--target", NEW)[0] == 0
    assert run(capsys, "doctor", broken, "--target", f"{NEW},vllm==0.25.0")[0] == 0
    assert run(capsys, "doctor", broken, "--target", f"{NEW},{OLD}")[0] == 1
    assert run(capsys, "doctor", broken, "--target", f"{NEW},vllm==0.25.0", "--strict")[0] == 1  # the warnings count


def test_doctor_text_is_a_summary_then_one_verdict_per_target_then_shared_findings_once(capsys, broken):
    code, out = run(capsys, "doctor", broken, "--target", f"{OLD},{NEW}")
    lines = out.splitlines()
    assert code == 1 and lines[0].startswith("2 targets, tensor parallel 1: 1 clean, 1 with problems; next: ")
    assert f"--target {OLD},{NEW} --dry-run" in lines[0]
    assert lines[1].split()[0] == OLD and "does not load (stops at " in lines[1]
    assert lines[2].split()[0] == NEW and "healthy" in lines[2]
    assert out.count("RuntimeError: start (0) + length (128) exceeds dimension size (64).") >= 1
    old_part = out[out.index(f"\n{OLD} ("):out.index(f"\n{NEW} (")]
    assert "[load-error]" in old_part and "[load-error]" not in out[out.index(f"\n{NEW} ("):]
    code, out = run(capsys, "doctor", broken, "--target", f"{NEW},vllm==0.25.0")
    shared = out[out.index("\nevery target:"):out.index(f"\n{NEW} (")]
    assert shared.count("[handshake-quantized]") == 2 and out.count("[handshake-quantized]") == 2  # said once, for both
    assert "each target loads it" in shared


def test_one_target_output_is_unchanged_by_the_comma_form(capsys, broken):
    for args in (("--json",), (), ("--quiet",), ("--verbose", "--strict")):
        assert run(capsys, "doctor", broken, "--target", OLD, *args) == run(capsys, "doctor", broken, "--target", f"{OLD},{OLD}", *args)


def fix_json(capsys, src, out, *args) -> tuple[int, dict | str]:
    code, text = run(capsys, "fix", src, "-o", out, "--json", *args)
    return code, json.loads(text) if code == 0 else text


def dequantized(plan: dict) -> set[str]:
    return {c["module"] for c in plan["changes"] if c["action"] == "dequantize"}


def test_fix_for_two_targets_whose_single_fixes_differ_passes_both(capsys, broken, tmp_path):
    """The 0.32.0 fix (the handshake layers only) still fails in 0.22.1; the two-target fix is the union of the
    single-target plans, its output passes doctor --strict for both, and the report lists both targets."""
    _, alone_new = fix_json(capsys, broken, tmp_path / "new", "--target", NEW)
    _, alone_old = fix_json(capsys, broken, tmp_path / "old", "--dry-run", "--target", OLD)
    assert dequantized(alone_new["plan"]) != dequantized(alone_old["plan"])
    assert run(capsys, "doctor", tmp_path / "new", "--target", OLD)[0] == 1  # one target's fix is not the other's
    code, both = fix_json(capsys, broken, tmp_path / "both", "--target", f"{NEW},{OLD}")
    assert code == 0 and both["status"] == "written"
    assert dequantized(both["plan"]) == dequantized(alone_new["plan"]) | dequantized(alone_old["plan"])
    for spec in (NEW, OLD, f"{OLD},{NEW}"):
        assert run(capsys, "doctor", tmp_path / "both", "--target", spec, "--strict")[0] == 0
    report = json.loads((tmp_path / "both/repair_report.json").read_text())
    assert report["options"]["target"] == f"{NEW},{OLD}" and report["recipe"]["resolved_from_target"] == f"{NEW},{OLD}"
    records = report["doctor"]["targets"]
    assert [r["target"] for r in records] == [NEW, OLD]
    assert [r["before"]["exit_code"] for r in records] == [1, 1] and [r["after"]["exit_code"] for r in records] == [0, 0]
    code, _ = fix_json(capsys, broken, tmp_path / "again", "--recipe", tmp_path / "both/repair_report.json")
    assert code == 0 and all((tmp_path / "again" / p.name).read_bytes() == p.read_bytes() for p in (tmp_path / "both").iterdir())


def test_fix_with_one_target_keeps_its_report_form(capsys, broken, tmp_path):
    assert fix_json(capsys, broken, tmp_path / "one", "--target", NEW)[0] == 0
    doctor = json.loads((tmp_path / "one/repair_report.json").read_text())["doctor"]
    assert list(doctor) == ["target", "before", "after"] and doctor["target"] == NEW


def test_fix_for_bf16_and_a_runtime_is_the_bf16_fix_checked_for_both(capsys, broken, tmp_path):
    _, alone = fix_json(capsys, broken, tmp_path / "x", "--dry-run", "--target", "bf16")
    code, both = fix_json(capsys, broken, tmp_path / "both", "--target", f"bf16,{NEW}")
    assert code == 0 and dequantized(both["plan"]) == dequantized(alone["plan"])
    assert run(capsys, "doctor", tmp_path / "both", "--target", f"{NEW},bf16", "--strict")[0] == 0


def test_fix_asks_doctor_once_per_target_per_checkpoint(capsys, broken, tmp_path, monkeypatch):
    """No module-level cache: the diagnosis is passed along (derived recipe, plan check, report's 'before')."""
    import repair.doctor.diagnose as diagnose_module

    asked: list[tuple[str, str]] = []
    real = diagnose_module._diagnose

    def counted(ckpt, target, *rest):
        asked.append((Path(ckpt.root).name, target.spec))
        return real(ckpt, target, *rest)

    monkeypatch.setattr(diagnose_module, "_diagnose", counted)
    assert fix_json(capsys, broken, tmp_path / "out", "--target", f"{NEW},{OLD}")[0] == 0
    source = [spec for root, spec in asked if root == "broken"]
    assert sorted(source) == sorted([NEW, OLD]), asked
    assert len(asked) == 4, asked  # and once per target on the output (doctor after)


def test_two_targets_wanting_contradictory_things_are_refused_in_one_line_naming_both(capsys, broken, tmp_path, monkeypatch):
    """No shipped pair of rules contradicts today (every derived change dequantizes and excludes, which no runtime
    refuses), so the second target's rules are stood in for: on the output, vllm==0.32.0 reports the layer that only
    vllm==0.22.1's repair dequantizes. The writer's check per target names both, exit 2, and nothing is written."""
    import repair.doctor.diagnose as diagnose_module
    from repair.doctor.findings import Finding, Kind, Severity

    real = diagnose_module._diagnose

    def stricter(ckpt, target, *rest):
        found = real(ckpt, target, *rest)
        if target.spec == NEW and Path(ckpt.root) != broken:  # the output, for the runtime that follows the config
            extra = Finding(Severity.ERROR, Kind.LOAD_ERROR, "model.layers.0.mlp.down_proj",
                            "model.layers.0.mlp.down_proj: stored bf16 but this stand-in runtime builds it nvfp4")
            return diagnose_module.Diagnosis(**{**found.__dict__, "findings": found.findings + (extra,)})
        return found

    monkeypatch.setattr(diagnose_module, "_diagnose", stricter)
    code, out = run(capsys, "fix", broken, "-o", tmp_path / "out", "--target", f"{NEW},{OLD}")
    assert code == 2 and not (tmp_path / "out").exists() and "Traceback" not in out
    (line,) = out.strip().splitlines()
    assert f"no one output is clean for both {OLD} and {NEW}" in line
    assert "dequantizing model.layers.0.mlp.down_proj, which vllm==0.22.1 needs" in line and "[load-error]" in line
    monkeypatch.setattr(diagnose_module, "_diagnose", real)
    assert run(capsys, "fix", broken, "-o", tmp_path / "out", "--target", f"{NEW},{OLD}")[0] == 0


def test_a_hostile_target_list_is_one_short_line(capsys, broken):
    many = ",".join(f"vllm==0.{25 + i // 10}.{i % 10}" for i in range(40))
    code, out = run(capsys, "doctor", broken, "--target", many)
    assert code == 2 and "more than 16 different targets" in out and len(out.strip().splitlines()) == 1 and len(out) < 600
    code, out = run(capsys, "doctor", broken, "--target", "bf16," * 5000 + "vllm==0.32.0\nx")
    assert code == 2 and len(out.strip().splitlines()) == 1 and len(out) < 600 and "part 5001" in out
    assert [t.spec for t in resolve_many("bf16," * 5000 + "bf16")] == ["bf16"]  # a target named many times is one


SGLANG = "sglang==0.5.23"


def test_a_checkpoint_that_loads_in_vllm_but_not_sglang_is_fixed_for_both(capsys, tmp_path):
    """The README's example (tests/test_readme.py runs it as written): exclusions spelled `model.pre_projection`
    (sglang#36596). vLLM reads them as the layers; SGLang 0.5.23 builds the BF16 layers NVFP4 and stops. One fix
    for both: exact entries added, the spellings SGLang finds unused removed, no weight rewritten."""
    src = write_assistant(tmp_path / "prefixed", TINY, broken=False, exclusion_prefix="model.")
    assert run(capsys, "doctor", src, "--target", NEW, "--strict")[0] == 0
    code, out = run(capsys, "doctor", src, "--target", SGLANG)
    assert code == 1 and "[load-error] pre_projection: stored bf16" in out
    code, out = run(capsys, "doctor", src, "--json", "--target", f"{NEW},{SGLANG}")
    assert code == 1 and [t["exit_code"] for t in json.loads(out)["targets"]] == [0, 1]
    code, fixed = fix_json(capsys, src, tmp_path / "both", "--target", f"{NEW},{SGLANG}")
    assert code == 0 and not fixed["plan"]["changes"]  # configs only: the weights were right
    assert set(fixed["plan"]["exclusions_added"]) == {"pre_projection", "post_projection"}
    for spec in (NEW, SGLANG, f"{NEW},{SGLANG}"):
        assert run(capsys, "doctor", tmp_path / "both", "--target", spec, "--strict")[0] == 0, spec
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"ckpt-repair fix work/prefixed-assistant -o work/fixed-both --target {NEW},{SGLANG}" in readme


def test_the_order_of_the_targets_changes_no_output_byte_but_the_report(capsys, broken, tmp_path):
    for name, spec in (("ab", f"{OLD},{SGLANG}"), ("ba", f"{SGLANG},{OLD}")):
        assert run(capsys, "fix", broken, "-o", tmp_path / name, "--target", spec, "--quiet")[0] == 0
    files = sorted(p.name for p in (tmp_path / "ab").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "ba").iterdir())
    assert all((tmp_path / "ab" / n).read_bytes() == (tmp_path / "ba" / n).read_bytes() for n in files if n != "repair_report.json")


def test_fix_per_rank_for_two_targets_records_each_at_that_degree(capsys, broken, tmp_path):
    assert run(capsys, "fix", broken, "-o", tmp_path / "tp", "--target", f"{NEW},{OLD}", "--tp", "2", "--quiet")[0] == 0
    records = json.loads((tmp_path / "tp/repair_report.json").read_text())["doctor"]["targets"]
    assert [(r["target"], r["tp"], r["before"]["tp"]) for r in records] == [(NEW, 2, 2), (OLD, 2, 2)]
    assert sorted(p.name for p in (tmp_path / "tp").iterdir()) == ["rank-0", "rank-1", "repair_report.json", "tp_manifest.json"]


def test_control_characters_in_a_target_spelling_cannot_forge_lines(capsys, broken):
    """A release suffix is only what pip writes (rc1, .post1, +cu128): this spelling is refused, and the one line
    naming it shows the control characters escaped."""
    code, out = run(capsys, "doctor", broken, "--target", f"{NEW}\x1b[2J\x08ok,bf16")
    assert code == 2 and "\x1b" not in out and "\x08" not in out and "\\x1b[2J" in out


@pytest.mark.parametrize("spec", ["vllm==0.32.0;bf16", "vllm==0.32.0;sglang==0.5.23"])
def test_a_semicolon_list_is_told_to_use_commas_not_that_several_are_unsupported(spec):
    """Several targets are supported (`a,b`): a `;` list is told how to write one, never 'not supported yet'."""
    with pytest.raises(UsageError) as err:
        resolve_many(spec)
    assert "not supported" not in str(err.value) and "single commas, e.g. vllm==0.32.0,bf16" in str(err.value), str(err.value)


@pytest.mark.parametrize("spec", ["vllm==\u0660.32.0", "vllm==0.\u0663\u0662.0", "vllm\u3000==0.32.0", "vllm==0.32.0\u00e9"])
def test_a_release_spelled_with_non_ascii_digits_or_letters_is_refused(spec):
    """A typed target (the web page takes them) is recorded verbatim in the report, PR title and command line: Arabic-
    Indic digits or a letter no pip version has must not pass as vllm==0.32.0."""
    with pytest.raises(UsageError):
        resolve_many(spec)


def test_per_expert_entries_are_asked_about_once_per_routed_experts_layer():
    """DeepSeek-sized: 44k BF16 experts' entries for vLLM alone cost one coverage question per MoE layer (whether a
    target reads per-expert entries), not one per expert (3.5 s before on this machine)."""
    from repair.planning.runtime_entries import whole_layer_names

    names = [f"model.layers.{l}.mlp.experts.{e}.{p}" for l in range(3, 61) for e in range(256) for p in ("gate_proj", "up_proj", "down_proj")]
    asked = []
    out = whole_layer_names(resolve_many(NEW), {"num_hidden_layers": 61}, {}, set(names), names, lambda e, n: asked.append(n) or True)
    assert out == names and len(asked) == 58, len(asked)
