"""SGLang 0.5.23's Transformers-backend fallback, as its rules file records it (tools/sglang_backend.py: its own gate,
model_loader/utils.py `resolve_transformers_arch`, asked on every top-level transformers name; the SGLang tier,
tests/sglang/test_registry_vs_sglang.py, checks these verdicts against SGLang's get_model_architecture).

With no listed name in its registry, SGLang asks its Transformers backend about EVERY listed name, in order (vLLM asks
about the first only): a name transformers lacks is refused ("Cannot find model module"), one whose transformers class
is not backend-compatible is refused ("has no SGlang implementation"), before any layer is built, on every rank.
Only when every name passes does it build the backend's class, whose layers no profile row describes: a note."""

from __future__ import annotations

import pytest

from repair.targets.profiles import resolve
from tests.conftest import run_captured
from tests.test_doctor_load_refused import DBRX, write_dbrx
from tests.test_listed_architectures import dbrx, doctor_json, unregistered

TARGET = "sglang==0.5.23"
BACKEND = resolve(TARGET).registry.backend
INCOMPATIBLE = "Qwen4ExpForCausalLM"  # transformers 5.19's class, _supports_attention_backend False; SGLang has none
TAKEN = "DiffLlamaForCausalLM"  # transformers' class the backend takes; SGLang registers none of that name
REFUSAL = f"ValueError: {INCOMPATIBLE} has no SGlang implementation and the Transformers implementation is not compatible with SGLang."


def missing(name: str) -> str:
    return ("ValueError: Cannot find model module. " f"'{name}' is not a registered model in the Transformers library (only "
            "relevant if the model is meant to be in Transformers) and 'AutoModel' is not present in the model config's "
            "'auto_map' (relevant if the model is custom).")


def test_the_recorded_gate_is_sglangs_own():
    """The facts the tests below read are SGLang's (its words, the names it takes), not a hand table."""
    assert BACKEND.asks_each and TAKEN in BACKEND.takes and TAKEN not in resolve(TARGET).registry.names
    assert BACKEND.refuses[INCOMPATIBLE].replace("{architecture}", INCOMPATIBLE) == REFUSAL
    assert INCOMPATIBLE not in resolve(TARGET).registry.names
    assert BACKEND.missing.replace("{architecture}", "X") == missing("X")


@pytest.mark.parametrize("listed,error", [([INCOMPATIBLE], REFUSAL), (["NotARealForCausalLM"], missing("NotARealForCausalLM")),
                                          ([TAKEN, "NotARealForCausalLM"], missing("NotARealForCausalLM")),
                                          ([INCOMPATIBLE, "NotARealForCausalLM"], REFUSAL)])
def test_a_refused_name_stops_sglang_on_every_rank_in_its_own_words(tmp_path, capsys, listed, error):
    code, found = doctor_json(capsys, dbrx(tmp_path, listed), "--target", TARGET, "--tp", "2")
    [f] = unregistered(found)
    assert code == 1 and f["severity"] == "error" and f["runtime_error"] == error, f
    assert [(s["rank"], s["error"]) for s in found["runtime_stops_at"]] == [(0, error), (1, error)]
    assert "SGLang" in f["message"] or "sglang" in f["message"], f


def test_fix_refuses_a_model_sglang_refuses_in_one_line(tmp_path, capsys):
    folder = dbrx(tmp_path, [INCOMPATIBLE])
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", TARGET)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "[unregistered-architecture]" in err, err
    assert not (tmp_path / "out").exists()


def test_names_the_backend_takes_are_a_note_not_an_error(tmp_path, capsys):
    code, found = doctor_json(capsys, dbrx(tmp_path, [TAKEN], quantized=False), "--target", TARGET)
    assert not unregistered(found) and not found["runtime_stops_at"]
    [note] = [n for n in found["notes"] if n["code"] == "unregistered-architecture"]
    assert "Transformers backend" in note["message"] and TAKEN in note["message"], note


