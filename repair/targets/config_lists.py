"""Where the exclusion lists a runtime reads live in the config files, and what SGLang's ModelOpt reader takes from
config.json's quantization_config: the list a hostile entry came from is named in its refusal, and a list written
null is SGLang's config-time error (its data's `null_exclusions_refused`)."""

from __future__ import annotations

from typing import Callable

from repair.errors import BadInput

FLAT_KEYS = ("ignore", "modules_to_not_convert", "exclude_modules")  # SGLang's flat ModelOpt branch, in its order
# characters some runtime reads as pattern syntax in a plain exclusion entry: SGLang's is_layer_excluded escapes only
# `.` and turns `*` into `.*` before re.fullmatch (a regex); vLLM's ModelOpt rule and TensorRT-LLM fnmatch (`*?[`)
PATTERN_CHARS = frozenset("*?[]()+{}^$|\\")


def pattern_syntax(name: str) -> str | None:
    """What in a module's name some runtime reads as pattern syntax when an exclusion entry is written as that name
    (its first such character, or a leading `re:`, a regex to TensorRT-LLM >= 1.3); None: the name is a plain entry."""
    if name.startswith("re:"):
        return "re:"
    found = sorted(PATTERN_CHARS.intersection(name))
    return found[0] if found else None


def flat_exclusions(config: dict | None) -> tuple[str, ...] | None:
    """For config.json's ModelOpt quantization_config in the nested form (`{"producer", "quantization": {...}}`), the
    list SGLang's flat branch reads at its top level instead (configs/model_config.py merges the nested quant_algo in
    there, over one already at the top level, so the flat branch is taken either way;
    ModelOptFp4Config.from_config: `ignore`, else `modules_to_not_convert`, else `exclude_modules`); None for any
    other form."""
    qc = (config or {}).get("quantization_config")
    if not (isinstance(qc, dict) and isinstance(qc.get("quantization"), dict)
            and qc.get("quant_method", "modelopt") == "modelopt"):
        return None
    listed = next((qc[k] for k in FLAT_KEYS if k in qc), [])
    return tuple(e for e in listed if isinstance(e, str)) if isinstance(listed, list) else ()


def null_exclusion_list(config: dict | None, hf_quant: dict | None) -> str | None:
    """Where the exclusion list SGLang's ModelOpt config reads is present but null (None: it is not): config.json's
    ModelOpt quantization_config, nested form or flat, at its top level (the first of FLAT_KEYS present); without
    one, hf_quant_config.json's quantization.exclude_modules (from_config's nested branch)."""
    qc = (config or {}).get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method", "modelopt") == "modelopt":
        key = next((k for k in FLAT_KEYS if k in qc), None)
        return f"config.json quantization_config.{key}" if key is not None and qc[key] is None else None
    section = (hf_quant or {}).get("quantization")
    if qc is None and isinstance(section, dict) and "exclude_modules" in section and section["exclude_modules"] is None:
        return "hf_quant_config.json quantization.exclude_modules"
    return None


def null_list_vllm_reads(config: dict | None, hf_quant: dict | None) -> str | None:
    """Where the exclusion list vLLM's ModelOpt config reads is present but null (None: it is not): config.json's
    ModelOpt quantization_config, `quantization.exclude_modules` when it holds that block, else `ignore` (modelopt.py
    from_config; its other keys are not read); without one, hf_quant_config.json's quantization.exclude_modules."""
    qc = (config or {}).get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method", "modelopt") == "modelopt":
        nested = qc.get("quantization")
        section, key, where = (nested, "exclude_modules", "quantization.exclude_modules") if isinstance(nested, dict) else (qc, "ignore", "ignore")
        return f"config.json quantization_config.{where}" if key in section and section[key] is None else None
    return null_exclusion_list(None, hf_quant) if qc is None else None


def list_sources(declaration, config: dict | None, flat: tuple[str, ...] | None) -> dict[tuple[str, ...], str]:
    """Each exclusion list a target may read (as entries) -> the file and key it is written under."""
    qc = (config or {}).get("quantization_config")
    nested = isinstance(qc, dict) and isinstance(qc.get("quantization"), dict)
    top = next((k for k in FLAT_KEYS if isinstance(qc, dict) and k in qc), "ignore")
    found: dict[tuple[str, ...], list[str]] = {}
    for entries, where in ((declaration.ignore, "config.json quantization_config." + ("quantization.exclude_modules" if nested else "ignore")),
                           (declaration.exclude_modules, "hf_quant_config.json quantization.exclude_modules"),
                           (flat, f"config.json quantization_config.{top}")):
        if entries is not None and where not in found.setdefault(tuple(entries), []):
            found[tuple(entries)].append(where)
    return {entries: " and ".join(places) for entries, places in found.items()}


def source_named(compile: Callable, sources: dict[tuple[str, ...], str]) -> Callable:
    """`compile(entries, targets, building)` whose one-line refusal of a hostile entry (a regex Python would hang on)
    starts with the file and list the entries came from: the list itself, or (an entry asked alone, the unused-entry
    question) every list holding them all."""
    def named(entries, targets, building):
        try:
            return compile(entries, targets, building)
        except BadInput as exc:
            asked = tuple(entries or ())
            where = sources.get(asked) or " and ".join(w for listed, w in sources.items() if set(asked) <= set(listed))
            if not where:
                raise
            raise BadInput(f"{where}: {exc}") from None
    return named
