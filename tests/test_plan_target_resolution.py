"""`fix --target T` plans what T builds: the class T's own registry resolves config.json's `architectures` to, not the
newest vLLM release's choice (the planner asked `arch.architecture(config)`, the newest release's row, in build.py,
target_check.py and config_edits.py).

The config lists [HYV4ForCausalLM, HYV3ForCausalLM]. vLLM 0.32 registers HYV4 and builds it (its registry, in
vllm-0.32.json); vLLM 0.28 does not, so it builds HYV3, the next listed name (vllm-0.28.json's registry). Their fused
layers differ (both generated from vLLM's own packed_modules_mapping): 0.28's HYV3 fuses q/k/v_proj into qkv_proj,
0.32's HYV4 fuses q_a_proj / kv_a_proj_with_mqa into fused_qkv_a_proj. The export stores one shard of each BF16 and
excluded, the others NVFP4: each release refuses its own fused layer and builds the other's shards as they are. So
`fix --target vllm==0.28.0` must dequantize k/v_proj (and nothing else), `--target vllm==0.32.0` kv_a_proj_with_mqa
(and nothing else), and each output must pass `doctor --target T --strict`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from repair import arch
from repair.codec import nvfp4
from tests.conftest import run_captured
from tests.test_fix_runtime_prefixes import export

LISTED = ["HYV4ForCausalLM", "HYV3ForCausalLM"]
LAYERS = range(2)
# target -> the stored modules its release builds into one fused layer with a BF16 shard (the ones fix must dequantize)
DEQUANTIZED = {"vllm==0.28.0": ("k_proj", "v_proj"), "vllm==0.32.0": ("kv_a_proj_with_mqa",)}


def packed(name: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One NVFP4 linear; one large value fixes its global scale, so fused siblings share weight_scale_2."""
    weight = (torch.randn(32, 32, generator=gen) * 0.05).to(torch.bfloat16)
    weight[0, 0] = 0.5
    codes, scale, scale_2 = nvfp4.quantize(weight, nvfp4.global_scale(weight))
    return {f"{name}.weight": codes, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": scale_2,
            f"{name}.input_scale": torch.tensor(0.01)}


def two_builds(root: Path) -> Path:
    gen = torch.Generator().manual_seed(1)
    extra, excluded = {}, ["lm_head"]
    for n in LAYERS:
        attn = f"model.layers.{n}.self_attn"
        for bf16 in ("q_proj", "q_a_proj"):
            extra[f"{attn}.{bf16}.weight"] = torch.zeros(32, 32, dtype=torch.bfloat16)
            excluded.append(f"{attn}.{bf16}")
        for quantized in ("k_proj", "v_proj", "kv_a_proj_with_mqa"):
            extra.update(packed(f"{attn}.{quantized}", gen))
    export(root, LISTED[0], "hy_v3", extra, excluded)
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "architectures": LISTED}))
    return root


def test_the_two_releases_build_different_classes_of_this_config():
    """The premise, from the shipped registries: 0.32 builds HYV4, 0.28 HYV3, and their fused layers differ."""
    builds = {p.label: arch.architecture({"architectures": LISTED}, p) for p in arch.PROFILES if p.runtime == "vllm"}
    assert builds["vllm 0.32.0"].architectures == ("HYV4ForCausalLM",)
    assert builds["vllm 0.28.0"].architectures == ("HYV3ForCausalLM",)
    assert "qkv_proj" in builds["vllm 0.28.0"].fused_layers and "qkv_proj" not in builds["vllm 0.32.0"].fused_layers
    assert "fused_qkv_a_proj" in builds["vllm 0.32.0"].fused_layers


@pytest.mark.parametrize("target", sorted(DEQUANTIZED))
def test_fix_for_each_release_plans_what_that_release_builds(target, tmp_path, capsys):
    src, out = two_builds(tmp_path / "src"), tmp_path / "out"
    assert run_captured(capsys, "doctor", src, "--target", target)[0] == 1
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", target)
    assert code == 0, text + err
    report = json.loads((out / "repair_report.json").read_text())
    changed = sorted(c["module"] for c in report["changes"])
    assert changed == sorted(f"model.layers.{n}.self_attn.{m}" for n in LAYERS for m in DEQUANTIZED[target]), changed
    code, text, err = run_captured(capsys, "doctor", out, "--target", target, "--strict")
    assert code == 0, text + err


