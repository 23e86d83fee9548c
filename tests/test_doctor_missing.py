"""doctor knows what is missing (issue 25.7): a module the architecture expects but the checkpoint lacks is an error,
and a `drop` rule whose output would lack one is refused under `--target`.

The Gemma 4 assistant has a loader profile (its expected modules come from config.json); a Llama MIXED_PRECISION
checkpoint (tests/mixed_helpers.py) has none, so its decoder layers' common modules are the evidence. Every real
config and fixture checkpoint (tests/data/real, ModelOpt's exports, the Qwen3.6 layout, compressed-tensors) must
stay free of the new finding as exported: hybrid and MoE families differ between layers on purpose.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from repair.demo.examples import TINY, write_assistant
from repair.doctor.missing import missing_modules
from tests.conftest import run_captured
from tests.mixed_helpers import write_mixed
from tools.real_fixture import REAL_MODELS

DOWN = "model.layers.0.mlp.down_proj"


def without(src: Path, dst: Path, module: str) -> Path:
    """A copy of `src` whose shards no longer hold `module`'s tensors (the index follows)."""
    shutil.copytree(src, dst)
    for shard in sorted(dst.glob("*.safetensors")):
        with safe_open(shard, "pt") as fh:
            tensors, metadata = {k: fh.get_tensor(k) for k in fh.keys()}, fh.metadata()
        kept = {k: v for k, v in tensors.items() if not k.startswith(module + ".")}
        if kept != tensors:
            save_file(kept, shard, metadata=metadata)
    index = dst / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: v for k, v in data["weight_map"].items() if not k.startswith(module + ".")}
        index.write_text(json.dumps(data))
    return dst


def findings(capsys, folder: Path, target: str) -> tuple[int, list[dict]]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--strict", "--json")
    assert code in (0, 1), err
    return code, json.loads(out)["findings"]


@pytest.fixture(scope="module")
def assistant(tmp_path_factory) -> Path:
    return write_assistant(tmp_path_factory.mktemp("missing") / "assistant", TINY, broken=False)


@pytest.mark.parametrize("target", ["vllm==0.25.0", "vllm==0.32.0", "bf16"])
def test_an_assistant_without_a_layer_is_an_error(capsys, assistant, tmp_path, target):
    """It said "healthy for this target": the loader simulation only walked the stored tensors."""
    assert not [f for f in findings(capsys, assistant, target)[1] if f["code"] == "missing-module"]
    code, found = findings(capsys, without(assistant, tmp_path / "lost", DOWN), target)
    missing = [f for f in found if f["code"] == "missing-module"]
    assert code == 1 and [f["subject"] for f in missing] == [DOWN] and missing[0]["severity"] == "error", found


def test_a_llama_without_a_layer_is_an_error(capsys, tmp_path):
    """No loader profile: the other decoder layer stores mlp.down_proj beside gate_proj and up_proj."""
    src = write_mixed(tmp_path / "src")
    code, found = findings(capsys, without(src, tmp_path / "lost", "model.layers.1.mlp.down_proj"), "vllm==0.32.0")
    assert code == 1 and ("missing-module", "model.layers.1.mlp.down_proj") in {(f["code"], f["subject"]) for f in found}, found


def drop_recipe(tmp_path: Path, target: str, module: str) -> Path:
    path = tmp_path / "drop.toml"
    path.write_text(f'name = "drop"\ntarget = "{target}"\n[[rules]]\naction = "drop"\nmodules = ["{module}"]\n')
    return path


def test_a_drop_rule_that_removes_an_expected_module_is_refused_under_a_target(capsys, assistant, tmp_path):
    """It wrote exactly the output doctor now rejects, with exit 0."""
    for extra in ((), ("--dry-run",)):
        code, out, err = run_captured(capsys, "fix", assistant, "-o", tmp_path / "out", "--recipe",
                                      drop_recipe(tmp_path, "vllm==0.25.0", DOWN), *extra)
        assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
        assert DOWN in err and "drop" in err and "nothing was written" in err
        assert not (tmp_path / "out").exists()


def test_without_a_target_the_drop_is_done_and_doctor_names_the_gap(capsys, assistant, tmp_path):
    recipe = tmp_path / "plain.toml"
    recipe.write_text(f'name = "drop"\n[[rules]]\naction = "drop"\nmodules = ["{DOWN}"]\n')
    code, _, err = run_captured(capsys, "fix", assistant, "-o", tmp_path / "out", "--recipe", recipe, "--quiet")
    assert code == 0, err
    assert ("missing-module", DOWN) in {(f["code"], f["subject"]) for f in findings(capsys, tmp_path / "out", "vllm==0.25.0")[1]}


