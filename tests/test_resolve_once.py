"""Which listed architecture a target builds is decided once per (target, config.json) and obeyed everywhere
(repair/arch/registry.py `Builds`, Target.built): doctor reads a config's `architectures` once per shipped release
(its registry), however many checks ask; the hand rows (Qwen3.5's multimodal classes) describe the class the release
builds, not any listed name; the name doctor reports is the class whose row it reads."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from repair import arch
from repair.arch.gemma4_assistant import GEMMA4_ASSISTANT
from repair.arch.moe_routers import QWEN3_5
from repair.arch.registry import Registry
from repair.doctor.diagnose import diagnose_each
from repair.io.checkpoint import open_checkpoint
from repair.targets.layer_names import target_family
from repair.targets.profiles import resolve, resolve_many
from tests.test_doctor_load_refused import DBRX, DBRX_ERROR, write_dbrx
from tests.test_listed_architectures import dbrx, doctor_json, unregistered

QWEN_MM = "Qwen3_5MoeForConditionalGeneration"  # a hand row's class, registered by every shipped vLLM release


@pytest.fixture
def reads(monkeypatch) -> Counter:
    """How many times each release's registry walks a listed-names list (Registry.task: once per resolution)."""
    seen: Counter = Counter()
    task = Registry.task

    def counted(self, names):
        seen[self.source] += 1
        return task(self, names)

    monkeypatch.setattr(Registry, "task", counted)
    return seen


@pytest.mark.parametrize("last", [None, "DbrxForCausalLM"])
def test_doctor_reads_a_huge_list_once_per_release_whatever_it_asks(tmp_path, reads, last):
    """200,000 listed names, three targets (vLLM 0.32, an older vLLM, SGLang), an exclusion entry naming no module
    (which asks every other shipped release how it names layers): each registry resolves the list once per run."""
    listed = [f"Unknown{i}ForCausalLM" for i in range(200_000)] + ([last] if last else [])
    folder = dbrx(tmp_path, listed)
    quant = json.loads((folder / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"].append("no_such_layer")
    (folder / "hf_quant_config.json").write_text(json.dumps(quant))
    found = diagnose_each(open_checkpoint(folder), resolve_many("vllm==0.32.0,vllm==0.25.0,sglang==0.5.23"))
    assert reads and max(reads.values()) == 1, reads
    verdict = found[0]
    if last is None:  # vLLM 0.32 refuses it, in its own words; the older release is not judged by 0.28's registry
        assert [f.code.value for f in verdict.findings if f.severity.value == "error"][:1] == ["unregistered-architecture"]
        assert not [f for f in found[1].findings if f.code.value == "unregistered-architecture"]
    else:  # it builds DBRX, whose own load_weights fails
        assert verdict.architecture == "DbrxForCausalLM" and DBRX_ERROR in [f.runtime_error for f in verdict.findings]


def test_a_hand_row_is_read_only_for_the_class_the_release_builds():
    """vLLM builds the first listed name it registers: [Dbrx, Qwen3.5-MoE multimodal] is DBRX, not the Qwen3.5 row."""
    assert arch.architecture({"architectures": ["DbrxForCausalLM", QWEN_MM]}) == arch.architecture({"architectures": ["DbrxForCausalLM"]})
    assert arch.architecture({"architectures": ["NotARealForCausalLM", QWEN_MM]}) is QWEN3_5
    for spec in ("vllm==0.32.0", "sglang==0.5.23"):
        target = resolve(spec)
        assert target_family(target, {"architectures": ["DbrxForCausalLM", QWEN_MM]}).name != QWEN3_5.name, spec
        assert target_family(target, {"architectures": [QWEN_MM, "DbrxForCausalLM"]}).name == QWEN3_5.name, spec


def test_doctor_reads_dbrx_listed_before_a_hand_rows_class(tmp_path, capsys):
    """The user-facing miss: DBRX's load_weights failure was lost behind the Qwen3.5 hand row."""
    code, found = doctor_json(capsys, dbrx(tmp_path, ["DbrxForCausalLM", QWEN_MM]), "--target", "vllm==0.32.0")
    assert code == 1 and [f["runtime_error"] for f in found["findings"] if f["code"] == "load-refused"] == [DBRX_ERROR]


def test_the_gemma4_assistant_is_its_row_whatever_it_lists():
    """vLLM 0.32 builds a gemma4_assistant as the draft class Gemma4MTPModel whatever `architectures` lists
    (config/speculative.py:1019-1028): the hand row claims its model_type."""
    config = {"model_type": "gemma4_assistant", "architectures": ["DbrxForCausalLM"]}
    assert arch.architecture(config) is GEMMA4_ASSISTANT
    assert target_family(resolve("vllm==0.32.0"), config).name == GEMMA4_ASSISTANT.name


def test_the_name_doctor_reports_is_the_class_whose_row_it_reads(tmp_path):
    """vLLM 0.25 is older than every profile: its rows are 0.28's, and the class named is the one they are read for."""
    folder = write_dbrx(tmp_path / "ckpt", quantized=True, config=dict(DBRX, architectures=["NotARealForCausalLM", "DbrxForCausalLM"]))
    target = resolve("vllm==0.25.0")
    [verdict] = diagnose_each(open_checkpoint(folder), (target,))
    assert verdict.architecture == "DbrxForCausalLM"
    assert target_family(target, open_checkpoint(folder).config).name == arch.architecture({"architectures": ["DbrxForCausalLM"]}, target.release).name
    assert not unregistered({"findings": [{"code": f.code.value} for f in verdict.findings]})


def test_a_list_of_names_that_each_could_normalize_stays_cheap(reads):
    """Each of 200,000 names could be a registered class's task form yet none is of the runner the first sets:
    normalized once per distinct name, as vLLM would answer each the same (a bound on work, not a timing)."""
    from repair.arch.registry import Registry as R

    calls = []
    normalized = R.normalized
    listed = ["NotARealForSequenceClassification"] + ["DbrxForTextEncoding", "LlamaForTextEncoding"] * 100_000
    target = resolve("vllm==0.32.0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(R, "normalized", lambda self, *a: calls.append(a) or normalized(self, *a))
        found = target.built({"architectures": listed})
    assert found.error is not None and len(calls) <= 3, (found, len(calls))
