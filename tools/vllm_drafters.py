"""vLLM's MTP drafters, profiled beside the main model: the drafter vLLM builds for `speculative_config={"method":
"mtp"}` on a config that asks for one (its layers' states and the published names its load_weights renames), and
every drafter class registered in this process (tools/vllm_profile.py uses both)."""

from __future__ import annotations

from vllm_load_facts import pattern
from vllm_runtime import inspect_in_process, world_of_one
from raised_by import reraise_ours


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
        reraise_ours(e)
        return {"mtp": {"unbuilt": f"{type(e).__name__}: {str(e)[:200]}"}}
    with world_of_one(vc):  # DeepSeek-V4's drafter load_weights asks the TP group (nvidia/mtp.py:383-385)
        renames = drafter_renames(model)
    return {"mtp": {"architecture": vc.speculative_config.draft_model_config.architectures[0],
                    "modules": modules_of(model), "renames": renames}}


def drafter_renames(model) -> dict[str, str]:
    """Checkpoint module pattern -> the drafter's module pattern, where vLLM's own load_weights puts a published MTP
    name elsewhere (Qwen3.5 / Qwen3-Next: `mtp.fc` -> `model.fc`; DeepSeek-V4: `mtp.0.attn.wq_b` ->
    `model.layers.{num_hidden_layers}.mtp_block.attn.wq_b`): each module's candidate published names (`published`) are
    fed alone, as meta tensors, through the drafter's load_weights with recording weight loaders
    (tools/vllm_declared.py), and kept where it places them on that module."""
    from vllm_declared import placements

    out = {}
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for name, module in model.named_modules():
        weight = getattr(module, "_parameters", {}).get("weight")
        if weight is None or weight.dim() != 2 or not name.startswith("model."):
            continue
        for candidate in published(name, layers):
            try:
                placed = placements(model, {candidate: (candidate + ".weight", list(weight.shape), str(weight.dtype)[6:])})
            except Exception as e:  # noqa: BLE001 - this loader does not take the name: no rename
                reraise_ours(e)
                continue
            if placed.get(candidate, {}).get("vllm_module") == name:
                out[pattern(candidate)] = pattern(name)
                break
    return dict(sorted(out.items()))


def published(name: str, layers: int | None) -> list[str]:
    """The names a checkpoint may publish a drafter module under: `mtp.` for `model.`, and, for a module of MTP layer
    `model.layers.{layers + i}` (DeepSeek's spec-layer numbering), DeepSeek-V4's `mtp.{i}.` without the `mtp_block.`
    its load_weights adds (models/deepseek_v4/nvidia/mtp.py:343-356, 543-576). Hypotheses only: the drafter's own
    load_weights decides."""
    out = ["mtp." + name[len("model."):]]
    parts = name.split(".")
    if layers is not None and len(parts) > 3 and parts[1] == "layers" and parts[2].isdigit() and int(parts[2]) >= layers:
        rest = [p for p in parts[3:] if p != "mtp_block"]
        out.append(".".join(["mtp", str(int(parts[2]) - layers), *rest]))
    return out


def register_drafters() -> None:
    """Every MTP drafter class vLLM registers, inspected in-process: vLLM would inspect each in a subprocess, where
    the torchvision stand-in is absent (Qwen3_5MTP's module imports the image processor) and which costs ~20 s each."""
    from vllm import ModelRegistry

    inspect_in_process([arch for arch in ModelRegistry.get_supported_archs() if "MTP" in arch or "NextN" in arch])
