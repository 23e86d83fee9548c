"""Small configs for vLLM architectures whose config class comes with remote code only (run in .venv-vllm).

Neither transformers nor vLLM ships a config class for these (InternLM2, Orion, TeleChat2, ...): the published
checkpoints carry `configuration_*.py` for --trust-remote-code. vLLM's own model code is the reader that matters, so
the config is learned from it: a plain PretrainedConfig subclass is registered with transformers' AutoConfig under
a model_type of our own (it holds exactly the config.json fields, nothing else), the class is built on the meta
device as the profile builds every class, and each attribute vLLM's code reads and the config lacks (an
AttributeError naming it) is answered from GENERIC, then the build is tried again. The attributes answered are the
fields the class was seen to read; the profile row's `config.source` lists them. A read GENERIC does not answer, or
any other failure to build, leaves the architecture unprofiled with that reason (never a row from a guessed layout).
Reads with a default (`getattr(config, "x", default)`) take vLLM's default: the path of a config without the field.
Those reads choose a branch too (MiniCPM's `num_experts` default 0 builds the dense MLP), so every field vLLM's model
code read and the config lacked is recorded with the value the code used: the class's `__getattr__` (reached only for
a field the config lacks) notes the reading line under vllm/model_executor/models/, and the default is read off that
line's getattr call. The row's `config.source` lists them, and `config.defaulted` holds those whose default is a
literal: the row describes a config that agrees with them (repair/arch/profiled.py applies it to no other).
Imports nothing from ``repair``.
"""

from __future__ import annotations

import ast
import re
import sys

from vllm_profile_configs import SMALL, NoConfig

# field -> the value answered when vLLM's model code reads it: SMALL's sizes, and for every other field the value
# that takes the plain path (no bias, no dropout, no MuP scaling, default RoPE, every layer full attention, softmax
# routing): no value here chooses a layer kind a published config of the family would not have
GENERIC: dict = {
    **SMALL, "rms_norm_eps": 1e-6, "layer_norm_epsilon": 1e-6, "layernorm_epsilon": 1e-6, "norm_epsilon": 1e-6,
    "rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "partial_rotary_factor": 1.0, "rotary_dim": 16, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "bias": False, "use_bias": False, "use_qkv_bias": False, "qkv_bias": False,
    "mlp_bias": False, "use_qk_norm": False, "embedding_dropout": 0.0, "attention_dropout": 0.0,
    "hidden_dropout": 0.0, "use_mup": False, "query_pre_attn_scalar": 16,
    "layer_types": ["full_attention", "full_attention"], "num_shared_experts": 1, "norm_topk_prob": True,
    "scoring_func": "softmax", "score_function": "softmax", "topk_method": "greedy", "routed_scaling_factor": 1.0,
    "moe_layer_freq": 1, "num_experts_per_token": 2, "moe_router_enable_expert_bias": False,
    "initializer_range": 0.02, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "activation_function": "silu", "dim_model_base": 64, "scale_emb": 1.0, "scale_depth": 1.0,  # MuP: no sizes
}
_MISSING = re.compile(r"object has no attribute '(\w+)'")
MODEL_CODE = re.compile(r"/vllm/(model_executor/)?models/")  # vLLM's model files (vllm/models/: Glm5Next, MiniMax M3)
LEARNED = "learned from vLLM's model code"  # a row's config.source starts so (tools/profile_report.py reads it)
NO_ANSWER = "vLLM's model reads a config field no generic value answers"
PRESENCE = "vLLM's model chooses the layers it builds by whether the config has"
UNBUILT = "vLLM cannot build it from a config of generic values"


def model_type(arch: str) -> str:
    """The model_type the learned config is registered under: ours, so no transformers or vLLM class answers it."""
    return f"ckpt_repair_remote_{arch.lower()}"


RAISED_FOR_THE_CALLER = ("_noted_miss",)  # its AttributeError is vLLM's read of a field the config lacks (tools/raised_by.py)


