"""Which of config.json's `architectures` a runtime release builds: the one place that reads that list.

vLLM (0.28 to 0.32, the same `resolve_model_cls` in model_executor/models/registry.py) tries each listed name in
order: a registered one, or one whose task suffix replaced gives a registered class, built converted
(`_normalize_arch`; only a suffix of the runner and convert type its ModelConfig read from the first listed name
registered or suffixed: config/model.py `_get_default_runner_type`, so [X, DbrxModel] after an unknown XForCausalLM is
refused, and [DbrxModel, LlamaForCausalLM] builds DBRX). Only when no listed name is registered does
`model_impl="auto"` fall back to the Transformers backend, for the FIRST name, when transformers has a model class of
it that the backend takes; otherwise it refuses the model. The
profile's `registry`, `transformers_fallback`, `unsupported` and `retired` are those facts, generated from the release's own
registry (tools/vllm_registry.py). SGLang 0.5.23 builds the first listed name it registers too (models/registry.py
`resolve_model_cls`; its rules file's `registry`, the wheel's EntryClass lists); with none registered its Transformers
backend asks about EVERY listed name in order (model_loader/utils.py:108-191 `resolve_transformers_arch`), refusing at
the first one transformers lacks or whose class is not backend-compatible: the rules file's `transformers_backend`,
asked of that function itself (tools/sglang_backend.py), read as a `Backend`. A release with no such data (SGLang
0.5.9-0.5.11) is read as before: the first listed name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Mapping

from repair.errors import one_line

MAX_SHOWN = 120  # characters of a hostile name a message repeats


def shown(name: str) -> str:
    """A listed name as a message repeats it: cut, and escaped so that it cannot forge another output line."""
    return one_line(name[:MAX_SHOWN] + ("..." if len(name) > MAX_SHOWN else ""))


@dataclass(frozen=True)
class Registry:
    """The names one release's registry builds a class of, and what it does with any other."""

    names: frozenset[str]  # every name `resolve_model_cls` takes (text, multimodal, pooling, speculative, backend)
    fallback: frozenset[str]  # names not registered that its Transformers backend takes (the transformers beside it)
    unsupported: str | None  # its refusal, "{architectures}" standing for the listed names; None: not recorded
    retired: dict  # name -> its own refusal (the release that last served it, or the plugin that does)
    malformed: dict  # "list" | "string" -> what its config validation says of a non-list / a non-string entry
    label: str  # "vllm 0.32.0", as messages name the release
    source: str  # the profile file the facts come from
    suffixes: tuple = ()  # (suffix, runner, convert) in its order: an unregistered name's task suffix (_normalize_arch)
    backend: Backend | None = None  # its Transformers backend's gate name by name, where recorded (SGLang's)

    @classmethod
    def read(cls, doc: dict, label: str, source: str) -> Registry | None:
        names, fallback, text = doc.get("registry"), doc.get("transformers_fallback"), doc.get("unsupported")
        if not (isinstance(names, list) and isinstance(fallback, list) and isinstance(text, str)):
            return None
        return cls(frozenset(names), frozenset(fallback), text, dict(doc.get("retired") or {}),
                   dict(doc.get("malformed") or {}), label, source, tuple(tuple(s) for s in doc.get("suffixes", ())))

    @classmethod
    def named(cls, names: frozenset[str], label: str, source: str, backend: Backend | None = None) -> Registry | None:
        """The registered names (a rules file's `registry`) and, where recorded, its backend's gate; without that gate
        what the release does with none listed is not known."""
        return cls(names, frozenset(), None, {}, {}, label, source, backend=backend) if names else None

    def defaults(self, name: str, runner: str | None = None, convert: str | None = None) -> tuple[str, str, str] | None:
        """(suffix, runner, convert) of the first task suffix `name` ends with, of this runner and convert type where
        given (try_match_architecture_defaults)."""
        if not name.endswith(self.ends):  # one C call for most names: a hostile list of 10^6 must stay cheap
            return None
        return next((s for s in self.suffixes if name.endswith(s[0]) and runner in (None, s[1]) and convert in (None, s[2])),
                    None)

    @cached_property
    def ends(self) -> tuple[str, ...]:
        return tuple(s[0] for s in self.suffixes)

    @cached_property
    def stems(self) -> frozenset[str]:
        """Each registered name with a task suffix cut off: a name whose suffix, occurring once, leaves another stem
        normalizes to nothing."""
        return frozenset(n[:-len(e)] for n in self.names for e in self.ends if n.endswith(e))

    def task(self, names: tuple[str, ...]) -> tuple[str, str]:
        """(runner, convert) vLLM's ModelConfig reads from the listed names with --runner/--convert auto: the first
        name registered or with a task suffix (of that runner, for the convert type) sets each
        (_get_default_runner_type, _get_default_convert_type; a registered name's own runner is read from its suffix,
        "generate" without one)."""
        own = {a: (self.defaults(a) or ("", "generate"))[1] for a in names if a in self.names}
        runner = next((own[a] if a in own else d[1] for a in names if a in own or (d := self.defaults(a))), "generate")
        for a in names:
            if own.get(a) == runner:
                return runner, "none"
            if (d := self.defaults(a, runner)) is not None:
                return runner, d[2]
        return runner, "embed" if runner == "pooling" else "none"

    def normalized(self, name: str, runner: str | None = None, convert: str | None = None) -> str | None:
        """The registered name vLLM builds for an unregistered `name` with a task suffix (of this runner and convert
        type, where given): the suffix replaced by the first one, in its order, that gives a registered name
        (`_normalize_arch`); None when none does."""
        match = self.defaults(name, runner, convert)
        if match is None or (name.count(match[0]) == 1 and name[:-len(match[0])] not in self.stems):
            return None
        return next((base for s in self.suffixes if (base := name.replace(match[0], s[0])) in self.names), None)


