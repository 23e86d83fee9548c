"""A runtime release's Transformers-backend gate on listed names its registry lacks (SGLang 0.5.23's
model_loader/utils.py `resolve_transformers_arch`), as recorded from the gate itself (tools/sglang_backend.py: the rules
file's `transformers_backend`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from repair.arch.resolved import Resolved, shown


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
