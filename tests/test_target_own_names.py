"""Each target's layer rows carry only its own runtime's name facts (#28).

SGLang and TensorRT-LLM take their layer roles and fused layers from vLLM 0.32's profile (`layer_rows`), but the prefix
vLLM's layer hands its quant config (`prefixes`), what vLLM's load_weights refuses (`nvfp4_load_refused`) or drops
(`dropped`) are vLLM's code, not theirs. Afmoe: vLLM 0.32 builds lm_head with the prefix "" (no exclusion reaches it);
SGLang 0.5.23's afmoe.py builds it with `add_prefix("lm_head", prefix)`, so the exported `lm_head` exclusion holds and
SGLang loads the healthy export (its probe builds lm_head BF16).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from repair import arch, formats
from repair.doctor.diagnose import diagnose_each
from repair.doctor.findings import Finding, Kind, Severity
from repair.io.checkpoint import open_checkpoint
from repair.planning.recipe import Recipe
from repair.planning.target_check import unused_exclusions
from repair.targets.layer_names import target_family
from repair.targets.profiles import resolve, resolve_many
from tests.conftest import run_captured
from tests.test_fix_runtime_prefixes import export

OTHERS = ("sglang==0.5.23", "trtllm==1.4.0", "trtllm==1.2.0")
VLLM = arch.newest("vllm")


def _instance(pattern: str) -> str:
    return re.sub(r"(?<=\.)\*(?=\.|$)", "3", pattern)


@pytest.mark.parametrize("arch_name, model_type", [("AfmoeForCausalLM", "afmoe"), ("ExaoneMoeForCausalLM", "exaone_moe")])
def test_sglang_and_trtllm_read_the_lm_head_exclusion_vllm_cannot(arch_name, model_type, tmp_path, capsys):
    """(The model_type as transformers names it: SGLang's config reader refuses one it does not know, `exaonemoe`.)"""
    src = export(tmp_path / "src", arch_name, model_type, {}, ["lm_head"])
    assert run_captured(capsys, "doctor", "--target", "vllm==0.32.0", src)[0] == 1  # vLLM's prefix '': no entry reaches it
    for target in ("sglang==0.5.23", "trtllm==1.4.0"):
        code, out, err = run_captured(capsys, "doctor", "--target", target, "--strict", "--json", src)
        assert code == 0, (target, out, err)
        assert json.loads(out)["runtime_stops_at"] in (None, [], {}), out


@pytest.mark.parametrize("spec", OTHERS)
def test_other_runtimes_rows_hold_none_of_vllms_name_facts(spec):
    target = resolve(spec)
    rules = target.profile.rules
    for name, entry in VLLM.entries.items():
        config = {"architectures": [name]}
        family = target_family(target, config)
        own = rules.layer_names.get(name, {})
        for pattern, asked in entry.get("prefixes", {}).items():
            if pattern in own:
                continue
            if asked.endswith(".experts"):  # the FusedMoE every runtime asks by its `experts` module (SGLang's too)
                assert family.runtime_name(_instance(pattern)) == _instance(asked), (spec, name, pattern)
                continue
            module = _instance(pattern)
            assert family.runtime_name(module) == module, (spec, name, module)
            assert family.exclusion_name(module) == module, (spec, name, module)
        assert family.nvfp4_load_refused == () and family.dropped_tensors == (), (spec, name)
    assert target_family(resolve("vllm==0.32.0"), {"architectures": ["AfmoeForCausalLM"]}).runtime_name("lm_head") == ""


def test_fix_for_two_vllm_releases_keeps_the_entry_one_of_them_reads(tmp_path, capsys):
    """HYV3: vLLM 0.28 asks the shared expert's down_proj as `mlp.down_proj`, 0.32 as stored. The exported entry under
    the stored name is one 0.32 reads: fix must not take it out because 0.28 does not read it."""
    gen = torch.Generator().manual_seed(1)
    layers = [f"model.layers.{n}.mlp.shared_mlp.down_proj" for n in range(2)]
    extra = {f"{m}.weight": torch.randn(32, 32, generator=gen).to(torch.bfloat16) for m in layers}
    src, out = export(tmp_path / "src", "HYV3ForCausalLM", "hy_v3", extra, ["lm_head", *layers]), tmp_path / "out"
    targets = "vllm==0.28.0,vllm==0.32.0"
    code, text, err = run_captured(capsys, "fix", "--target", targets, src, "-o", out)
    assert code == 0, text + err
    listed = json.loads((out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert set(layers) <= set(listed), listed
    for target in targets.split(","):
        code, text, err = run_captured(capsys, "doctor", "--target", target, "--strict", out)
        assert code == 0, (target, text, err)


def test_an_entry_one_target_reads_as_a_stored_modules_exact_entry_stays(tmp_path):
    """unused_exclusions over several targets: an entry one target finds unused goes only where no other target reads
    it as the exact entry of a stored module under its own names (the exclusion writer adds no entry already listed,
    counting on it); a pattern entry a target reads goes (the plan writes exact entries for what it excludes)."""
    layers = [f"model.layers.{n}.mlp.shared_mlp.down_proj" for n in range(2)]
    extra = {f"{m}.weight": torch.zeros(32, 32, dtype=torch.bfloat16) for m in layers}
    src = export(tmp_path / "src", "HYV3ForCausalLM", "hy_v3", extra, ["lm_head", "shared_mlp", *layers])
    ckpt = open_checkpoint(src)
    targets = resolve_many("vllm==0.28.0,vllm==0.32.0")
    before = diagnose_each(ckpt, targets)
    claimed = [Finding(Severity.WARNING, Kind.UNUSED_EXCLUSION, e, "") for e in (layers[0], "shared_mlp")]
    before = (replace(before[0], findings=before[0].findings + tuple(claimed)), before[1])  # 0.28: neither is read
    fmt = formats.detect(ckpt)
    modules = {m.name: m for m in fmt.group_modules(ckpt.infos())}
    recipe = Recipe(from_target="vllm==0.28.0,vllm==0.32.0")
    assert unused_exclusions(ckpt, recipe, before, modules, fmt) == {"shared_mlp"}
    alone = (before[0],)  # one target: what it finds unused goes
    assert unused_exclusions(ckpt, recipe, alone, modules, fmt) == {layers[0], "shared_mlp"}