@dataclass(frozen=True)
class Backend:
    """A release's Transformers-backend gate on listed names its registry lacks, as recorded from the gate itself:
    the names it takes, the ones it refuses (name -> its error, `{architecture}` standing for the name), its error for
    a name transformers lacks, and for such a name whose auto_map key (`AutoModel`) names code that does not load."""

    takes: frozenset[str]
    refuses: Mapping[str, str]
    missing: str
    auto_map: Mapping[str, str] = field(default_factory=dict)
    asks_each: bool = True  # every listed name is asked, in order (else only the first)
    skips: tuple[str, ...] = ()  # a name starting with one of these passes unasked (SGLang's "Transformers")
    unanswered: frozenset[str] = frozenset()  # classes that did not import where recorded: no refusal is claimed
    unlisted: Mapping[str, str | None] = field(default_factory=dict)  # form of an `architectures` naming nothing -> error

    @classmethod
    def read(cls, doc: object) -> Backend | None:
        """The rules file's `transformers_backend` block ({"takes", "refuses": {error: [names]}, "missing", "auto_map",
        "asks", "skips", "unanswered"}); None when absent or not of that form."""
        if not isinstance(doc, dict) or not isinstance(doc.get("takes"), list) or not isinstance(doc.get("missing"), str):
            return None
        refuses = {n: said for said, names in (doc.get("refuses") or {}).items() for n in names}
        return cls(frozenset(doc["takes"]), MappingProxyType(refuses), doc["missing"],
                   MappingProxyType(dict(doc.get("auto_map") or {})), doc.get("asks", "each") == "each",
                   tuple(doc.get("skips") or ()), frozenset(doc.get("unanswered") or ()),
                   MappingProxyType(dict(doc.get("unlisted") or {})))

    def refused_unlisted(self, config: dict | None) -> str | None:
        """Its error, where recorded, for an `architectures` whose first entry is no class name (absent, null, [], a
        mapping, "", a number, a string, whose characters it asks, or a first entry that is no string): SGLang reads
        `architectures[0]` as a string while loading the config (hf_transformers/common.py get_hf_text_config)."""
        listed = config.get("architectures", ...) if isinstance(config, dict) else "no config"
        if not isinstance(config, dict) or isinstance(listed, list) and listed and isinstance(listed[0], str):
            return None
        said = self.unlisted.get(unlisted_form(listed))
        kind = type(listed[0] if isinstance(listed, list) and listed else listed).__name__
        first = listed[:1] if isinstance(listed, str) else ""
        return said.replace("{first}", shown(first)).replace("{type}", kind) if said else None

    def verdict(self, names: tuple[str, ...], config: dict | None) -> Resolved:
        """What the gate does with `names` (none registered): the first refused name's error; for a name transformers
        lacks with a recorded auto_map key, the remote class decides (the error is what it says when that code does not
        load); else the backend builds the model."""
        keys = config.get("auto_map") if isinstance(config, dict) else None
        remote = next((said for key, said in self.auto_map.items() if isinstance(keys, dict) and key in keys), None)
        # resolve's names are the list's strings; the gate lowers every entry before asking any (_is_moe_model)
        other = [type(a).__name__ for a in config["architectures"] if not isinstance(a, str)][:1]
        if other and self.unlisted.get("entry_not_a_string"):
            return Resolved(None, error=self.unlisted["entry_not_a_string"].replace("{type}", other[0]))
        by_remote = None  # the first name auto_map's class answers for: the gate goes on to the names after it
        for name in names if self.asks_each else names[:1]:
            if name in self.refuses:
                return Resolved(None, error=self.refuses[name].replace("{architecture}", shown(name)))
            if name in self.takes or name in self.unanswered or name.startswith(self.skips):
                continue
            if remote is None:
                return Resolved(None, error=self.missing.replace("{architecture}", shown(name)))
            by_remote = by_remote or Resolved(names[0], "auto_map", remote.replace("{architecture}", shown(name)))
        return by_remote or Resolved(names[0], "transformers")