def register(arch: str) -> str:
    """Register (once) a plain PretrainedConfig subclass for `arch` with transformers' AutoConfig; its model_type.
    Its `reads` (a list on the class, emptied by remote_config before each build) collects (field, file, line) for
    every field vLLM's model code asks of it and it lacks."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    name = model_type(arch)
    if name not in CONFIG_MAPPING:
        AutoConfig.register(name, type(f"Remote{arch}Config", (PretrainedConfig,),
                                       {"model_type": name, "reads": [], "__getattr__": _noted_miss}))
    return name


def _noted_miss(self, field: str):
    """A field the config lacks: noted where vLLM's model code asked for it, then AttributeError as ever."""
    caller = sys._getframe(1)
    if MODEL_CODE.search(caller.f_code.co_filename) and not field.startswith("_"):
        type(self).reads.append((field, caller.f_code.co_filename, caller.f_lineno))
    # the name the lookup failed on: an instance's attribute_map sends a read elsewhere (telechat2.py's n_layer)
    missing = object.__getattribute__(self, "attribute_map").get(field, field) if field != "attribute_map" else field
    raise AttributeError(f"'{type(self).__name__}' object has no attribute '{missing}'")


def _call(function: str, args: int, field: str, path: str, line: int) -> ast.Call | None:
    """The `function(<x>, "field", ...)` call with `args` arguments spanning `line` of `path`, or None."""
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function
                and len(node.args) == args and isinstance(node.args[1], ast.Constant) and node.args[1].value == field
                and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return node
    return None


def default_read(field: str, path: str, line: int) -> str | None:
    """The source of the default of the `getattr(<x>, "field", default)` call on `line` of `path`; None when that line
    reads the field without one (the build then stops on it, and GENERIC answers)."""
    call = _call("getattr", 3, field, path, line)
    return None if call is None else ast.unparse(call.args[2])


def site(path: str, line: int) -> str:
    """`file.py:line: `the line``, where vLLM's model code reads a field (the path below vllm's models/)."""
    with open(path) as f:
        text = f.read().splitlines()[line - 1].strip()
    return f"{MODEL_CODE.split(path)[-1]}:{line}: `{text[:120]}`"


def presence_chosen(noted: list, config: dict, modules: dict, build) -> str | None:
    """Why the build is no row where vLLM's model code chose its layers by whether the config has fields (`hasattr`)
    it lacked: with GENERIC's values for them (and for those the class then asks of too), it builds other modules
    (openpangu.py:791-794: MLA only where qk_nope_head_dim, qk_rope_head_dim, v_head_dim and kv_lora_rank all exist);
    None where it builds the same or does not build (no claim either way). `noted` is the class's live list of reads."""
    def presence(reads: list) -> dict:
        return {f: (p, n) for f, p, n in reads if f in GENERIC and f not in config and _call("hasattr", 2, f, p, n)}

    asked, error, built = presence(list(noted)), None, modules
    while asked and error is None:
        noted.clear()
        error, built = build(dict(config, **{f: GENERIC[f] for f in asked}))
        more = {f: at for f, at in presence(list(noted)).items() if f not in asked}
        if not more:
            break
        asked |= more
    if not asked or error is not None or built == modules:
        return None
    sites = ", ".join(f"{f} ({MODEL_CODE.split(p)[-1]}:{n})" for f, (p, n) in asked.items())
    return f"{PRESENCE} {sites}: no value vLLM's code gives says which a published config holds"


def defaulted_reads(reads: list, answered: dict) -> dict[str, tuple[str, str]]:
    """field -> (the default's source, `file.py:line`) for every field the model code read with a default and the
    learned config does not hold (the first reading line)."""
    out: dict[str, tuple[str, str]] = {}
    for field, path, line in reads:
        default = None if field in answered or field in out else default_read(field, path, line)
        if default is not None:
            out[field] = (default, f"{path.rpartition('/models/')[2]}:{line}")
    return out


def literal(source: str):
    """The default's value where it is a literal (0, False, "softmax"), else the NotImplemented marker."""
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return NotImplemented