def test_a_name_the_gate_skips_unasked_is_taken():
    """SGLang's gate passes a name starting "Transformers" without asking transformers (utils.py:113), so an unknown
    `TransformersX` does not stop it: the backend builds the model."""
    said = resolve(TARGET).built({"architectures": ["TransformersNotRealForCausalLM", TAKEN]})
    assert said.error is None and said.backend == "transformers", said


def test_a_registered_name_anywhere_in_the_list_is_built_without_asking_the_backend():
    assert resolve(TARGET).built({"architectures": [INCOMPATIBLE, "DbrxForCausalLM"]}).name == "DbrxForCausalLM"


def test_an_auto_map_automodel_is_a_note_and_another_key_changes_nothing(tmp_path, capsys):
    """SGLang loads auto_map's `AutoModel` code for a name transformers lacks (it then asks that class); any other
    key (AutoModelForCausalLM) leaves the name missing: refused."""
    remote = {"architectures": ["MyRemoteForCausalLM"], "auto_map": {"AutoConfig": "x.C", "AutoModel": "x.M"}}
    said = resolve(TARGET).built(remote)
    assert said.error is not None and said.backend, said
    other = resolve(TARGET).built(dict(remote, auto_map={"AutoModelForCausalLM": "x.M"}))
    assert other.error == missing("MyRemoteForCausalLM") and not other.backend, other
    folder = write_dbrx(tmp_path / "remote", quantized=True, config=dict(DBRX, **remote))
    code, found = doctor_json(capsys, folder, "--target", TARGET)
    assert not unregistered(found) and not found["runtime_stops_at"]
    [note] = [n for n in found["notes"] if n["code"] == "unregistered-architecture"]
    assert "auto_map" in note["message"] and said.error in note["message"], note
    assert "even without --trust-remote-code" in note["message"], note  # tests/sglang/test_registry_vs_sglang.py


def test_a_release_past_the_rules_gets_a_note_not_a_refusal(tmp_path, capsys):
    """sglang==0.5.24 takes 0.5.23's rules; its registry (and transformers beside it) may have the class."""
    code, found = doctor_json(capsys, dbrx(tmp_path, [INCOMPATIBLE]), "--target", "sglang==0.5.24")
    assert not unregistered(found) and not found["runtime_stops_at"]
    assert [n for n in found["notes"] if n["code"] == "unregistered-architecture"]


def test_older_sglang_rules_record_the_registry_but_not_the_fallback(tmp_path, capsys):
    """0.5.9-0.5.11's rules files record their wheel's registry (the same resolve_model_cls: the first registered
    listed name is built) but not their backend's gate, which needs each release installed with the transformers it
    pins (4.57.1, 5.3.0, 5.6.0): with none registered the first listed name is read, and no refusal is claimed."""
    for spec in ("sglang==0.5.9", "sglang==0.5.10", "sglang==0.5.11"):
        older = resolve(spec)
        assert older.registry.backend is None and "DbrxForCausalLM" in older.registry.names
        assert older.built({"architectures": ["NotARealForCausalLM", "DbrxForCausalLM"]}).name == "DbrxForCausalLM"
        assert not unregistered(doctor_json(capsys, dbrx(tmp_path / spec, [INCOMPATIBLE]), "--target", spec)[1])


def test_a_hostile_name_is_cut_and_forges_no_line(tmp_path, capsys):
    """SGLang repeats the listed name whole in its refusal; doctor cuts it and escapes a newline, so a 1 MB name or
    one holding a line of its own stays one bounded line."""
    code, found = doctor_json(capsys, dbrx(tmp_path / "huge", ["X" * 1_000_000]), "--target", TARGET)
    [f] = unregistered(found)
    assert code == 1 and len(f["message"]) + len(f["runtime_error"]) < 5000, f
    code, out, err = run_captured(capsys, "doctor", dbrx(tmp_path / "forged", ["Foo\nerror: forged"]), "--target", TARGET)
    assert code == 1 and not [line for line in out.splitlines() if line.startswith("error: forged")], out


def test_a_long_list_is_judged_at_its_first_refused_name(tmp_path):
    """200,000 listed names, the first one missing: the verdict names it, whatever follows."""
    listed = ["NotARealForCausalLM"] + [TAKEN] * 200_000
    assert resolve(TARGET).built({"architectures": listed}).error == missing("NotARealForCausalLM")
    assert resolve(TARGET).built({"architectures": listed[1:] + [INCOMPATIBLE]}).error == REFUSAL


