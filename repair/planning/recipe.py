"""Recipes: a typed, immutable description of a repair, from code, from a file, or built in.

A recipe says which modules (exact names, globs, or `re:` regexes) get which action:
`dequantize` (packed -> BF16), `take_original` (BF16 copied from the original model),
`requantize` (NVFP4 packed afresh from the original, ModelOpt-exact), `drop` (remove the
module's tensors) or `keep` (leave alone, whatever else matches). A rule with `algorithm`
("FP8", "W4A16_NVFP4", ... or a list) matches only modules whose stored tensors show that
algorithm (StoredModule.algorithm); its `modules` default to every module. Recipe files are TOML
read with the standard library: loading one never runs code.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from importlib import resources
from pathlib import Path

from repair.arch.gemma4_assistant import BF16_HANDSHAKE
from repair.errors import UsageError, short
from repair.formats.algorithms import SINGLE_ALGOS
from repair.io.parse import parse_json, parse_toml, read_text
from repair.io.patterns import FULLMATCH, RegexSet


class Action(StrEnum):
    """A recipe rule's action; each is also the Recipe field holding its module patterns."""

    KEEP = "keep"
    DROP = "drop"
    REQUANTIZE = "requantize"
    TAKE_ORIGINAL = "take_original"
    DEQUANTIZE = "dequantize"


ACTIONS = tuple(Action)  # precedence when patterns overlap: declaration order


@dataclass(frozen=True)
class ModuleMatcher:
    """A rule's module patterns compiled once: exact names, globs (fnmatch, as one regex: its translation is
    linear-time) and `re:` patterns (full match, `repair.io.patterns`)."""

    exact: frozenset[str]
    globs: re.Pattern | None
    regexes: RegexSet

    def matches(self, name: str) -> bool:
        return name in self.exact or (self.globs is not None and self.globs.match(name) is not None) or self.regexes.matches(name)


def module_matcher(patterns: tuple[str, ...], where: str) -> ModuleMatcher:
    """Compile module patterns; a `re:` pattern Python refuses, or would hang on, is refused in one line."""
    globs = [p for p in patterns if not p.startswith("re:") and any(c in p for c in "*?[")]
    return ModuleMatcher(frozenset(p for p in patterns if not p.startswith("re:")),
                         re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs)) if globs else None,
                         RegexSet.compile([p[3:] for p in patterns if p.startswith("re:")], FULLMATCH, where, UsageError))


@dataclass(frozen=True)
class AlgorithmRule:
    """A rule that matches only modules whose stored algorithm is one of `algorithms`."""

    action: Action
    algorithms: tuple[str, ...]
    modules: tuple[str, ...] = ("*",)

    def as_dict(self) -> dict:
        algorithm = self.algorithms[0] if len(self.algorithms) == 1 else list(self.algorithms)
        return {"action": self.action.value, "modules": list(self.modules), "algorithm": algorithm}


