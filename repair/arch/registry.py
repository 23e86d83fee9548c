"""Which of config.json's `architectures` a runtime release builds: the one place that reads that list.

vLLM (0.28 to 0.32, the same `resolve_model_cls` in model_executor/models/registry.py) builds the first listed name
its registry has; only when none is registered does `model_impl="auto"` fall back to the Transformers backend, for the
FIRST name, when transformers has a model class of it that the backend takes (a name with a pooling or classify task
suffix first becomes the registered class with another suffix, converted: `_normalize_arch`; the runner and convert
type are read from the first listed name's suffix, which is vLLM's reading for one listed name); otherwise it
refuses the model. The
profile's `registry`, `transformers_fallback`, `unsupported` and `retired` are those facts, generated from the release's own
registry (tools/vllm_registry.py). SGLang 0.5.23 builds the first listed name it registers too (models/registry.py
`resolve_model_cls`); its rules file records only the names (`registry`, the wheel's EntryClass lists: the Transformers
fallback asks every listed name there, model_loader/utils.py `resolve_transformers_arch`, not recorded), so with none
registered it is read as before, as is a release with no such data: the first listed name.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    @classmethod
    def read(cls, doc: dict, label: str, source: str) -> Registry | None:
        names, fallback, text = doc.get("registry"), doc.get("transformers_fallback"), doc.get("unsupported")
        if not (isinstance(names, list) and isinstance(fallback, list) and isinstance(text, str)):
            return None
        return cls(frozenset(names), frozenset(fallback), text, dict(doc.get("retired") or {}),
                   dict(doc.get("malformed") or {}), label, source, tuple(tuple(s) for s in doc.get("suffixes", ())))

    @classmethod
    def named(cls, names: frozenset[str], label: str, source: str) -> Registry | None:
        """Only the registered names (a rules file's `registry`): what the release does with none listed is not known."""
        return cls(names, frozenset(), None, {}, {}, label, source) if names else None

    def defaults(self, name: str) -> tuple[str, str, str] | None:
        """(suffix, runner, convert) of the first task suffix `name` ends with (try_match_architecture_defaults)."""
        return next((s for s in self.suffixes if name.endswith(s[0])), None)

    def normalized(self, name: str) -> str | None:
        """The registered name vLLM builds for an unregistered `name` with a task suffix: the suffix replaced by the
        first one, in its order, that gives a registered name (`_normalize_arch`); None when none does."""
        match = self.defaults(name)
        if match is None:
            return None
        return next((base for s in self.suffixes if (base := name.replace(match[0], s[0])) in self.names), None)


@dataclass(frozen=True)
class Resolved:
    """What the release builds for a config: `name`, the listed name whose class it builds (None: no listed name);
    `backend`: "transformers" when that class is the Transformers backend's (the profile's rows do not describe it),
    "remote code" when it is so only under --trust-remote-code (config.json's auto_map), `error` then saying what it
    does without; `error`: the release's refusal when it builds nothing."""

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
    if bad is not None:
        return Resolved(None, error=bad, malformed=True)
    if registry is None or not names:
        return Resolved(names[0] if names else None)
    found = next((a for a in names if a in registry.names), None)
    if found is not None:
        return Resolved(found)
    if registry.unsupported is None:  # what it does then is not recorded: the first listed name, as before
        return Resolved(names[0])
    first = registry.defaults(names[0])
    if names[0] in registry.fallback and (first is None or first[2] == "none"):  # before resolving convert_type
        return Resolved(names[0], "transformers")
    base = next((b for a in names if (b := registry.normalized(a)) is not None), None)
    if base is not None:  # a task suffix on a registered class (DbrxForSequenceClassification): that class, converted
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
