"""What vLLM's own load_weights drops or refuses of a checkpoint's tensors, recorded for tools/vllm_profile.py (run in
.venv-vllm): prefixes its mapper or its loader's `skip_prefixes` drop unread, tensors it takes and fills nothing with,
and the tensors it raises on. Imports nothing from ``repair``."""

from __future__ import annotations

from vllm_load_facts import LAYER_NUMBER, log, mapped_name, pattern, refusal_text


def mapper_drops(model_class) -> dict[str, None]:
    """Checkpoint name prefix -> None for each prefix the class's hf_to_vllm_mapper maps to None: load_weights drops
    every tensor under it unread (MiMo's `model.mtp_layers.`, mimo.py's orig_to_new_prefix: its MTP block is the
    drafter's). Kept in `renames` as the prefix itself, its trailing dot included. A substring the mapper maps to None
    (DeepSeek-V4's `mtp.`, orig_to_new_substr: nvidia/model.py:1751-1754) drops every name holding it; it is kept as a
    prefix where a name starting with it maps to None (the names that start with it; a name holding it further in is
    dropped too, and not recorded)."""
    mapper = getattr(model_class, "hf_to_vllm_mapper", None)
    drops = {p: None for p, new in sorted((getattr(mapper, "orig_to_new_prefix", None) or {}).items()) if new is None}
    for part, new in sorted((getattr(mapper, "orig_to_new_substr", None) or {}).items()):
        if new is None and part.endswith(".") and mapped_name(model_class, f"{part}0") is None:
            drops[part] = None
    return drops


def loader_drops(model) -> dict[str, None]:
    """Checkpoint name prefix -> None for each `skip_prefixes` entry the class's own load_weights hands its
    AutoWeightsLoader under which the model builds no module: dropped unread, as `mapper_drops` (vLLM 0.28's MiMo:
    `model.mtp_layers.`, mimo.py:121-125, where 0.32 uses its mapper). Read by running load_weights on no weights with
    the loader's constructor recording what it is given (a shim: the loader itself decides nothing here). The shim
    once handed `skip_prefixes=None` on to 0.30/0.32's constructor, which has no such parameter: the TypeError was ours,
    swallowed as "a load_weights that wants weights" (the facts came out empty, as they are: those releases take none)."""
    from raised_by import reraise_ours  # (a sibling: tools/ on the path where the tool runs)
    from vllm.model_executor.models.utils import AutoWeightsLoader

    given: list[str] = []
    init = AutoWeightsLoader.__init__

    def recording(self, module, *args, **kwargs):  # handing on only what it was given: 0.30/0.32 take no skip_prefixes
        if module is model:
            given.extend(kwargs.get("skip_prefixes") or ())
        init(self, module, *args, **kwargs)

    AutoWeightsLoader.__init__ = recording
    try:
        model.load_weights(iter(()))
    except Exception as e:  # noqa: BLE001 - a load_weights that wants weights: its loader's prefixes were read already
        reraise_ours(e)
    finally:
        AutoWeightsLoader.__init__ = init
    built = [name for name, _ in model.named_modules()]
    return {p: None for p in sorted(set(given)) if p.endswith(".") and not any((n + ".").startswith(p) for n in built)}