def test_fix_for_both_releases_makes_each_fused_layer_whole(tmp_path, capsys):
    """--target vllm==0.28.0,vllm==0.32.0: every fused layer either release builds is made BF16 whole."""
    src, out = two_builds(tmp_path / "src"), tmp_path / "out"
    both = ",".join(sorted(DEQUANTIZED))
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", both)
    assert code == 0, text + err
    for target in DEQUANTIZED:
        code, text, err = run_captured(capsys, "doctor", out, "--target", target, "--strict")
        assert code == 0, target + text + err


def _assistant_plan(tmp_path: Path):
    from repair.demo.examples import TINY, write_assistant
    from repair.io.checkpoint import open_checkpoint
    from repair.planning.build import make_plan
    from repair.planning.recipe import Recipe

    ckpt = open_checkpoint(write_assistant(tmp_path / "assistant", TINY))
    return ckpt, make_plan(ckpt, Recipe())


def _replicating(diagnosis):
    """The diagnosis with its target's row building every layer replicated (a release whose class splits nothing)."""
    kinds = {role: dataclasses.replace(kind, style="replicated") for role, kind in diagnosis.family.layer_kinds.items()}
    return dataclasses.replace(diagnosis, family=dataclasses.replace(diagnosis.family, layer_kinds=kinds))


def test_fix_tp_splits_as_the_class_the_target_builds(tmp_path):
    """plan_tp takes each layer's split from the row of the class the plan's target builds (its verdict's), not from
    the newest release's row for the config: a target whose class builds the layers replicated gets no split."""
    from repair.doctor.diagnose import diagnose
    from repair.targets.profiles import resolve
    from repair.tp.plan import plan_tp

    ckpt, plan = _assistant_plan(tmp_path)
    own = diagnose(ckpt, resolve("vllm==0.32.0"))
    assert plan_tp(dataclasses.replace(plan, before=(own,)), 2).counts().get("row")  # the assistant's row splits
    replicated = plan_tp(dataclasses.replace(plan, before=(_replicating(own),)), 2).counts()
    assert set(replicated) == {"replicated"}, replicated


def test_fix_tp_refuses_targets_that_split_differently(tmp_path):
    from repair.doctor.diagnose import diagnose
    from repair.errors import UsageError
    from repair.targets.profiles import resolve
    from repair.tp.plan import plan_tp

    ckpt, plan = _assistant_plan(tmp_path)
    own = diagnose(ckpt, resolve("vllm==0.32.0"))
    with pytest.raises(UsageError, match="no one --tp layout serves them all"):
        plan_tp(dataclasses.replace(plan, before=(own, _replicating(own))), 2)


WK = "model.layers.0.self_attn.indexer.wk"


def bf16_indexer_wk(root: Path) -> Path:
    """An export listing LISTED with a BF16 `indexer.wk` the config does not exclude."""
    src = export(root, LISTED[0], "hy_v3", {f"{WK}.weight": torch.zeros(32, 32, dtype=torch.bfloat16)}, ["lm_head"])
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "architectures": LISTED}))
    return src


def test_inspect_declares_as_the_target_release_builds(tmp_path, capsys):
    """`inspect --target T` shows the config's declaration as the class T builds reads it: vLLM 0.32's HYV4 builds its
    indexer's wk (fused into wk_weights_proj) unquantized whatever the config says (its profile); 0.28 builds HYV3,
    which has no such layer, so a BF16 `indexer.wk` the config does not exclude is declared quantized to it."""
    src = bf16_indexer_wk(tmp_path / "src")
    declared = {}
    for target in ("vllm==0.28.0", "vllm==0.32.0"):
        code, text, err = run_captured(capsys, "inspect", src, "--json", "--target", target)
        assert code == 0, err
        found = json.loads(text)
        assert found["target"] == target and found["architecture"].startswith(
            "HYV3ForCausalLM" if target == "vllm==0.28.0" else "HYV4ForCausalLM"), found["architecture"]
        declared[target] = next(m["declared"] for m in found["modules"] if m["name"] == WK)
    assert declared == {"vllm==0.28.0": "quantized", "vllm==0.32.0": "-"}, declared
    code, text, err = run_captured(capsys, "inspect", src, "--target", "vllm==0.99")
    assert code == 0 and text.rstrip().endswith("HYV4ForCausalLM (vllm 0.32.0 profile)"), text
    for bad in ("nonsense", "vllm==0.28.0,vllm==0.32.0"):
        code, text, err = run_captured(capsys, "inspect", src, "--target", bad)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "inspect shows one release's reading" in err, err