def unlisted_form(listed: object) -> str | None:
    """Which recorded form an `architectures` naming no class first is (`...`: the key is absent)."""
    if listed is ... or listed is None:
        return "absent" if listed is ... else "null"
    if isinstance(listed, str):
        return "string" if listed else "empty_string"
    if isinstance(listed, (dict, list)):
        return "mapping" if isinstance(listed, dict) else "not_a_string" if listed else "empty"
    return "number" if isinstance(listed, (int, float)) else None


@dataclass(frozen=True)
class Resolved:
    """What the release builds for a config: `name`, the listed name whose class it builds (None: no listed name);
    `backend`: "transformers" when that class is the Transformers backend's (the profile's rows do not describe it),
    "remote code" when it is so only under --trust-remote-code (config.json's auto_map), `error` then saying what it
    does without; "auto_map" when the class auto_map's code defines decides, `error` then saying what it does when
    that code does not load; `error`: the release's refusal when it builds nothing."""

    name: str | None
    backend: str = ""
    error: str | None = None
    malformed: bool = False  # refused as no list of names at all (its config validation), not for the names


def listed_names(config: dict | None) -> tuple[str, ...]:
    """config.json's `architectures` as a runtime reads it: a list's string entries (anything else names nothing)."""
    listed = (config or {}).get("architectures") if isinstance(config, dict) else None
    return tuple(a for a in listed if isinstance(a, str)) if isinstance(listed, list) else ()


def resolve(config: dict | None, registry: Registry | None) -> Resolved:
    """The listed name `registry`'s release builds (model_impl="auto", no --convert); without a registry the first
    listed name, as every reader did before the registry was recorded."""
    names = listed_names(config)
    bad = malformed(config, registry.malformed) if registry is not None else None
    if bad is None and registry is not None and registry.backend is not None:
        bad = registry.backend.refused_unlisted(config)
    if bad is not None:
        return Resolved(None, error=bad, malformed=True)
    if registry is None or not names:
        return Resolved(names[0] if names else None)
    runner, convert = registry.task(names)
    registered = any(a in registry.names for a in names)
    if not registered and registry.backend is not None:
        return registry.backend.verdict(names, config)
    if not registered and registry.unsupported is None:  # what it does then is not recorded: the first listed name
        return Resolved(names[0])
    if not registered and names[0] in registry.fallback and convert == "none":  # "after resolving convert_type"
        return Resolved(names[0], "transformers")
    # each name in order, a task suffix on a registered class (DbrxForSequenceClassification) being that class, converted
    base = next((b for a in names if (b := a if a in registry.names else registry.normalized(a, runner, convert))), None)
    if base is not None:
        return Resolved(base)
    if names[0] in registry.fallback:  # "before resolving runner_type": the Transformers backend after all
        return Resolved(names[0], "transformers")
    if remote_code(config):  # --trust-remote-code: the auto_map's class, through the same backend; refused without it
        return Resolved(names[0], "remote code", refusal(names, registry))
    return Resolved(None, error=refusal(names, registry))


def refusal(names: tuple[str, ...], registry: Registry) -> str:
    """`_raise_for_unsupported`'s words for these names: the first retired one's own message, else the release's."""
    retired = next((registry.retired[a] for a in names if a in registry.retired), None)
    if retired is not None:
        return f"ValueError: {retired}"
    listed = [a if len(a) <= MAX_SHOWN else a[:MAX_SHOWN] + "..." for a in names[:8]] + (["..."] if len(names) > 8 else [])
    return f"ValueError: {registry.unsupported.replace('{architectures}', one_line(str(listed)))}"


def remote_code(config: dict | None) -> bool:
    """config.json's auto_map names an AutoModel* class (`_try_resolve_transformers` loads it under --trust-remote-code)."""
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    return isinstance(auto_map, dict) and any(isinstance(k, str) and k.startswith("AutoModel") for k in auto_map)


def malformed(config: dict | None, said: dict) -> str | None:
    """The release's refusal of an `architectures` that is no list of strings (pydantic's, in vLLM's ModelConfig),
    where its profile records one; absent or null lists nothing (vLLM then names the class from model_type)."""
    listed = config.get("architectures") if isinstance(config, dict) else None
    if listed is None:
        return None
    if not isinstance(listed, list):
        return f"ValidationError: architectures: {said['list']} (got {type(listed).__name__})" if "list" in said else None
    index = next((i for i, a in enumerate(listed) if not isinstance(a, str)), None)
    if index is None or "string" not in said:
        return None
    return f"ValidationError: architectures.{index}: {said['string']} (got {type(listed[index]).__name__})"