@pytest.mark.parametrize("key", [*REAL_MODELS, "mixed_export", "qwen36_export", "broken_export", "correct_export", "ct_export"])
def test_no_fixture_is_said_to_miss_a_module(request, real_models, capsys, key):
    folder = real_models[key] if key in REAL_MODELS else request.getfixturevalue(key)
    _, found = findings(capsys, folder, "vllm==0.32.0")
    assert not [f for f in found if f["code"] == "missing-module"], found


def test_a_whole_decoder_layer_dropped_under_a_target_is_refused_and_doctor_names_it(capsys, real_models, tmp_path):
    """DeepSeek-V3's layout (no loader profile): layer 30's modules dropped while layers 0-61 around it are stored
    (the drop keeps the router's e_score_correction_bias, so the router's siblings are the evidence)."""
    src = real_models["deepseek-v3-0324"]
    recipe = tmp_path / "drop.toml"
    recipe.write_text('name = "drop"\ntarget = "vllm==0.32.0"\n[[rules]]\naction = "drop"\nmodules = ["model.layers.30.*"]\n')
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe, "--dry-run")
    assert code == 2 and out == "" and err.count("\n") == 1 and "model.layers.30" in err, (code, out, err)
    recipe.write_text('name = "drop"\n[[rules]]\naction = "drop"\nmodules = ["model.layers.30.*"]\n')
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe, "--quiet")
    assert code == 0, err
    found = findings(capsys, tmp_path / "out", "vllm==0.32.0")[1]
    assert [f for f in found if f["code"] == "missing-module" and f["subject"].startswith("model.layers.30.")], found


def test_a_layer_of_which_nothing_is_stored_is_missing_whole(capsys, tmp_path):
    src = write_mixed(tmp_path / "src")
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for file in ("config.json", "hf_quant_config.json"):
        shutil.copy(src / file, renamed / file)
    with safe_open(src / "model.safetensors", "pt") as fh:  # layers 0 and 2: nothing of layer 1
        tensors = {k.replace("model.layers.1.", "model.layers.2."): fh.get_tensor(k) for k in fh.keys()}
    save_file(tensors, renamed / "model.safetensors")
    assert ("missing-module", "model.layers.1") in {(f["code"], f["subject"]) for f in findings(capsys, renamed, "bf16")[1]}


def _stack(prefix: str, layers: int, modules_of) -> list[str]:
    return [f"{prefix}.{layer}.{name}" for layer in range(layers) for name in modules_of(layer)]


def test_kv_scales_on_the_attention_module_are_not_a_module_the_mtp_layer_lacks():
    """compressed-tensors stores KV scales as `self_attn.k_scale`, a 'module' `self_attn`; DeepSeek's MTP layer 61
    (or any layer the calibration skipped) has none. A missing KV scale is kv-cache-scales' finding, never a lost layer."""
    def modules(layer):
        kv = ("self_attn.k_scale", "self_attn.v_scale") if layer < 61 else ()
        return ("self_attn.q_a_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight", *kv)
    assert missing_modules(_stack("model.layers", 62, modules), {}, "deepseek_v3", {"num_hidden_layers": 61}) == {}


def test_a_nemotron_h_mixer_with_kv_scales_on_its_two_attention_layers_is_healthy():
    """Nemotron-H's `mixer` block is Mamba, attention or MLP by layer; KV scales on the attention mixer made the
    Mamba mixer's in_proj/out_proj 'expected' in the attention layers."""
    pattern = "".join("*" if layer in (10, 30) else "M-"[layer % 2] for layer in range(52))
    def modules(layer):
        kind = pattern[layer]
        if kind == "M":
            return ("norm.weight", "mixer.A_log", "mixer.D", "mixer.in_proj.weight", "mixer.out_proj.weight", "mixer.conv1d.weight")
        if kind == "*":
            return ("norm.weight", "mixer.q_proj.weight", "mixer.o_proj.weight", "mixer.k_scale", "mixer.v_scale")
        return ("norm.weight", "mixer.up_proj.weight", "mixer.down_proj.weight")
    names = _stack("backbone.layers", 52, modules)
    assert missing_modules(names, {}, "nemotron_h", {"num_hidden_layers": 52, "hybrid_override_pattern": pattern}) == {}


