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
asked of that function itself (tools/sglang_backend.py), read as a `Backend`. Before its registry is asked, SGLang's
own config class may write another name over a one-name list, or one where config.json has none (its
`registry_renamed`, tools/sglang_registry_renames.py: DeepSeek-V4.1's `DeepseekV41ForCausalLM` is built as
`DeepseekV4ForCausalLM`; Olmo3Config writes `Olmo2ForCausalLM` where none is listed). A release with no such data
(SGLang 0.5.9-0.5.11) is read as before: the first listed name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Iterable, Mapping

from repair.arch.backend import Backend
from repair.arch.resolved import MAX_SHOWN, FirstListed, Resolved, shown
from repair.errors import one_line

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
    unlisted: Mapping[str, str] = field(default_factory=dict)  # model_type -> the class named when none is listed (get_config)
    unlisted_refused: str | None = None  # its refusal of a list still empty then; None: what it does is not recorded
    backend: Backend | None = None  # its Transformers backend's gate name by name, where recorded (SGLang's)
    first: FirstListed | None = None  # it asks only the first listed name (TensorRT-LLM's), where recorded
    # model_type -> {a one-name `architectures`: the name its config class writes instead} (SGLang's registry_renamed)
    renamed: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def read(cls, doc: dict, label: str, source: str) -> Registry | None:
        names, fallback, text = doc.get("registry"), doc.get("transformers_fallback"), doc.get("unsupported")
        if not (isinstance(names, list) and isinstance(fallback, list) and isinstance(text, str)):
            return None
        unlisted = doc.get("unlisted") if isinstance(doc.get("unlisted"), dict) else {}
        return cls(frozenset(names), frozenset(fallback), text, dict(doc.get("retired") or {}),
                   dict(doc.get("malformed") or {}), label, source, tuple(tuple(s) for s in doc.get("suffixes", ())),
                   MappingProxyType(dict(unlisted.get("classes") or {})), unlisted.get("refused"))

    @classmethod
    def named(cls, names: frozenset[str], label: str, source: str, backend: Backend | None = None,
              first: FirstListed | None = None, renamed: Mapping | None = None) -> Registry | None:
        """The registered names (a rules file's `registry`) and, where recorded, its backend's gate, its first-name
        rule or its config classes' renames; without either what the release does with none listed is not known."""
        return cls(names, frozenset(), None, {}, {}, label, source, backend=backend, first=first,
                   renamed=MappingProxyType(dict(renamed or {}))) if names else None

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
        "generate" without one). Each walk stops at that name: a list of 10^5 unknown names costs one pass."""
        own = {a: (self.defaults(a) or ("", "generate"))[1] for a in self.names.intersection(names)}
        ends = self.ends
        first = next((a for a in names if a in own or a.endswith(ends)), None)
        runner = own[first] if first in own else self.defaults(first)[1] if first is not None else "generate"
        ends = self.ends_of(runner)
        for a in names:
            if own.get(a) == runner:
                return runner, "none"
            if a.endswith(ends) and (d := self.defaults(a, runner)) is not None:
                return runner, d[2]
        return runner, "embed" if runner == "pooling" else "none"

    def generative(self, name: str) -> str | None:
        """The registered text-generation class of `name`'s stem (DbrxModel, DbrxForCausalLM -> DbrxForCausalLM)."""
        match = self.defaults(name)
        stem = name[:-len(match[0])] if match else name
        return next((stem + s for s, runner, _ in self.suffixes if runner == "generate" and stem + s in self.names), None)

    def ends_of(self, runner: str, convert: str | None = None) -> tuple[str, ...]:
        """The task suffixes of this runner (and convert type, where given)."""
        return tuple(s[0] for s in self.suffixes if s[1] == runner and convert in (None, s[2]))

    @cached_property
    def normalizable(self) -> frozenset[str]:
        """Every name a task suffix occurring once normalizes to a registered one from: a stem and any suffix (no
        registered name holds a suffix twice, `doubled`, so a name holding its suffix twice normalizes to none)."""
        return frozenset(stem + e for stem in self.stems for e in self.ends)

    @cached_property
    def doubled(self) -> bool:
        """Some registered name holds a task suffix twice: only then can `name.replace` give it from a name that does."""
        return any(n.count(e) > 1 for n in self.names for e in self.ends)

    def normalized(self, name: str, runner: str | None = None, convert: str | None = None) -> str | None:
        """The registered name vLLM builds for an unregistered `name` with a task suffix (of this runner and convert
        type, where given): the suffix replaced by the first one, in its order, that gives a registered name
        (`_normalize_arch`); None when none does."""
        match = self.defaults(name, runner, convert)
        if match is None or (name.count(match[0]) == 1 and name[:-len(match[0])] not in self.stems):
            return None
        return next((base for s in self.suffixes if (base := name.replace(match[0], s[0])) in self.names), None)


