"""Layers vLLM 0.32 asks its quant config about under another prefix than the checkpoint's, shards of fused layers
included (the profile's `prefixes`, tools/vllm_load_facts.py quant_prefixes). EXAONE 3.5 (ExaoneForCausalLM):
exaone.py builds ExaoneModel as `self.transformer` under the prefix "model" (exaone.py:401-403), so its layers ask about
`model.h.N...` while the checkpoint (and the published EXAONE 3.5 names) hold `transformer.h.N...`; a fused layer asks
for its shards under that prefix too (quant_utils.py is_layer_skipped: `model.h.0.attn.attention.q_proj`). Falcon-H1
(FalconH1ForCausalLM) builds its attention's qkv_proj under the decoder layer (`model.layers.N.qkv_proj`, as its
o_proj), so its shards are asked as `model.layers.N.q_proj`. An exclusion written with the checkpoint's name reaches
nothing: a layer stored BF16 and excluded so is built NVFP4 and its weight does not load. Judged with vLLM's own loader
on each row's tiny export (tools/vllm_arch_check.py), doctor against it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

EXAONE_QKV = tuple(f"transformer.h.0.attn.attention.{p}" for p in ("q_proj", "k_proj", "v_proj"))
FALCON_QKV = tuple(f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj"))
# case -> (architecture, modules stored BF16, the names vLLM 0.32 asks for them)
CASES = {
    "exaone-qkv-shards": ("ExaoneForCausalLM", EXAONE_QKV, tuple(m.replace("transformer.", "model.", 1) for m in EXAONE_QKV)),
    "exaone-c_proj": ("ExaoneForCausalLM", ("transformer.h.0.mlp.c_proj",), ("model.h.0.mlp.c_proj",)),
    "falcon-h1-qkv-shards": ("FalconH1ForCausalLM", FALCON_QKV, tuple(m.replace("self_attn.", "") for m in FALCON_QKV)),
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    lines = in_vllm("vllm_arch_check.py", tmp_path_factory.mktemp("prefixes"), "ExaoneForCausalLM", "FalconH1ForCausalLM",
                    "LlamaForCausalLM", "HrmTextForCausalLM", "Phi3ForCausalLM")
    for line in lines:
        assert line["ok"] and line["healthy_load"]["ok"], line
    return {line["arch"]: Path(line["healthy"]) for line in lines}


def bf16_excluded(src: Path, dst: Path, modules: tuple[str, ...], entries: list[str]) -> Path:
    """`src` with `modules` stored BF16 (their NVFP4 leaves dropped) and `entries` added to exclude_modules."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    for module in modules:
        rows, half = tensors[f"{module}.weight"].shape
        for leaf in [n for n in tensors if n.startswith(module + ".")]:
            tensors.pop(leaf)
        tensors[f"{module}.weight"] = torch.zeros(rows, 2 * half, dtype=torch.bfloat16)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    quant = json.loads((dst / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"] += entries
    (dst / "hf_quant_config.json").write_text(json.dumps(quant))
    return dst


def doctor(capsys, folder: Path) -> tuple[int, str]:
    from tests.conftest import run_captured

    code, out, _ = run_captured(capsys, "doctor", folder, "--target", "vllm==0.32.0")
    return code, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpoint_name_exclusion_reaches_nothing_and_doctor_says_so(capsys, exports, tmp_path, case):
    """Stored BF16 and excluded under the checkpoint's names: vLLM 0.32 builds the layer NVFP4 and the load fails;
    excluded under the names it asks, it loads. doctor errors on the first, names that entry, and passes the second."""
    name, modules, asked_as = CASES[case]
    published = bf16_excluded(exports[name], tmp_path / "published", modules, list(modules))
    asked = bf16_excluded(exports[name], tmp_path / "asked", modules, list(asked_as))
    refused, loaded = in_vllm("vllm_load.py", published, asked)
    assert not refused["ok"], refused
    assert loaded["ok"], loaded
    code, out = doctor(capsys, published)
    assert code == 1, out
    for module in modules:
        assert f"error: [config-contradiction] {module}: stored bf16, but vllm==0.32.0 builds it nvfp4" in out, out
    assert f"'{asked_as[0]}'" in out, out
    code, out = doctor(capsys, asked)
    assert code == 0 and "0 error(s)" in out.splitlines()[0], out


@pytest.mark.parametrize("case", sorted(CASES))
def test_fix_of_the_checkpoint_name_exclusion_loads_in_vllm(capsys, exports, tmp_path, case):
    """The careless user's next step: `fix` on the export excluded under the checkpoint's names writes a copy vLLM 0.32
    loads (every weight tracked), and doctor finds nothing left in it."""
    from tests.conftest import run_captured

    name, modules, _ = CASES[case]
    published = bf16_excluded(exports[name], tmp_path / "published", modules, list(modules))
    code, out, err = run_captured(capsys, "fix", published, "-o", tmp_path / "fixed", "--target", "vllm==0.32.0")
    assert code == 0, out + err
    (loaded,) = in_vllm("vllm_load.py", tmp_path / "fixed")
    assert loaded["ok"], loaded
    code, out = doctor(capsys, tmp_path / "fixed")
    assert code == 0 and "0 error(s)" in out.splitlines()[0], out


LLAMA_QKV = tuple(f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj"))
# case -> (architecture, modules stored BF16, the entries written, whether vLLM 0.32 loads it: measured)
FUSED_PREFIX_CASES = {
    # is_layer_skipped (quant_utils.py:662) honours the fused layer's own name first: excluded, it loads
    "llama-fused-name": ("LlamaForCausalLM", LLAMA_QKV, ["model.layers.0.self_attn.qkv_proj"], True),
    "exaone-fused-name": ("ExaoneForCausalLM", EXAONE_QKV, ["model.h.0.attn.attention.qkv_proj"], True),
    "falcon-h1-fused-name": ("FalconH1ForCausalLM", FALCON_QKV, ["model.layers.0.qkv_proj"], True),
    # modelopt.py:206-215 tests an entry as a substring of the fused layer's prefix (`...qkv_proj`), not of a shard's:
    # `layers.0.self_attn.q_proj` reaches no layer vLLM asks about, the layer is built NVFP4, the BF16 load fails
    "llama-shard-substring": ("LlamaForCausalLM", LLAMA_QKV, [m.removeprefix("model.") for m in LLAMA_QKV], False),
    "exaone-shard-substring": ("ExaoneForCausalLM", EXAONE_QKV, [m.removeprefix("transformer.") for m in EXAONE_QKV], False),
    # fnmatch (modelopt.py:218-220) against the fused prefix only: a glob of the fused name loads, globs of the shards not
    "llama-fused-fnmatch": ("LlamaForCausalLM", LLAMA_QKV, ["*.layers.0.self_attn.qkv?proj"], True),
    "llama-shard-fnmatch": ("LlamaForCausalLM", LLAMA_QKV, [f"*.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")], False),
    "falcon-h1-fused-substring": ("FalconH1ForCausalLM", FALCON_QKV, ["layers.0.qkv"], True),
}


def test_a_trailing_star_entry_is_rewritten_where_the_class_has_a_mapper(capsys, exports, tmp_path):
    """`*.layers.0.self_attn.qkv_*` on Llama (LlamaModel.hf_to_vllm_mapper): vLLM replaces an entry `X*` (X not ending
    in `.`) by `X` and `X.*` where the class has a mapper (modelopt.py:262-281 apply_vllm_mapper, model_loader/utils.py:
    379, interfaces.py:1258), so it no longer matches `...qkv_proj`: vLLM 0.32 builds qkv_proj NVFP4 and the BF16
    shards do not load; doctor says so (the profile's `exclusion_mappers`, targets/entry_mappers.py)."""
    folder = bf16_excluded(exports["LlamaForCausalLM"], tmp_path / "x", LLAMA_QKV, ["*.layers.0.self_attn.qkv_*"])
    (loaded,) = in_vllm("vllm_load.py", folder)
    assert not loaded["ok"], loaded
    code, out = doctor(capsys, folder)
    assert code == 1, out


@pytest.mark.parametrize("case", sorted(FUSED_PREFIX_CASES))
def test_fused_layer_entries_are_judged_on_the_fused_prefix_as_vllm_does(capsys, exports, tmp_path, case):
    """BF16 q/k/v with entries naming the fused layer, or a shard's name minus its first part, or globs of either:
    doctor agrees with vLLM 0.32's loader (0 errors where it loads, an error where it does not; the profile's
    `fused_exclusions`, tools/vllm_fused_exclusions.py)."""
    judged(capsys, exports, tmp_path, *FUSED_PREFIX_CASES[case])


def judged(capsys, exports, tmp_path, name: str, modules: tuple[str, ...], entries: list[str], loads: bool) -> Path:
    """The export of `name` with `modules` BF16 and `entries` listed: vLLM 0.32 loads it exactly where measured, and
    doctor errs exactly where it does not."""
    folder = bf16_excluded(exports[name], tmp_path / "x", modules, entries)
    (loaded,) = in_vllm("vllm_load.py", folder)
    assert loaded["ok"] is loads, loaded
    code, out = doctor(capsys, folder)
    assert (code == 0) is loads, out
    return folder


# compressed-tensors' `ignore` on the same BF16 q/k/v: case -> (entries, whether vLLM 0.32 loads it: measured).
# should_ignore_layer (compressed_tensors/utils.py:53-70) tests the fused name, equal or `re:`, before its shards
CT_CASES = {
    "fused-exact": (["model.layers.0.self_attn.qkv_proj"], True),
    "fused-regex": ([r"re:.*layers\.0\.self_attn\.qkv_proj$"], True),
    "shards-regex": ([r"re:.*layers\.0\.self_attn\.[qkv]_proj$"], True),
    "fused-and-one-shard-regex": ([r"re:.*layers\.0\.self_attn\.q"], True),  # q_proj and qkv_proj: the fused name first
    "one-shard-exact": (["model.layers.0.self_attn.q_proj"], False),  # the shards disagree: vLLM refuses the model
    "shard-fnmatch": (["*.layers.0.self_attn.*_proj"], False),  # no fnmatch in compressed-tensors' ignore
}


@pytest.mark.parametrize("case", sorted(CT_CASES))
def test_compressed_tensors_ignore_of_a_fused_layer_as_vllm_reads_it(capsys, exports, tmp_path, case):
    """The Llama export with BF16 q/k/v converted by compressed-tensors' own converter, the entries its `ignore`:
    doctor agrees with vLLM 0.32's loader."""
    from tools.ct_export import convert_modelopt

    entries, loads = CT_CASES[case]
    src = bf16_excluded(exports["LlamaForCausalLM"], tmp_path / "modelopt", LLAMA_QKV, entries)
    config = json.loads((src / "config.json").read_text())
    listed = json.loads((src / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                     "kv_cache_quant_algo": None, "ignore": listed}
    (src / "config.json").write_text(json.dumps(config))
    folder = convert_modelopt(src, tmp_path / "ct")
    (folder / "hf_quant_config.json").unlink(missing_ok=True)
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["ignore"] == listed
    (loaded,) = in_vllm("vllm_load.py", folder)
    assert loaded["ok"] is loads, loaded
    code, out = doctor(capsys, folder)
    assert (code == 0) is loads, out


PHI3_QKV = ("model.layers.0.self_attn.qkv_proj",)
HRM_O = ("model.H_module.layers.0.attn.o_proj",)
# case -> (architecture, modules stored BF16, the entries written, whether vLLM 0.32 loads it: measured)
MAPPED_CASES = {
    # HrmText's mapper renames `.attn.` to `.self_attn.` (hrm_text.py:469-471; transformers writes `attn`):
    # the entry is mapped before vLLM tests it against `model.H_module.layers.0.self_attn.o_proj`, so both spellings
    # reach it ...
    "hrm-checkpoint-spelling": ("HrmTextForCausalLM", HRM_O, list(HRM_O), True),
    "hrm-vllm-spelling": ("HrmTextForCausalLM", HRM_O, ["model.H_module.layers.0.self_attn.o_proj"], True),
    # ... and an entry ending in `*` is split first, then mapped: `model.H_module.layers.0.self_attn.o_` is a substring
    # of the layer's name, `*.H_module.layers.0.self_attn.o_` (and its `.*` form) matches nothing
    "hrm-trailing-star-substring": ("HrmTextForCausalLM", HRM_O, ["model.H_module.layers.0.attn.o_*"], True),
    "hrm-trailing-star-glob": ("HrmTextForCausalLM", HRM_O, ["*.H_module.layers.0.attn.o_*"], False),
    # Phi-3 stores qkv_proj itself; its packed mapping maps qkv_proj to itself (phi3.py), so is_layer_skipped asks
    # the stored name, and the shard names no layer; Phi3ForCausalLM inherits Llama's mapper: `X*` is split
    "phi3-fused-exact": ("Phi3ForCausalLM", PHI3_QKV, list(PHI3_QKV), True),
    "phi3-fused-substring": ("Phi3ForCausalLM", PHI3_QKV, ["layers.0.self_attn.qkv"], True),
    "phi3-shards-exact": ("Phi3ForCausalLM", PHI3_QKV, [f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")], False),
    "phi3-trailing-star": ("Phi3ForCausalLM", PHI3_QKV, ["*.layers.0.self_attn.qkv_*"], False),
    "phi3-parent-star": ("Phi3ForCausalLM", PHI3_QKV + ("model.layers.0.self_attn.o_proj",), ["layers.0.self_attn*"], True),
}


@pytest.mark.parametrize("case", sorted(MAPPED_CASES))
def test_entries_are_judged_as_the_class_mapper_rewrites_them(capsys, exports, tmp_path, case):
    """Entries in the checkpoint's spelling, in vLLM's, or ending in `*`, on classes whose mapper renames (HrmText) or
    whose checkpoint stores a fused layer itself (Phi-3): doctor agrees with vLLM 0.32's loader."""
    folder = judged(capsys, exports, tmp_path, *MAPPED_CASES[case])
    if MAPPED_CASES[case][3]:
        return
    code, out, err = run_fix(capsys, folder, tmp_path / "fixed")  # fix keeps its promise: a copy vLLM loads
    assert code == 0, out + err
    (loaded,) = in_vllm("vllm_load.py", tmp_path / "fixed")
    assert loaded["ok"], loaded


def run_fix(capsys, folder: Path, out: Path) -> tuple[int, str, str]:
    from tests.conftest import run_captured

    return run_captured(capsys, "fix", folder, "-o", out, "--target", "vllm==0.32.0")
