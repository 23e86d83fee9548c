"""Which of config.json's `architectures` SGLang 0.5.23 builds, asked of SGLang itself (tools/sglang_registry.py: its
ModelConfig and `get_model_architecture`), against doctor's reading of the shipped rules file's `registry`
(repair/arch/registry.py through Target.built): with any listed name registered, the first such one; with none, what
its Transformers backend's gate does (the rules file's `transformers_backend`, tools/sglang_backend.py): the backend's
class, or its refusal in its own words."""

from __future__ import annotations

import json
import subprocess

import pytest

from repair.targets.profiles import resolve
from tests.test_doctor_load_refused import DBRX

from .probe import REPO, SGLANG_PY, TARGET, clean_env, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
FORMS = {"unknown-then-dbrx": ["NotARealForCausalLM", "DbrxForCausalLM"], "dbrx-then-llama": ["DbrxForCausalLM", "LlamaForCausalLM"],
         "llama-then-dbrx": ["LlamaForCausalLM", "DbrxForCausalLM"], "two-unknown-then-dbrx": ["A", "B", "DbrxForCausalLM"],
         "dbrx-then-int": ["DbrxForCausalLM", 5]}
# none registered: SGLang's Transformers backend asks about each listed name (model_loader/utils.py resolve_transformers_arch)
FALLBACK = {"incompatible": {"architectures": ["Qwen4ExpForCausalLM"]}, "missing": {"architectures": ["NotARealForCausalLM"]},
            "taken": {"architectures": ["DiffLlamaForCausalLM"]},
            "taken-then-missing": {"architectures": ["DiffLlamaForCausalLM", "NotARealForCausalLM"]},
            "taken-then-incompatible": {"architectures": ["DiffLlamaForCausalLM", "Qwen4ExpForCausalLM"]},
            "automodel-absent": {"architectures": ["NotARealForCausalLM"], "auto_map": {"AutoModel": "absent.Absent"}},
            "automodel-for-causal-lm": {"architectures": ["NotARealForCausalLM"], "auto_map": {"AutoModelForCausalLM": "absent.A"}},
            "transformers-name": {"architectures": ["TransformersForCausalLM"]},
            "transformers-prefixed-unknown": {"architectures": ["TransformersNotRealForCausalLM"]},
            "taken-then-int": {"architectures": ["DiffLlamaForCausalLM", 5]},
            "incompatible-then-null": {"architectures": ["Qwen4ExpForCausalLM", None]},
            # the gate asks `getattr(transformers, name)`: a dunder or private attribute that is not None passes
            "dunder-name": {"architectures": ["__name__"]}, "dunder-class": {"architectures": ["__class__"]},
            "dunder-doc": {"architectures": ["__doc__"]}, "private": {"architectures": ["_import_structure"]},
            "dunder-then-incompatible": {"architectures": ["__name__", "Qwen4ExpForCausalLM"]},
            "dunder-then-missing": {"architectures": ["__file__", "NotARealForCausalLM"]}}