@pytest.mark.parametrize("every", [6, 10, 12])
def test_layers_of_another_declared_type_are_not_compared(every):
    """Gemma 4's full-attention layers store no v_proj (k_eq_v). One in ten of them is within 'one in eight' of the
    others, so they were said to lack it; config.json's layer_types says they are another kind of layer."""
    layers = 6 * every
    types = ["full_attention" if layer % every == every - 1 else "sliding_attention" for layer in range(layers)]
    def modules(layer):
        v = () if types[layer] == "full_attention" else ("self_attn.v_proj.weight",)
        return ("self_attn.q_proj.weight", "self_attn.k_proj.weight", *v)
    names = _stack("model.language_model.layers", layers, modules)
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "text_config": {"num_hidden_layers": layers, "layer_types": types}}
    assert missing_modules(names, {}, "gemma4", config) == {}
    lost = [n for n in names if n != "model.language_model.layers.1.self_attn.v_proj.weight"]  # a sliding layer loses it
    assert list(missing_modules(lost, {}, "gemma4", config)) == ["model.language_model.layers.1.self_attn.v_proj"]


def test_a_layer_number_in_other_digits_is_not_a_decoder_layer():
    """`\\d` matches any Unicode digit: `layers.٣` was read as layer 3."""
    names = [f"model.layers.{layer}.mlp.{m}.weight" for layer in range(16) for m in ("up_proj", "down_proj")]
    hostile = [n for n in names if n != "model.layers.3.mlp.up_proj.weight"] + ["model.layers.٣.mlp.up_proj.weight"]
    assert list(missing_modules(hostile, {}, "llama", {})) == ["model.layers.3.mlp.up_proj"]


@pytest.mark.parametrize("config", [{"layer_types": "full"}, {"layer_types": [None, {}, 3] * 5}, {"text_config": []},
                                    {"hybrid_override_pattern": 5}, {"num_hidden_layers": "x"}, {"num_hidden_layers": 10**30}])
def test_a_hostile_config_changes_nothing(config):
    names = [f"model.layers.{layer}.mlp.{m}.weight" for layer in range(16) for m in ("up_proj", "down_proj")][:-1]
    assert list(missing_modules(names, {}, "llama", config)) == ["model.layers.15.mlp.down_proj"]


def test_the_last_decoder_layers_missing_are_named_and_a_shorter_vision_tower_is_not():
    """Layers past the last stored one had no stored neighbour after them: dropping model.layers.60 of 61 was
    healthy. The decoder stack is the one beside `embed_tokens`; config.json's num_hidden_layers says how deep it is."""
    text = [f"model.language_model.layers.{layer}.mlp.{m}.weight" for layer in range(60) for m in ("up_proj", "down_proj")]
    vision = [f"model.vision_tower.encoder.layers.{layer}.mlp.fc1.weight" for layer in range(27)]
    names = ["model.language_model.embed_tokens.weight", *text, *vision]
    config = {"text_config": {"num_hidden_layers": 61}, "vision_config": {"num_hidden_layers": 27}}
    assert list(missing_modules(names, {}, "vlm", config)) == ["model.language_model.layers.60"]
    assert missing_modules(names, {}, "vlm", {"text_config": {"num_hidden_layers": 60}}) == {}