def remote_config(arch: str, build) -> tuple[dict, str, dict]:
    """(config dict without architectures, its provenance, the defaults that chose its layers: field -> the default)
    that vLLM's model class for `arch` builds from, or NoConfig. `build(config)` builds the class from a config dict and returns (the exception
    it raised or None, the built modules: tools/vllm_profile.py modules_of)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config: dict = {"model_type": register(arch)}
    noted = CONFIG_MAPPING[config["model_type"]].reads
    reads: list[str] = []
    chose_branch = False
    while True:
        noted.clear()
        error, modules = build(config)
        if error is None:
            # built only on a branch chosen for it (a refused default answered): its other layer choices by presence
            # are then no default's either (a class whose plain build stands keeps it: PanguEmbedded, openpangu.py)
            seen = list(noted)
            chosen = presence_chosen(noted, config, modules, build) if chose_branch else None
            if chosen is not None:
                raise NoConfig(chosen)
            noted[:] = seen  # the learned config's own reads (presence_chosen built others)
            defaulted = defaulted_reads(noted, config)
            deciding = {k: literal(v) for k, (v, _) in defaulted.items() if deciding_default(k, literal(v), config, modules, build)}
            said = "; ".join(f"{k}={v} ({at}{', chose the layers built' if k in deciding else ''})"
                             for k, (v, at) in sorted(defaulted.items()))
            return config, (f"{LEARNED} (tools/vllm_remote_configs.py GENERIC): it read " + ", ".join(reads)
                            + (f"; it read with a default, and used: {said}" if said else "")), deciding
        field = _MISSING.search(str(error)) if isinstance(error, AttributeError) else None
        if field is None or field.group(1) in config:
            refused = refused_default(config, list(noted), error, build)
            if refused is None:
                raise NoConfig(f"{UNBUILT}: {type(error).__name__}: {str(error)[:160]}")
            config[refused], chose_branch = GENERIC[refused], True
            reads.append(f"{refused} (its default's build refused: {type(error).__name__}: {str(error)[:80]})")
            continue
        if field.group(1) not in GENERIC:
            where = next((site(p, n) for f, p, n in noted if f == field.group(1)), "read outside vLLM's model files")
            raise NoConfig(f"{NO_ANSWER}: {field.group(1)} ({where})")
        config[field.group(1)] = GENERIC[field.group(1)]
        reads.append(field.group(1))


def refused_default(config: dict, noted: list, error: Exception, build) -> str | None:
    """The first field vLLM's model code read with a default (or asked hasattr of) that GENERIC answers and whose
    generic value alone lifts `error`, a refusal of vLLM's own code on the default's branch (openpangu.py:884 builds
    no MoE layer without n_routed_experts, then :1191 refuses a model of none); None when no such field does."""
    for field in dict.fromkeys(f for f, _, _ in noted if f in GENERIC and f not in config):
        trial, _ = build(dict(config, **{field: GENERIC[field]}))
        if trial is None or str(trial) != str(error):
            return field
    return None


def deciding_default(field: str, value, config: dict, modules: dict, build) -> bool:
    """Whether a default chose the layers: the class, built with another value of the field (a bool negated, 0 -> 2,
    another int doubled, a float halved, 0.0 -> 1.0), builds other modules. A default that is no bool or number (None,
    a list, an expression), or whose other value does not build from the generic values (fields it reads then are
    answered as the learned config's were), is listed in config.source only: no claim either way."""
    if isinstance(value, bool):
        other = not value
    elif isinstance(value, int):
        other = value * 2 if value else 2
    elif isinstance(value, float):
        other = value / 2 if value else 1.0
    else:
        return False
    trial = dict(config, **{field: other})
    while True:  # the other branch may read more fields: answered from GENERIC as the learned config's were
        error, built = build(trial)
        asked = _MISSING.search(str(error)) if isinstance(error, AttributeError) else None
        if asked is None or asked.group(1) in trial or asked.group(1) not in GENERIC:
            return error is None and built != modules
        trial[asked.group(1)] = GENERIC[asked.group(1)]