def in_sglang(*args) -> list[dict]:
    proc = subprocess.run([str(SGLANG_PY), str(REPO / "tools" / "sglang_registry.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=900, env=clean_env(), cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_the_shipped_registry_holds_every_name_sglang_registers_here():
    """The wheel's EntryClass lists (shipped) cover the installed registry (which lacks the files that fail to import
    on this host)."""
    [found] = in_sglang()
    assert set(found["registered"]) <= resolve(TARGET).registry.names


def test_sglang_builds_the_first_listed_name_it_registers(tmp_path):
    target = resolve(TARGET)
    for name, listed in FORMS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(dict(DBRX, architectures=listed)))
    answers = in_sglang(*(tmp_path / name for name in FORMS))
    for (name, listed), answer in zip(FORMS.items(), answers):
        assert answer.get("architecture") == target.built(dict(DBRX, architectures=listed)).name, (name, answer)


def test_the_backend_gate_doctor_reads_is_what_sglang_does(tmp_path):
    """Each form asked of SGLang's get_model_architecture: where doctor says the backend builds it, SGLang resolves a
    Transformers* class; where doctor says it is refused, SGLang raises those very words (an auto_map AutoModel whose
    code does not load: the error doctor's note quotes)."""
    target = resolve(TARGET)
    for name, fields in FALLBACK.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(dict(DBRX, **fields)))
    answers = in_sglang(*(tmp_path / name for name in FALLBACK))
    for (name, fields), answer in zip(FALLBACK.items(), answers):
        said = target.built(dict(DBRX, **fields))
        if said.error is None:
            assert answer.get("architecture", "").startswith("Transformers"), (name, said, answer)
        else:
            assert answer.get("error") == said.error, (name, said, answer)


def test_sglang_runs_auto_map_code_without_trust_remote_code(tmp_path):
    """auto_map's AutoModel module, for a name transformers lacks: SGLang's gate imports it (utils.py:123-129) though
    its ModelConfig was made without trust_remote_code, and builds the backend when that class passes; doctor's note
    says so (the module here only writes a marker file)."""
    marker = tmp_path / "ran"
    folder = tmp_path / "remote"
    folder.mkdir()
    config = dict(DBRX, architectures=["MyRemoteForCausalLM"], auto_map={"AutoModel": "remote_mod.Remote"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "remote_mod.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nclass Remote:\n    pass\n")
    [answer] = in_sglang(folder)
    assert marker.exists() and answer.get("architecture", "").startswith("Transformers"), answer
    assert resolve(TARGET).built(config).backend == "auto_map"


def test_sglang_asks_the_names_after_an_auto_map_one(tmp_path):
    """[MyRemote, Qwen4Exp] with auto_map code that loads: SGLang's gate goes on to Qwen4Exp and refuses in its words,
    as doctor says (an error, not the auto_map note); without that code it refuses too, in auto_map's words."""
    folder, absent = tmp_path / "remote", tmp_path / "absent"
    config = dict(DBRX, architectures=["MyRemoteForCausalLM", "Qwen4ExpForCausalLM"], auto_map={"AutoModel": "remote_mod.Remote"})
    for where in (folder, absent):
        where.mkdir()
        (where / "config.json").write_text(json.dumps(config))
    (folder / "remote_mod.py").write_text("class Remote:\n    pass\n")
    answer, without = in_sglang(folder, absent)
    assert answer.get("error") == resolve(TARGET).built(config).error, answer
    assert "loading the custom model from auto_map failed" in without.get("error", ""), without


def test_sglang_refuses_an_architectures_naming_no_class_first_in_doctors_words(tmp_path):
    """absent, null, [], a mapping, "", a string, a number, a first entry that is no string: SGLang's own ModelConfig
    and get_model_architecture raise the very words doctor's error quotes (rules `transformers_backend.unlisted`)."""
    forms = {"absent": ..., "null": None, "empty": [], "mapping": {"DbrxForCausalLM": 1}, "empty-string": "",
             "string": "Qwen4ExpForCausalLM", "int-first": [5, "DbrxForCausalLM"], "null-first": [None], "float": 5.5,
             "bool-first": [True]}
    configs = {}
    for name, listed in forms.items():
        (tmp_path / name).mkdir()
        configs[name] = {k: v for k, v in dict(DBRX, architectures=listed).items() if listed is not ... or k != "architectures"}
        (tmp_path / name / "config.json").write_text(json.dumps(configs[name]))
    answers = in_sglang(*(tmp_path / name for name in forms))
    for (name, config), answer in zip(configs.items(), answers):
        said = resolve(TARGET).built(config)
        assert said.error is not None and answer.get("error") == said.error, (name, said, answer)



def test_doctor_agrees_with_sglang_on_a_dunder_name(tmp_path, capsys):
    """`architectures: ["__name__"]`: SGLang's gate takes it (`transformers.__name__` is a string) and builds its
    Transformers backend, as asked of SGLang above; doctor said SGLang refuses it ("Cannot find model module")."""
    from tests.conftest import run_captured
    from tests.test_doctor_load_refused import write_dbrx

    folder = write_dbrx(tmp_path / "m", quantized=True, config=dict(DBRX, architectures=["__name__"]))
    [answer] = in_sglang(folder)
    code, out, err = run_captured(capsys, "doctor", folder, "--json", "--target", TARGET, "--tp", "2")
    found = json.loads(out)
    assert answer.get("architecture", "").startswith("Transformers"), answer
    assert not found["runtime_stops_at"] and not [f for f in found["findings"] if f["code"] == "unregistered-architecture"], found
    assert [n for n in found["notes"] if n["code"] == "unregistered-architecture"], found["notes"]  # the backend's note, as for any taken name