def listed_names(config: dict | None) -> tuple[str, ...]:
    """config.json's `architectures` as a runtime reads it: a list's string entries (anything else names nothing)."""
    listed = (config or {}).get("architectures") if isinstance(config, dict) else None
    if not isinstance(listed, list):
        return ()
    if set(map(type, listed)) <= {str}:  # one C pass: a hostile list of 10^5 names is read at C speed
        return tuple(listed)
    return tuple(a for a in listed if isinstance(a, str))


def resolve(config: dict | None, registry: Registry | None, names: tuple[str, ...] | None = None) -> Resolved:
    """The listed name `registry`'s release builds (model_impl="auto", no --convert); without a registry the first
    listed name, as every reader did before the registry was recorded. `names`: listed_names(config), when read."""
    names = listed_names(config) if names is None else names
    unlisted = not names and isinstance(config, dict) and "architectures" not in config  # its config class may write one
    if registry is not None and registry.renamed and (len(names) == 1 or unlisted) and isinstance(config, dict):
        model_type = config.get("model_type")  # its config class writes another name over a one-name list
        rule = registry.renamed.get(model_type) if isinstance(model_type, str) else None
        said = "" if unlisted else names[0] or None  # a listed name "" is no absent list
        names = (rule[said],) if isinstance(rule, Mapping) and said in rule else names
        config = dict(config, architectures=list(names)) if unlisted and names else config  # the list SGLang then reads
    bad = malformed(config, registry.malformed, names) if registry is not None else None
    if bad is None and registry is not None and registry.backend is not None:
        bad = registry.backend.refused_unlisted(config)
    if bad is not None:
        return Resolved(None, error=bad, malformed=True)
    if registry is None or (not names and registry.unlisted_refused is None):
        return Resolved(names[0] if names else None)
    if not names:
        return from_model_type(config, registry)
    if registry.first is not None:
        return registry.first.verdict(names, config, registry.names)
    runner, convert = registry.task(names)
    registered = not registry.names.isdisjoint(names)
    if not registered and registry.backend is not None:
        return registry.backend.verdict(names, config)
    if not registered and registry.unsupported is None:  # what it does then is not recorded: the first listed name
        return Resolved(names[0])
    if not registered and names[0] in registry.fallback and convert == "none":  # "after resolving convert_type"
        return Resolved(names[0], "transformers")
    base = first_built(names, registry, runner, convert)
    if base is not None:
        return Resolved(base)
    if names[0] in registry.fallback:  # "before resolving runner_type": the Transformers backend after all
        return Resolved(names[0], "transformers")
    if remote_code(config):  # --trust-remote-code: the auto_map's class, through the same backend; refused without it
        return Resolved(names[0], "remote code", refusal(names, registry))
    return Resolved(None, error=refusal(names, registry))


