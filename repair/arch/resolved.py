"""What a runtime release builds for one config.json's `architectures` (arch/registry.py decides it), and how a
hostile listed name is shown in a message."""

from __future__ import annotations

from dataclasses import dataclass

from repair.errors import one_line

MAX_SHOWN = 120  # characters of a hostile name a message repeats


def shown(name: str) -> str:
    """A listed name as a message repeats it: cut, and escaped so that it cannot forge another output line."""
    return one_line(name[:MAX_SHOWN] + ("..." if len(name) > MAX_SHOWN else ""))


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
    derived: str | None = None  # none listed: the class the release named from model_type (then resolved as listed)
    runner: str | None = None  # and the runner it is built for ("pooling": an embedding or classifier model, no text)


@dataclass(frozen=True)
class FirstListed:
    """A release that asks its registry about config.json's FIRST listed name only, with no fallback (TensorRT-LLM's
    AutoModelForCausalLM: `architectures[0]` looked up in the table `@register_auto_model` fills; a later listed name
    is never asked), as tools/trtllm_registry.py reads it from the release's modeling_auto.py: its error
    (`{architecture}` standing for that name) and the name an EAGLE-3 draft's config is asked under (`renamed`:
    {"key", "prefix", "cut", "cut_when"}, when the release has that rule)."""

    unsupported: str
    renamed: tuple[tuple[str, str], ...] = ()  # the `renamed` block's items

    @classmethod
    def read(cls, doc: object) -> FirstListed | None:
        """A rules file's `registry_rule` ({"listed": "first", "unsupported", "renamed"})."""
        if not isinstance(doc, dict) or doc.get("listed") != "first" or not isinstance(doc.get("unsupported"), str):
            return None
        renamed = doc.get("renamed")
        return cls(doc["unsupported"], tuple(sorted(renamed.items())) if isinstance(renamed, dict) else ())

    def asked(self, name: str, config: dict | None) -> str:
        """The name the registry is asked under: the rule's text cut (from every name, or a draft's only), and a config
        carrying the rule's key (an EAGLE-3 draft's) asked with the prefix."""
        rule = dict(self.renamed)
        draft = "key" in rule and isinstance(config, dict) and rule["key"] in config
        if rule.get("cut") and (rule.get("cut_when") == "always" or draft):
            name = name.replace(rule["cut"], "")
        return rule["prefix"] + name if draft else name

    def verdict(self, names: tuple[str, ...], config: dict | None, registered: frozenset[str]) -> Resolved:
        """The first listed name built, or the release's error for it; a name after it changes nothing."""
        if self.asked(names[0], config) in registered:
            return Resolved(names[0])
        return Resolved(None, error=self.unsupported.replace("{architecture}", shown(names[0])))
