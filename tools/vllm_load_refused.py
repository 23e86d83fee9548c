"""Whether vLLM's own loader takes any checkpoint of an architecture at all, whatever its quantization (run in
.venv-vllm; tools/vllm_profile.py records the answer as a profiled architecture's `load_refused`).

The checkpoint is transformers' own: its model class for the architecture's small config (`export_config`, the one
tools/vllm_arch_check.py exports too), saved in BF16 with ``save_pretrained`` (the published names), and no
quantization config. vLLM loads it as ``vllm serve DIR`` does (tools/vllm_load.py: ``get_model`` on CPU, real weights,
weights tracked). Where that load fails and transformers' conversion mapping names the tensors otherwise (the names
its class holds: OlmoHybrid's `input_layernorm` for the published `attention_layer_norm`), those names are loaded too.
Only an error raised inside the model class's own ``load_weights`` on every such name set counts: then no checkpoint
of these names loads, and no quantization config changes that code (vLLM 0.32's dbrx.py looks its fused experts up
under a name its FusedMoE no longer has: ``KeyError: 'blocks.0.ffn.experts.w13_weight'``, vllm-project/vllm#49004;
olmo_hybrid.py's conv1d loader indexes with a shard id it never receives, vllm-project/vllm#55858). A failure
anywhere else (the config, building the model, a weights check after loading) records nothing.
Imports nothing from ``repair``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from vllm_profile_configs import PUBLISHED, NoConfig, small_config, written_as
from raised_by import reraise_ours

LIMIT = 300  # characters of vLLM's error kept (the error names tensors; the head says which and why)
# AutoWeightsLoader's refusal of a name it has no module or parameter for (model_executor/models/utils.py:443, 0.32)
UNPLACED = "There is no module or parameter named"
NO_PLACE = "vLLM's own loader has no place for the names transformers' class writes"  # tools/profile_report.py reads it


def export_config(arch: str, names: dict[str, str], small: dict | None = None) -> dict:
    """config.json of the tiny export of `arch`: the profile's small config (`small`, read before vLLM registers its own
    config class for the model type: vLLM's DeepseekV4Config keeps the published sizes, 129280 x 4096, which the
    profile's host cannot hold) with its PUBLISHED fields, in BF16."""
    config = small if small is not None else small_config(arch, names)[0]
    config = dict(config, architectures=[arch], torch_dtype="bfloat16", **PUBLISHED.get(arch, {}))
    if config.get("num_nextn_predict_layers"):
        config["num_nextn_predict_layers"] = 0  # transformers' class writes no MTP layer (vLLM then wants them)
    return config


def bf16_export(arch: str, config: dict, folder: str) -> tuple[dict, set[str]]:
    """transformers' model class for `config`, saved (tiny, BF16): (name -> tensor of its checkpoint, the names of
    its modules that are not nn.Linear: ModelOpt quantizes linears (and experts, which save as per-expert names that
    are no module of transformers' class), not GPT-2's Conv1D or embeddings)."""
    import torch
    import transformers
    from safetensors.torch import load_file

    cls = getattr(transformers, written_as(arch), None)
    if cls is None:
        raise LookupError("transformers has no model class of this name to write its checkpoint names")
    torch.manual_seed(0)
    model = cls(cls.config_class(**{k: v for k, v in config.items() if k != "model_type"})).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    tensors: dict = {}
    for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        tensors.update(load_file(os.path.join(folder, file)))
    not_linear = {n for n, m in model.named_modules() if not isinstance(m, torch.nn.Linear)}
    return tensors, not_linear


def transformers_names(model_type: str, tensors: dict) -> dict:
    """`tensors` renamed by every WeightRenaming of transformers' conversion mapping for `model_type` (the names its
    class holds; save_pretrained writes them back to the published ones). Some vLLM files read these instead (vLLM 0.32's
    olmo_hybrid.py: input_layernorm, not the published attention_layer_norm). Converters (fused experts) are kept."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    renamings = [r for r in get_checkpoint_conversion_mapping(model_type) or () if isinstance(r, WeightRenaming)]
    out = {}
    for name, tensor in tensors.items():
        for renaming in renamings:
            name = renaming.rename_source_key(name)[0]
        out[name] = tensor
    return out


def write_tensors(folder: str, tensors: dict) -> None:
    """`tensors` as the folder's only safetensors file (any earlier shards and index removed)."""
    from safetensors.torch import save_file

    for file in os.listdir(folder):
        if file.endswith(".safetensors") or file == "model.safetensors.index.json":
            os.remove(os.path.join(folder, file))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})


def error_text(error: BaseException) -> str:
    """vLLM's error as doctor quotes it: `Type: message`, cut at LIMIT characters."""
    return f"{type(error).__name__}: {error}"[:LIMIT]


def in_model_load_weights(error: BaseException, model_class: type) -> bool:
    """The error passed through the model class's own load_weights (not vLLM's loader around it, not the build)."""
    tb = error.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if tb.tb_frame.f_code.co_name == "load_weights" and isinstance(owner, model_class):
            return True
        tb = tb.tb_next
    return False


def zeros(shapes: dict[str, list[int]]) -> dict:
    """A BF16 zero tensor of each shape (a checkpoint of these names; vLLM's weight loaders cast as they copy)."""
    import torch

    return {n: torch.zeros(shape, dtype=torch.bfloat16) for n, shape in shapes.items()}


def load_refused(arch: str, names: dict[str, str], loader, small: dict | None = None,
                 published: dict[str, list[int]] | None = None) -> str | None:
    """vLLM's error (error_text) when its loader takes neither transformers' published names nor its class's names
    (nor `published`, where the profile read the published names back through vLLM's mapper: MAPPER_LAYOUT) for this
    architecture's BF16 checkpoint, failing in the model class's load_weights each time; else None.
    Where the last refusal is AutoWeightsLoader finding no place for a name (UNPLACED), the names are not a layout vLLM
    knows (Inkling: transformers' configs lack the `decoder_dmodel` vLLM builds its towers from, its text class writes
    `attn_sconv` and `embed_norm` vLLM's does not hold): no claim about every checkpoint, and no row (NoConfig)."""
    from vllm import ModelRegistry
    from vllm_load import load

    model_class = ModelRegistry._try_load_model_cls(arch)
    if model_class is None:
        return None
    import transformers

    if getattr(transformers, written_as(arch), None) is None:
        return None  # no class writes its checkpoint: nothing to claim (bf16_export's LookupError is not reached)
    config = export_config(arch, names, small)
    with tempfile.TemporaryDirectory() as folder:
        try:
            tensors = bf16_export(arch, config, folder)[0]
        except Exception as e:  # noqa: BLE001 - no transformers checkpoint: nothing to claim
            reraise_ours(e)
            print(f"[vllm_load_refused] {arch}: no transformers checkpoint ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
            return None
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        renamed = transformers_names(config["model_type"], tensors)
        read_back = [zeros(published)] if published else []
        error = None
        for names_set in [tensors] + ([renamed] if set(renamed) != set(tensors) else []) + read_back:
            if names_set is not tensors:
                write_tensors(folder, names_set)
            try:
                load(folder, loader)
                return None
            except Exception as e:  # noqa: BLE001 - vLLM's own refusal, judged below
                reraise_ours(e)
                if not in_model_load_weights(e, model_class):
                    return None
                error = error_text(e)
    if error is not None and error.startswith(f"ValueError: {UNPLACED}"):  # up to its list of parameters (a set)
        raise NoConfig(f"{NO_PLACE} ({error.split('. The available parameters')[0]})")
    return error