def test_the_pages_module_table_declares_as_its_first_target_builds(tmp_path):
    """The web page's module table (repair/web/analyze.py) takes its `declared` column from inspect, for the first
    target asked: the page for vllm==0.28.0 shows what 0.28's HYV3 builds, not 0.32's HYV4."""
    from repair.web.analyze import analyze

    src = bf16_indexer_wk(tmp_path / "src")
    declared = {}
    for target in ("vllm==0.28.0", "vllm==0.32.0"):
        table = analyze({"source": str(src), "target": target})["modules"]
        column = table["headers"].index("declared")
        declared[target] = next(row[column] for row in table["data"] if row[0] == WK)
    assert declared == {"vllm==0.28.0": "quantized", "vllm==0.32.0": "-"}, declared


@pytest.mark.parametrize("spec", ["bf16", "bf16,bf16"])
def test_inspect_refuses_bf16_whose_build_reads_no_declaration(spec, tmp_path, capsys):
    """bf16 reads no quantization config (it loads the checkpoint dequantized), so a `declared` column "as bf16 builds
    it" that shows the config's quantized/excluded reading (through the newest vLLM's class) says what bf16 never does:
    one line, exit 2, naming the targets whose reading inspect can show."""
    src = bf16_indexer_wk(tmp_path / "src")
    code, text, err = run_captured(capsys, "inspect", src, "--target", spec)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (text, err)
    assert "bf16" in err and "vllm==" in err, err


def test_the_pages_module_table_skips_bf16_for_the_first_release_that_reads_the_config(tmp_path):
    """bf16 first on the page (`bf16,vllm==0.28.0`): bf16 reads no quantization config, so the `declared` column is
    the next target's reading (0.28's HYV3 declares the BF16 indexer.wk quantized), not the newest release's class."""
    from repair.web.analyze import analyze

    src = bf16_indexer_wk(tmp_path / "src")
    table = analyze({"source": str(src), "target": "bf16,vllm==0.28.0"})["modules"]
    column = table["headers"].index("declared")
    assert next(row[column] for row in table["data"] if row[0] == WK) == "quantized"


def test_inspect_declares_as_the_target_reads_the_exclusion_list(tmp_path, capsys):
    """The declared column is the config as T reads it, with T's own matching rules (Target.bind, what doctor uses),
    not vLLM's: real Qwen3-32B layout with only q_proj of qkv_proj excluded. vLLM reads the shard's entry; TensorRT-LLM
    1.0 asks the fused layer only by its own name (its data's fused policy), so it builds q_proj quantized (and doctor
    --target trtllm==1.0 finds nothing to do with the packed q_proj)."""
    from tests.trtllm_helpers import edit_json
    from tools.real_fixture import write_real_model

    src = write_real_model(tmp_path / "src", "qwen3-32b")
    q_proj = "model.layers.0.self_attn.q_proj"
    edit_json(src / "hf_quant_config.json", lambda d: d["quantization"]["exclude_modules"].append(q_proj))
    declared = {}
    for target in ("vllm==0.32.0", "trtllm==1.0"):
        code, text, err = run_captured(capsys, "inspect", src, "--json", "--target", target)
        assert code == 0, err
        declared[target] = next(m["declared"] for m in json.loads(text)["modules"] if m["name"] == q_proj)
    assert declared == {"vllm==0.32.0": "excluded", "trtllm==1.0": "quantized"}, declared
    assert run_captured(capsys, "doctor", src, "--target", "trtllm==1.0", "--strict")[0] == 0


def test_fix_tp_serves_targets_whose_classes_differ_in_name_but_split_alike(tmp_path):
    """Two targets building differently named classes (rows) with the same layer kinds split the output alike: one
    --tp layout serves both; only a different split is refused (the comparison was on the row's name too)."""
    from repair.doctor.diagnose import diagnose
    from repair.targets.profiles import resolve
    from repair.tp.plan import plan_tp

    ckpt, plan = _assistant_plan(tmp_path)
    own = diagnose(ckpt, resolve("vllm==0.32.0"))
    renamed = dataclasses.replace(own, family=dataclasses.replace(own.family, name=own.family.name + " (another release)"))
    alone = plan_tp(dataclasses.replace(plan, before=(own,)), 2).counts()
    assert plan_tp(dataclasses.replace(plan, before=(own, renamed)), 2).counts() == alone