def _gemma3n(layers: int, shared: int, lost: tuple[int, ...] = ()) -> tuple[list[str], dict]:
    """Gemma 3n's text stack as transformers saves it: its last `shared` layers (KV-shared) hold no k_proj, v_proj or
    k_norm; the layers in `lost` lost their k_proj."""
    def modules(layer):
        kv = () if layer >= layers - shared else ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight")
        return ("self_attn.q_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                *(m for m in kv if not (layer in lost and m.startswith("self_attn.k_proj"))))
    config = {"architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text", "num_hidden_layers": layers,
              "num_kv_shared_layers": shared}
    return ["model.embed_tokens.weight", *_stack("model.layers", layers, modules)], config


def _write_stack(folder: Path, names: list[str], config: dict) -> Path:
    """A BF16 checkpoint of these tensor names (norms 1-D) and config.json."""
    import torch
    folder.mkdir(parents=True, exist_ok=True)
    folder.joinpath("config.json").write_text(json.dumps(config))
    save_file({n: torch.zeros(16, dtype=torch.bfloat16) if n.endswith("norm.weight") else torch.zeros(16, 16, dtype=torch.bfloat16)
               for n in names}, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("layers, shared", [(4, 1), (35, 15), (30, 10)])
def test_gemma3n_kv_shared_layers_lack_k_and_v_by_design(layers, shared):
    """vLLM 0.30+ builds no k_proj/v_proj/k_norm in Gemma 3n's last num_kv_shared_layers layers (gemma3n.py's
    _kv_sharing_weights_mapper drops them; the profile records the rule): they are not missing there. A layer before
    them that lost its k_proj still is; vLLM 0.28 builds them in every layer, so there its profile expects them."""
    from repair import arch
    from repair.targets.profiles import release_at_or_below

    names, config = _gemma3n(layers, shared)
    family = arch.architecture(config, release_at_or_below("vllm", (0, 32, 0)))
    assert family.dropped_in_layers, family
    assert missing_modules(names, {}, family.name, config, family.dropped(config)) == {}
    lost, _ = _gemma3n(layers, shared, lost=(1,))
    assert list(missing_modules(lost, {}, family.name, config, family.dropped(config))) == ["model.layers.1.self_attn.k_proj"]
    older = arch.architecture(config, release_at_or_below("vllm", (0, 28, 0)))
    assert not older.dropped(config)


def test_doctor_on_a_gemma3n_stack_names_no_kv_shared_module_missing(capsys, tmp_path):
    _write_stack(tmp_path, *_gemma3n(4, 1))
    for target in ("vllm==0.32.0", "vllm==0.30.0", "bf16"):
        assert not [f for f in findings(capsys, tmp_path, target)[1] if f["code"] == "missing-module"], target
    # vLLM 0.28 builds qkv_proj in every layer; SGLang 0.5.23 too (gemma3n_causal.py: a KV-shared layer only skips
    # saving its KV cache), and vLLM's layer rows lent to it are not its loader
    for target in ("vllm==0.28.0", "sglang==0.5.23"):
        assert [f["subject"] for f in findings(capsys, tmp_path, target)[1] if f["code"] == "missing-module"] == [
            f"model.layers.3.self_attn.{m}" for m in ("k_norm", "k_proj", "v_proj")], target


@pytest.mark.parametrize("value", [None, -3, 10**9, "2", 2.0, [1], True])
def test_a_hostile_kv_shared_count_drops_nothing_it_cannot_prove(value):
    from repair import arch
    from repair.targets.profiles import release_at_or_below

    names, config = _gemma3n(4, 1)
    config["num_kv_shared_layers"] = value
    family = arch.architecture(config, release_at_or_below("vllm", (0, 32, 0)))
    assert family.dropped(config) == frozenset()


@pytest.fixture(scope="module")
def llama_without_down(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("llama_lost")
    return without(write_mixed(root / "src"), root / "lost", "model.layers.1.mlp.down_proj")


def _said(capsys, folder: Path, target: str) -> str:
    found = [f for f in findings(capsys, folder, target)[1] if f["code"] == "missing-module"]
    assert [f["subject"] for f in found] == ["model.layers.1.mlp.down_proj"], found
    return found[0]["message"]


def test_what_vllm_does_with_a_missing_layer_is_its_release_s_own(capsys, llama_without_down):
    """It said "vLLM skips its missing-weights check for a quantized checkpoint" for every release. Each release's
    DefaultModelLoader, run by the generator (tools/vllm_missing_weights.py), says: no check by default in 0.28-0.32;
    with enable_weights_track, 0.32 stops on the unfilled layer while 0.28/0.30 exempt every layer with a quant method."""
    new, old = _said(capsys, llama_without_down, "vllm==0.32.0"), _said(capsys, llama_without_down, "vllm==0.28.0")
    for text, release in ((new, "0.32.0"), (old, "0.28.0")):
        assert f"vllm {release}" in text and "quantized checkpoint" in text and "skips" not in text, text
        assert "by default, does not check for unfilled weights" in text and "enable_weights_track" in text, text
    assert "it stops on any unfilled weight ('ValueError: Following weights were not initialized from checkpoint')" in new
    assert "a missing linear layer is not noticed" in old and "stops on any" not in old, old


def test_a_target_whose_missing_weights_check_is_not_profiled_claims_none(capsys, llama_without_down):
    text = _said(capsys, llama_without_down, "sglang==0.5.11")  # 0.5.23's loader is probed (its `missing_weights`)
    assert "not profiled" in text and "skips" not in text and "vLLM" not in text, text
    text = _said(capsys, llama_without_down, "sglang==0.5.23")
    assert "SGLang 0.5.23 does not check for unfilled weights: it loads without an error" in text and "vLLM" not in text


def test_an_unquantized_checkpoint_is_not_said_to_stop_on_a_missing_linear(capsys, tmp_path):
    """vLLM checks an unquantized checkpoint only where a layer has no quant method: a lost linear loads, silently."""
    src = tmp_path / "bf16"
    src.mkdir()
    names = [f"model.layers.{layer}.mlp.{m}.weight" for layer in range(4) for m in ("up_proj", "down_proj")]
    save_file({n: __import__("torch").zeros(16, 16) for n in names if n != "model.layers.2.mlp.down_proj.weight"},
              src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4}))
    found = [f for f in findings(capsys, src, "vllm==0.32.0")[1] if f["code"] == "missing-module"]
    assert [f["subject"] for f in found] == ["model.layers.2.mlp.down_proj"], found
    assert "unquantized checkpoint" in found[0]["message"] and "a missing linear layer is not noticed" in found[0]["message"]


@pytest.mark.parametrize("target, refused", [("vllm==0.32.0", False), ("sglang==0.5.23", True), ("vllm==0.32.0,sglang==0.5.23", True)])
def test_dropping_a_kv_shared_k_proj_is_refused_only_where_a_target_builds_it(capsys, tmp_path, target, refused):
    """An original Gemma 3n layout stores k/v in the KV-shared layers too. vLLM 0.32 drops them on load, so a drop
    rule removing one loses nothing there; SGLang 0.5.23 builds them, so for it the output would lack the module."""
    names, config = _gemma3n(4, 0)
    src = _write_stack(tmp_path / "src", names, dict(config, num_kv_shared_layers=1))
    shared = "model.layers.3.self_attn.k_proj"
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", drop_recipe(tmp_path, target, shared),
                                  "--dry-run", "--quiet")
    if refused:
        assert code == 2 and shared in err and "drop" in err, (code, err)
    else:
        assert shared not in err or "drop rule removes" not in err, (code, err)