def test_an_auto_map_name_does_not_hide_a_later_refused_name(tmp_path, capsys):
    """SGLang's gate goes on past a name auto_map's AutoModel answers for (utils.py:113-182 asks every listed name):
    [MyRemote, Qwen4Exp] is refused whether that code loads (Qwen4Exp's refusal) or not (auto_map's), so it is an error
    stopping every rank, not a note (tests/sglang/test_registry_vs_sglang.py: SGLang's words when the code loads)."""
    remote = dict(DBRX, architectures=["MyRemoteForCausalLM", INCOMPATIBLE], auto_map={"AutoModel": "x.M"})
    assert resolve(TARGET).built(remote).error == REFUSAL
    code, found = doctor_json(capsys, write_dbrx(tmp_path / "remote", quantized=True, config=remote), "--target", TARGET,
                              "--tp", "2")
    [f] = unregistered(found)
    assert code == 1 and f["severity"] == "error" and [s["rank"] for s in found["runtime_stops_at"]] == [0, 1], f


UNLISTED = {"absent": ..., "null": None, "empty": [], "mapping": {"Qwen4ExpForCausalLM": 1}, "empty-string": "",
            "string": INCOMPATIBLE, "int-first": [5, INCOMPATIBLE], "null-first": [None], "number": 5, "bool": True}


@pytest.mark.parametrize("form", UNLISTED)
def test_an_architectures_naming_no_class_first_is_refused_on_every_rank(tmp_path, capsys, form):
    """SGLang reads `architectures[0]` as a string while loading the config (hf_transformers/common.py
    get_hf_text_config): absent, null, [], a mapping, "", a number or a first entry that is no string ends in its
    TypeError/IndexError/KeyError/AttributeError, and a string's characters are asked one by one ('Q' is refused).
    doctor said nothing and exited 0; it is one error on every rank in SGLang's recorded words (the SGLang tier asks
    SGLang each form)."""
    config = {k: v for k, v in dict(DBRX, architectures=UNLISTED[form]).items() if UNLISTED[form] is not ... or k != "architectures"}
    said = resolve(TARGET).built(config)
    assert said.error and said.malformed and BACKEND.unlisted, said
    code, found = doctor_json(capsys, write_dbrx(tmp_path / "c", quantized=True, config=config), "--target", TARGET, "--tp", "2")
    [f] = unregistered(found)
    assert code == 1 and f["severity"] == "error" and f["runtime_error"] == said.error, f
    assert [(s["rank"], s["error"]) for s in found["runtime_stops_at"]] == [(0, said.error), (1, said.error)]


def test_a_first_listed_class_name_is_not_read_as_naming_none():
    assert BACKEND.refused_unlisted(dict(DBRX, architectures=[TAKEN, 5])) is None
    assert BACKEND.refused_unlisted(None) is None and BACKEND.refused_unlisted([]) is None


def test_a_later_entry_that_is_no_string_stops_the_gate(tmp_path, capsys):
    """[DiffLlama, 5]: with none registered the gate lowers every entry before asking any (utils.py:35-36
    _is_moe_model) and raises on 5, even after a refused name; doctor read only the strings and called it a note."""
    said = resolve(TARGET).built(dict(DBRX, architectures=[TAKEN, 5]))
    entry = BACKEND.unlisted["entry_not_a_string"]
    assert said.error == entry.replace("{type}", "int") and not said.backend, said
    assert resolve(TARGET).built(dict(DBRX, architectures=[INCOMPATIBLE, None])).error == entry.replace("{type}", "NoneType")
    assert resolve(TARGET).built(dict(DBRX, architectures=["DbrxForCausalLM", 5])).name == "DbrxForCausalLM"
    code, found = doctor_json(capsys, dbrx(tmp_path, [TAKEN, {"x": 1}]), "--target", TARGET)
    [f] = unregistered(found)
    assert code == 1 and f["runtime_error"] == entry.replace("{type}", "dict"), f
