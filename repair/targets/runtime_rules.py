"""A runtime release's rules as data: repair/targets/data/<runtime>-<release>.json with a `rules` block.

The block names the matcher per config kind (repair/targets/matchers.py), the fused-layer policy and its error, the
unknown-tensor policy, the loader behaviours, the draft/MTP rules, error templates, the algorithms the release
refuses while reading the config, and the model classes' packed_modules_mapping; `source` says where each fact was
read (wheel or repo, path, version). docs/runtime_profiles.md documents the form. Doctor and planning code ask these
values, never which runtime it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from importlib.resources import files
from types import MappingProxyType
from typing import Mapping

from repair.formats.base import Declaration
from repair.targets.matchers import KINDS, exclusion_matcher, layer_matcher
from repair.targets.sglang_match import Building

DATA = files("repair") / "targets" / "data"
LLAMA_FUSIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass(frozen=True)
class RuntimeRules:
    """One release's `rules` block, as read (see the module docstring)."""

    runtime: str
    release: tuple[int, ...]
    source: str  # the data file's name
    matchers: Mapping[str, str]
    follows_draft_config: bool
    layer_rows: str  # the target spec whose generated architecture rows (layer roles, fusions) apply
    fused: Mapping[str, str]
    unknown_tensors: Mapping[str, str]
    loaders: Mapping[str, Mapping[str, str]]
    draft: Mapping
    errors: Mapping[str, str]
    refused_algorithms: Mapping[str, str]
    fallback_fused: bool
    packed: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.runtime} {'.'.join(map(str, self.release))}"

    def building(self, architecture: str, fusions: Mapping[str, tuple[str, ...]] | None) -> Building:
        """How this release builds `architecture`: the model's fusions (the layer rows'), its class's packed mapping."""
        return Building(MappingProxyType(dict(fusions or LLAMA_FUSIONS)),
                        MappingProxyType(dict(self.packed.get(architecture, {}))), self.fallback_fused)

    def bind(self, declaration: Declaration, building: Building) -> Declaration:
        """The declaration whose exclusion and per-layer questions this release's matchers answer."""
        kind = "compressed-tensors" if declaration.format.NAME == "compressed-tensors" else "modelopt"
        excl, layers = exclusion_matcher(self.matchers[kind]), layer_matcher(self.matchers["quantized_layers"])
        return replace(declaration, matcher=lambda entries, targets: excl(entries, targets, building),
                       layer_lookup=lambda algos, name: layers(algos, name, building))


def read_rules(doc: dict, source: str) -> RuntimeRules:
    """A data file's rules block (a malformed shipped file is our bug: KeyError names the key)."""
    body = doc["rules"]
    missing = [k for k in KINDS if k not in body["matchers"]]
    if missing:
        raise KeyError(f"{source}: rules.matchers lacks {missing}")
    for kind in KINDS[:2]:
        exclusion_matcher(body["matchers"][kind])
    layer_matcher(body["matchers"]["quantized_layers"])
    packed = {a: {k: tuple(v) for k, v in m.items()} for a, m in body.get("packed_modules_mapping", {}).items()}
    return RuntimeRules(doc["runtime"], tuple(int(p) for p in doc["release"].split(".")), source, body["matchers"],
                        bool(body["follows_draft_config"]), body["layer_rows"], body["fused"], body["unknown_tensors"],
                        body["loaders"], body["draft"], body["errors"], body["refused_algorithms"],
                        bool(body["fallback_fused"]), packed)


def shipped_rules() -> tuple[RuntimeRules, ...]:
    """Every shipped rules file, oldest release first per runtime."""
    out = []
    for item in DATA.iterdir():
        if item.name.endswith(".json"):
            doc = json.loads(item.read_text(encoding="utf-8"))
            if "rules" in doc:
                out.append(read_rules(doc, item.name))
    return tuple(sorted(out, key=lambda r: (r.runtime, r.release)))