def from_model_type(config: dict | None, registry: Registry) -> Resolved:
    """None listed (absent, null, []): vLLM's get_config lists transformers' base class of the model_type
    (transformers_utils/config.py, MODEL_MAPPING_NAMES), which the registry resolves as a listed one (a base `Model`
    class: its causal LM converted to a pooling model); a model_type mapped to none stays unlisted and is refused."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    derived = registry.unlisted.get(model_type) if isinstance(model_type, str) else None
    if derived is None:
        return Resolved(None, error=f"ValueError: {registry.unlisted_refused}")
    found = resolve(config, registry, (derived,))
    return replace(found, derived=derived, runner=registry.task((derived,))[0])


def first_built(names: tuple[str, ...], registry: Registry, runner: str, convert: str) -> str | None:
    """The class of the first listed name the release builds: a registered one, or one whose task suffix replaced
    gives a registered class, built converted. Only a name that could normalize (`normalizable`) is normalized, each
    distinct name once (a hostile list repeating one is answered the same each time)."""
    maybe, every, asked = registry.normalizable, registry.doubled, set()
    for a in names:
        if a in registry.names:
            return a
        if (every or a in maybe) and a not in asked:
            asked.add(a)
            if (base := registry.normalized(a, runner, convert)) is not None:
                return base
    return None


@dataclass(frozen=True)
class Builds:
    """Which listed name each release builds for one config.json: read once per config and per registry, then
    passed along (a config listing 200,000 names is read a few times per run, not once per question asked of it)."""

    listed: tuple[str, ...]  # config.json's `architectures` as a runtime reads it (listed_names)
    verdicts: Mapping[str, Resolved]  # Registry.source -> what that release builds
    unrecorded: Resolved  # a release whose registry is not recorded: the first listed name

    @classmethod
    def read(cls, config: dict | None, registries: Iterable[Registry]) -> Builds:
        names = listed_names(config)
        verdicts = {r.source: resolve(config, r, names) for r in registries}
        return cls(names, MappingProxyType(verdicts), resolve(config, None, names))

    def of(self, registry: Registry | None) -> Resolved:
        """What `registry`'s release builds (one of the registries this was read with), None: not recorded."""
        return self.unrecorded if registry is None else self.verdicts[registry.source]


def refusal(names: tuple[str, ...], registry: Registry) -> str:
    """`_raise_for_unsupported`'s words for these names: the first retired one's own message, else the release's."""
    retired = None if registry.retired.keys().isdisjoint(names) else next(registry.retired[a] for a in names if a in registry.retired)
    if retired is not None:
        return f"ValueError: {retired}"
    listed = [a if len(a) <= MAX_SHOWN else a[:MAX_SHOWN] + "..." for a in names[:8]] + (["..."] if len(names) > 8 else [])
    return f"ValueError: {registry.unsupported.replace('{architectures}', one_line(str(listed)))}"


def remote_code(config: dict | None) -> bool:
    """config.json's auto_map names an AutoModel* class (`_try_resolve_transformers` loads it under --trust-remote-code)."""
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    return isinstance(auto_map, dict) and any(isinstance(k, str) and k.startswith("AutoModel") for k in auto_map)


def malformed(config: dict | None, said: dict, names: tuple[str, ...] | None = None) -> str | None:
    """The release's refusal of an `architectures` that is no list of strings (pydantic's, in vLLM's ModelConfig),
    where its profile records one; absent or null lists nothing (vLLM then names the class from model_type).
    `names`: listed_names(config), when read (as many as listed: every entry a string)."""
    listed = config.get("architectures") if isinstance(config, dict) else None
    if listed is None:
        return None
    if not isinstance(listed, list):
        return f"ValidationError: architectures: {said['list']} (got {type(listed).__name__})" if "list" in said else None
    if len(listed_names(config) if names is None else names) == len(listed):
        return None
    index = next((i for i, a in enumerate(listed) if not isinstance(a, str)), None)
    if index is None or "string" not in said:
        return None
    return f"ValidationError: architectures.{index}: {said['string']} (got {type(listed[index]).__name__})"
