"""vLLM's MTP drafters, profiled beside the main model: the drafter vLLM builds for `speculative_config={"method":
"mtp"}` on a config that asks for one (its layers' states and the published names its load_weights renames), and
every drafter class registered in this process (tools/vllm_profile.py uses both)."""

from __future__ import annotations

from vllm_load_facts import pattern
from vllm_runtime import inspect_in_process


def has_mtp(config: dict) -> bool:
    text = config.get("text_config") or {}
    return any(c.get(k) for c in (config, text) for k in ("num_nextn_predict_layers", "mtp_num_hidden_layers"))


def mtp_drafter(folder: str, initialize_model) -> dict:
    """{"mtp": {"architecture", "modules", "renames"}}: vLLM's MTP drafter for this config (DeepSeekMTP, Qwen3_5MTP,
    Glm4MoeMTP, ...), its layers' states as for the main model; renames: the checkpoint names its hf_to_vllm_mapper
    maps onto its modules (a mapper prefix read backwards, kept only when mapping it forwards gives the module).
    A drafter vLLM cannot build here is recorded with the reason instead of its modules."""
    from vllm_profile import build_model, modules_of

    try:
        model, vc = build_model(folder, initialize_model, drafter=True)
    except Exception as e:  # noqa: BLE001 - recorded: the main model's profile stands without it
        return {"mtp": {"unbuilt": f"{type(e).__name__}: {str(e)[:200]}"}}
    return {"mtp": {"architecture": vc.speculative_config.draft_model_config.architectures[0],
                    "modules": modules_of(model), "renames": drafter_renames(model)}}


def drafter_renames(model) -> dict[str, str]:
    """Checkpoint module pattern -> the drafter's module pattern, where vLLM's own load_weights puts a published MTP
    name elsewhere (Qwen3.5 / Qwen3-Next: `mtp.fc` -> `model.fc`): each module's name and its `mtp.` form are fed
    alone, as meta tensors, through the drafter's load_weights with recording weight loaders (tools/vllm_declared.py)."""
    from vllm_declared import placements

    out = {}
    for name, module in model.named_modules():
        weight = getattr(module, "_parameters", {}).get("weight")
        if weight is None or weight.dim() != 2 or not name.startswith("model."):
            continue
        candidate = "mtp." + name[len("model."):]
        try:
            placed = placements(model, {candidate: (candidate + ".weight", list(weight.shape), str(weight.dtype)[6:])})
        except Exception:  # noqa: BLE001 - this loader does not take the name: no rename
            continue
        if placed.get(candidate, {}).get("vllm_module") == name:
            out[pattern(candidate)] = pattern(name)
    return dict(sorted(out.items()))


def register_drafters() -> None:
    """Every MTP drafter class vLLM registers, inspected in-process: vLLM would inspect each in a subprocess, where
    the torchvision stand-in is absent (Qwen3_5MTP's module imports the image processor) and which costs ~20 s each."""
    from vllm import ModelRegistry

    inspect_in_process([arch for arch in ModelRegistry.get_supported_archs() if "MTP" in arch or "NextN" in arch])