REDHAT_DSV4 = Path(__file__).parent / "data" / "real" / "redhatai-deepseek-v4-flash-nvfp4-fp8" / "config.json"
DSV4_COMPRESSOR = ("ape", "norm.weight", "wkv.weight", "wgate.weight")


def _dsv4(ratios: list, lost: tuple[str, ...] = ()) -> list[str]:
    """DeepSeek-V4's native attention names as vLLM 0.32's NVIDIA class builds them per compress_ratios[i]: a compressor
    where it is above 1, an indexer (with its own compressor) where it is 4 (models/deepseek_v4/attention.py:233-368);
    the names in `lost` are not stored."""
    def modules(layer):
        ratio = ratios[layer]
        attn = ["attn.wq_a.weight", "attn.wkv.weight", "attn.kv_norm.weight", "attn.wo_a.weight", "attn.wo_b.weight"]
        attn += [f"attn.compressor.{m}" for m in DSV4_COMPRESSOR if ratio > 1]
        attn += [f"attn.indexer.{m}" for m in ("wq_b.weight", "weights_proj.weight",
                                                *(f"compressor.{c}" for c in DSV4_COMPRESSOR)) if ratio == 4]
        return [m for m in attn if f"layers.{layer}.{m}" not in lost]
    return ["embed.weight", "head.weight", *_stack("layers", len(ratios), modules)]


def test_dsv4_builds_its_compressor_and_indexer_per_compress_ratio():
    """The real DeepSeek-V4-Flash config (43 layers: compress_ratios 0, 0, then 4 and 128 alternating): vLLM 0.32's
    profile learned from the class which layers build no compressor (0) or no indexer (0, 128), so none of those is
    missing; a compressor lost where its ratio is 4 still is."""
    from repair import arch
    from repair.targets.profiles import release_at_or_below

    config = json.loads(REDHAT_DSV4.read_text())
    ratios = config["compress_ratios"]
    family = arch.architecture(config, release_at_or_below("vllm", (0, 32, 0)))
    assert missing_modules(_dsv4(ratios), {}, family.name, config, family.dropped(config)) == {}
    lost = _dsv4(ratios, lost=("layers.2.attn.compressor.wkv.weight",))
    assert list(missing_modules(lost, {}, family.name, config, family.dropped(config))) == ["layers.2.attn.compressor.wkv"]


@pytest.mark.parametrize("value", [None, "0,0,4", [0, 4], [[0]] * 43, [True] * 43, ["0"] * 43, [0.0] * 43])
def test_a_hostile_compress_ratios_drops_nothing_it_cannot_prove(value):
    from repair import arch
    from repair.targets.profiles import release_at_or_below

    config = dict(json.loads(REDHAT_DSV4.read_text()), compress_ratios=value)
    family = arch.architecture(config, release_at_or_below("vllm", (0, 32, 0)))
    assert family.dropped(config) == frozenset()
