"""What the target release does when config.json chooses between two builds of a model (the profile's `without`).

vLLM 0.32 builds Qwen4Exp's QSA attention only when the `indexer_*` fields are set (qwen4_exp/nvidia/model.py:243).
Left null, the build has no indexer, and its load_weights raises on a checkpoint that still stores one ("There is no
module or parameter named ..."); some set and some null, or set to values it does not take (not positive,
indexer_kv_heads != 1, a budget no multiple of the ratio), transformers' config class, which vLLM runs while reading
config.json, refuses the config before any layer is built ("QSA config is missing required fields", "requires
indexer_kv_heads=1"). These facts are recorded from vLLM's own code by the profile generator
(tools/vllm_without_loads.py, tools/vllm_config_refusals.py; arch/configured.py reads them for one config); each stops
every rank, so each is one error, in the release's words where it recorded them.
"""

from __future__ import annotations

import re

from repair.arch import Architecture
from repair.doctor.findings import Finding, Kind, Severity
from repair.io.checkpoint import Checkpoint
from repair.targets.profiles import Target
from repair.targets.vllm_loader import shard_order

LAYER_STAR = re.compile(r"(?<=\.)\*(?=\.|$)")
LAYER_NUMBER = re.compile(r"\.([0-9]+)(?=\.|$)")  # ASCII: vLLM's layer list names its layers str(i)
QUOTED = re.compile(r"'([^']+)'")  # the name an error quotes


def refused_config_findings(family: Architecture, target: Target, tp: int) -> list[Finding]:
    """One error when the release refuses config.json for its null fields of a build it reads together (only for the
    runtime whose code the row records: knows_layer_roles)."""
    refused = family.refused_config
    if refused is None or not target.profile.knows_layer_roles:
        return []
    fields = ", ".join(refused.fields)
    words = f": {refused.error}" if refused.error else ""
    return [Finding(Severity.ERROR, Kind.CONFIG_REFUSED, fields,
                    f"{fields}: {refused.problem}; {refused.release} refuses such a config while reading it, before "
                    f"building any layer (its config class's validation, recorded in {refused.source}){words}; "
                    f"{refused.remedy}", refused.error, tuple(range(tp)))]


def unexpected_tensor_findings(ckpt: Checkpoint, family: Architecture, target: Target, tp: int,
                               dropped: frozenset[str] = frozenset()) -> list[Finding]:
    """One error per recorded error text (layer numbers `*`) the release raises on the stored modules of the recorded
    patterns that its build for this config has no parameter for (QSA's indexer projection and norms; the profile's
    `weight_refused`: MiniCPMMoE's NVFP4 expert scales, one error for every layer's and expert's `ws_scale`), in the
    release's load order (the first is where it stops): named by its first such module, with that module's layer
    numbers in the release's words. `dropped`: modules a plan leaves out of the output."""
    if not family.refused_modules or not target.profile.knows_layer_roles:
        return []
    regexes = [(re.compile(under(pattern)), error, (why, remedy)) for pattern, error, why, remedy in family.refused_modules]
    named = re.compile("|".join(r.pattern for r, _, _ in regexes))
    located = ckpt.locate()
    stored = [n for n in ckpt.infos() if named.match(n) and n.rpartition(".")[0] not in dropped]
    raised: dict[str, list[tuple[str, str, tuple[str, str]]]] = {}
    for name in sorted(stored, key=lambda n: (shard_order(located[n][0].path.name), n)):
        for regex, error, why in regexes:
            if hit := regex.match(name):
                numbers = iter(LAYER_NUMBER.findall(hit.group(0)))
                said = as_met(LAYER_STAR.sub(lambda _: next(numbers, "*"), error), name)
                raised.setdefault(error, []).append((name.rpartition(".")[0], said, why))
    out = []
    for hits in raised.values():  # in load order: the first raises first
        (first, said, (why, remedy)), more = hits[0], len({m for m, _, _ in hits}) - 1
        out.append(Finding(Severity.ERROR, Kind.UNEXPECTED_TENSOR, first,
                           f"{first}{f' (and {more} more)' if more else ''}: stored, but {why}: it raises {said}; {remedy}",
                           said, tuple(range(tp))))
    return out


def as_met(said: str, name: str) -> str:
    """The release's error where it quotes the weight the profile fed for the stored tensor's module, as raw names are
    looked up (vLLM's `params_dict[name]`: Kimi-Linear's layer 0 `block_sparse_moe`), quoting the stored tensor: the leaf
    it meets first (input_scale before weight) is the one it raises on. Any other error, or a leaf Python would quote
    otherwise, as recorded."""
    module, _, leaf = name.rpartition(".")
    quoted = QUOTED.search(said)
    if quoted is None or leaf == "weight" or not f".{module}.weight".endswith(f".{quoted.group(1)}"):
        return said
    met = f"{quoted.group(1).removesuffix('weight')}{leaf}"
    plain = repr(met) == f"'{met}'"  # a quote, backslash or control character in a stored name: as recorded
    return f"{said[:quoted.start(1)]}{met}{said[quoted.end(1):]}" if plain else said


def under(pattern: str) -> str:
    """A regex (re.match) for tensor names at or under a module pattern (`*` an ASCII layer number)."""
    return re.escape(pattern).replace(re.escape("*"), "[0-9]+") + r"(?=\.|\Z)"