@dataclass(frozen=True)
class Recipe:
    """What to do, module pattern by module pattern; `target` derives the actions from doctor."""

    name: str = "default"
    description: str = ""
    dequantize: tuple[str, ...] = BF16_HANDSHAKE
    take_original: tuple[str, ...] = ()
    requantize: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    target: str | None = None  # e.g. "vllm==0.25.0" or "bf16": adds what `doctor --target` needs
    dtype: str = "BF16"
    drop_quantization: bool = False  # write a plain checkpoint: no quantization_config, no hf_quant_config.json
    by_algorithm: tuple[AlgorithmRule, ...] = ()  # rules restricted to modules stored in given algorithms
    from_target: str | None = field(default=None, compare=False)  # set once `target` has been resolved
    # pattern list -> its ModuleMatcher: compiled once, and shared by the recipes `replace` derives from this one
    _matchers: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def matcher(self, patterns: tuple[str, ...], where: str = "module pattern") -> ModuleMatcher:
        found = self._matchers.get(patterns)
        if found is None:
            found = self._matchers[patterns] = module_matcher(patterns, where)
        return found

    def patterns(self, action: Action) -> tuple[str, ...]:
        return getattr(self, action)

    def as_dict(self) -> dict:
        """A JSON/TOML-ready form that `recipe_from_dict` reads back to an equal recipe."""
        out = {"name": self.name, "description": self.description, "dtype": self.dtype, "drop_quantization": self.drop_quantization}
        if self.target:
            out["target"] = self.target
        if self.from_target:
            out["resolved_from_target"] = self.from_target
        out["rules"] = [{"action": a.value, "modules": list(self.patterns(a))} for a in ACTIONS if self.patterns(a)]
        out["rules"] += [rule.as_dict() for rule in self.by_algorithm]
        return out

    def using_original(self) -> "Recipe":
        """With an original model at hand, every module turned BF16 is taken from it instead."""
        rules = tuple(replace(r, action=Action.TAKE_ORIGINAL) if r.action == Action.DEQUANTIZE else r for r in self.by_algorithm)
        return replace(self, take_original=self.take_original + self.dequantize, dequantize=(), by_algorithm=rules)

    def algorithm_rules(self, action: Action) -> tuple[AlgorithmRule, ...]:
        return tuple(r for r in self.by_algorithm if r.action == action)


DEFAULT = Recipe()


def recipe_from_dict(data: dict, where: str = "recipe") -> Recipe:
    """Validate a recipe mapping (from TOML or a report) and build the Recipe; errors name the key.

    A report's `resolved_from_target` is a claim, never trusted: it is read as the recipe's `target`, so the target's
    actions are derived again on the checkpoint at hand and its output checked like any `--target` run's."""
    if not isinstance(data, dict):
        raise UsageError(f"{where}: a recipe must be a table of keys")
    known = {"name", "description", "dtype", "drop_quantization", "target", "resolved_from_target", "rules"}
    for key in data:
        if key not in known:
            raise UsageError(f"{where}: unknown key {key!r}; recipe keys are {', '.join(sorted(known))}")
    values: dict = {a.value: () for a in ACTIONS}
    values["by_algorithm"] = ()
    rules = data.get("rules", [])
    if not isinstance(rules, list):
        raise UsageError(f"{where}: 'rules' must be a list of tables ([[rules]]), found {short(rules)}; write each rule as a [[rules]] table")
    checked = []
    for i, rule in enumerate(rules):
        action, modules, algorithms = _rule(rule, f"{where}: rules[{i}]")
        checked.append((modules, f"{where}: rules[{i}]: module pattern"))
        if algorithms:
            values["by_algorithm"] += (AlgorithmRule(Action(action), algorithms, modules),)
        else:
            values[action] = values[action] + modules
    for key, kind in (("name", str), ("description", str), ("dtype", str), ("target", str), ("drop_quantization", bool),
                      ("resolved_from_target", str)):
        if key in data:
            if not isinstance(data[key], kind):
                raise UsageError(f"{where}: {key!r} must be a {kind.__name__}, found {data[key]!r}")
            values["target" if key == "resolved_from_target" else key] = data[key]
    if "target" in data and "resolved_from_target" in data and data["target"] != data["resolved_from_target"]:
        raise UsageError(f"{where}: 'target' {data['target']!r} and 'resolved_from_target' {data['resolved_from_target']!r} differ; keep one")
    if values.get("dtype", "BF16").upper() not in ("BF16", "F16", "F32"):
        raise UsageError(f"{where}: 'dtype' must be bf16, f16 or f32, found {values['dtype']!r}")
    values["dtype"] = values.get("dtype", "BF16").upper()
    recipe = Recipe(**values)
    for modules, rule_where in checked:  # each rule's patterns compiled now (a bad one names its rule), and kept
        recipe.matcher(modules, rule_where)
    return recipe