def dropped_tensors(model, tensors: dict) -> tuple[dict[str, dict[str, str | None]], dict[str, str]]:
    """(checkpoint tensor pattern -> {"unfilled": the parameter pattern left unfilled, "refused": vLLM's error or None},
    tensor pattern -> vLLM's error where its load_weights raises on that tensor). A dropped tensor: the class's own
    load_weights takes a tensor of the published layout and fills no parameter with it, and a parameter of the same
    leaf and layer numbers stays unfilled (laguna.py registers the routed experts' `e_score_correction_bias` on
    `mlp.experts.routed_experts`, its AutoWeightsLoader ignores `_bias` suffixes, so the checkpoint's
    `mlp.experts.e_score_correction_bias` goes nowhere). "refused": the words of the release's own
    track_weights_loading, asked as for a quantized checkpoint, when it names that parameter (0.32 does; 0.28 exempts
    every parameter of a module with a post-processing quant method: then None, the parameter keeps its initial value).
    Every tensor is fed at once, as meta tensors, through the recording loaders; where load_weights raises, module by
    module (`fed_apart`), so one name it has no parameter for (Dbrx's, GptOss's) does not void every other tensor's
    facts. A dropped tensor no unfilled parameter pairs with (a buffer vLLM recomputes) makes no claim."""
    loaded: set[str] = set()
    placed, refused = fed_apart(model, tensors, loaded)
    unfilled = {n for n, _ in model.named_parameters()} - loaded  # what track_weights_loading starts from
    out: dict[str, set[str]] = {}
    raised = {n for n in tensors if pattern(n) in refused}
    for name in sorted(set(tensors) - set(placed) - raised):
        leaf, numbers = name.rpartition(".")[2], LAYER_NUMBER.findall(name)
        pairs = [u for u in unfilled if u.rpartition(".")[2] == leaf and LAYER_NUMBER.findall(u) == numbers]
        if len(pairs) == 1:
            out.setdefault(pattern(name), set()).add(pairs[0])
    tracked = tracking_refusal(model, loaded)
    return ({k: {"unfilled": pattern(next(iter(v))), "refused": tracked[0] if v & tracked[1] else None}
             for k, v in sorted(out.items()) if len({pattern(u) for u in v}) == 1}, refused)


def fed_apart(model, tensors: dict, loaded: set[str]) -> tuple[dict[str, dict], dict[str, str]]:
    """(tensor -> where load_weights puts it, tensor pattern -> vLLM's error): every tensor fed at once; where
    load_weights raises, each module's tensors together, and a refused module's each alone, so the tensor vLLM raises
    on is recorded as a refusal with its words and the rest is learned. A pattern refused in some layers and taken in
    others says nothing of the pattern (as in placed_weights): logged, not recorded."""
    from raised_by import reraise_ours  # (a sibling: tools/ on the path where the tool runs)
    from vllm_declared import placements

    try:
        return placements(model, tensors, loaded), {}
    except Exception as e:  # noqa: BLE001 - vLLM's refusal of one name: each module fed alone below
        reraise_ours(e)
        log(f"load_weights on every checkpoint tensor failed ({type(e).__name__}: {str(e)[:120]}): one module at a time")
    modules: dict[str, dict] = {}
    for name, tensor in tensors.items():
        modules.setdefault(name.rpartition(".")[0], {})[name] = tensor
    placed: dict[str, dict] = {}
    refused: dict[str, str] = {}
    for group in modules.values():
        try:
            placed.update(placements(model, group, loaded))
            continue
        except Exception as e:  # noqa: BLE001 - vLLM's refusal of one of them: each fed alone below
            reraise_ours(e)
        for name, tensor in group.items():
            try:
                placed.update(placements(model, {name: tensor}, loaded))
            except Exception as e:  # noqa: BLE001 - vLLM's own refusal of this tensor, recorded
                reraise_ours(e)
                refused.setdefault(pattern(name), refusal_text(e, name))
    partly = {pattern(n) for n in placed} & set(refused)
    if partly:
        log(f"refused in some layers only, not recorded: {sorted(partly)}")
    return placed, {k: v for k, v in sorted(refused.items()) if k not in partly}


def tracking_refusal(model, loaded: set[str]) -> tuple[str | None, set[str]]:
    """(the head of the release's own track_weights_loading error, the parameters it names) for a quantized checkpoint
    that filled `loaded`; (None, set()) when it passes. Releases before 0.32 take no `quantized` argument."""
    import ast
    import inspect

    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    check = DefaultModelLoader.track_weights_loading
    quantized = {"quantized": True} if "quantized" in inspect.signature(check).parameters else {}
    try:
        check(None, model, set(loaded), **quantized)  # its body never reads self
    except ValueError as e:
        head, _, names = str(e).partition(": ")
        return head, set(ast.literal_eval(names))
    return None, set()