def _rule(rule: object, where: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """A rule's action (as the Recipe field's name), its module patterns and its algorithms (empty: any)."""
    if not isinstance(rule, dict):
        raise UsageError(f"{where}: each rule must be a table with 'action' and 'modules'")
    extra = set(rule) - {"action", "modules", "algorithm"}
    if extra:
        raise UsageError(f"{where}: unknown key {sorted(extra)[0]!r}; a rule has 'action', 'modules' and optionally 'algorithm'")
    action = rule.get("action")
    if action not in ACTIONS:
        raise UsageError(f"{where}: 'action' must be one of {', '.join(ACTIONS)}, found {action!r}")
    algorithms = _algorithms(rule.get("algorithm"), where)
    modules = rule.get("modules", ["*"] if algorithms else None)
    if isinstance(modules, str):
        modules = [modules]
    if not (isinstance(modules, list) and modules and all(isinstance(m, str) and m for m in modules)):
        raise UsageError(f"{where}: 'modules' must be a non-empty list of names, globs or re: patterns")
    return action, tuple(modules), algorithms


def _algorithms(value: object, where: str) -> tuple[str, ...]:
    """A rule's `algorithm`: one name or a list, each a stored algorithm the tool reads (any case)."""
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if not (isinstance(names, list) and names):
        raise UsageError(f"{where}: 'algorithm' must be one of {', '.join(SINGLE_ALGOS)} or a list of them, found {short(value)}")
    for name in names:
        if not isinstance(name, str) or name.upper() not in SINGLE_ALGOS:
            raise UsageError(f"{where}: 'algorithm' {short(name)} is not a stored algorithm this tool knows; use one of {', '.join(SINGLE_ALGOS)}")
    return tuple(dict.fromkeys(n.upper() for n in names))


def load_recipe(path: Path) -> Recipe:
    """A recipe from a TOML file, a built-in name, or the `recipe` section of a repair_report.json."""
    builtin = _builtin_files().get(str(path))
    if builtin is not None and not Path(path).exists():
        return _from_toml(Path(f"recipes/{path}.toml"), builtin.read_text(encoding="utf-8"))
    path = Path(path)
    text = read_text(path, f"give a .toml file, a built-in name (see `ckpt-repair recipes`) or a repair_report.json", UsageError)
    if path.suffix == ".json":
        return _from_report(path, text)
    return _from_toml(path, text)


def _from_toml(path: Path, text: str) -> Recipe:
    data = parse_toml(text, path, "fix the recipe", UsageError)
    try:
        return recipe_from_dict(data, str(path))
    except UsageError as err:
        raise UsageError(_with_line(str(err), text)) from None


def _from_report(path: Path, text: str) -> Recipe:
    report = parse_json(text, path, "give a repair_report.json written by ckpt-repair", UsageError)
    section = report.get("recipe") if isinstance(report, dict) else None
    if section is None:
        raise UsageError(f"{path}: no 'recipe' section; give a repair_report.json written by ckpt-repair")
    return recipe_from_dict(section, f"{path}: recipe")


def _with_line(message: str, text: str) -> str:
    """Point at the line of the offending key, found by its text (tomllib reports no key lines)."""
    match = re.search(r"(?:unknown key|') ?'?([A-Za-z_][A-Za-z0-9_]*)'?", message.split(": ", 1)[-1])
    key = match.group(1) if match else None
    if key:
        for number, line in enumerate(text.splitlines(), 1):
            if re.match(rf"\s*{re.escape(key)}\s*=", line):
                path, rest = message.split(": ", 1)
                return f"{path}:{number}: {rest}"
    return message


def _builtin_files() -> dict:
    """Recipe files shipped as package data (the repo's recipes/ folder is the package repair.recipes)."""
    root = resources.files("repair.recipes")
    return {f.name.removesuffix(".toml"): f for f in root.iterdir() if f.name.endswith(".toml")}


def builtin_recipes() -> dict[str, Recipe]:
    """The built-in recipes by name."""
    return {name: load_recipe(name) for name in sorted(_builtin_files())}
