"""`re:` patterns from checkpoints, recipes, reports and flags: compiled once per list, matched in bounded time,
with exactly the results of Python's re (`re.match` or `re.fullmatch`, as the consumer of the pattern calls it).

Each pattern is parsed by Python's own parser, so what Python refuses is refused (one line, `where` first), and
checked by `regex_safety`: a pattern Python's backtracking would blow up on is refused too. The rest are matched:

- fully literal patterns (`model\\.layers\\.0\\.mlp`) by set lookup;
- patterns RE2 can express: translated from Python's parse tree into one RE2 alternation (google-re2, linear
  time), exact on the names RE2 is given: non-empty ASCII without a newline, where Python's Unicode classes,
  case folding, `$` and `\\B` agree with the translation. A name outside that goes to Python's re;
- the others (backreferences, lookarounds, atomic groups): Python's re, on patterns the check proved at most
  quadratic in the name's length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from re import _compiler, _constants as C, _parser

import re2

from repair.errors import BadInput, RepairError, short
from repair.io.regex_safety import backtracking_problem

MATCH, FULLMATCH = "match", "fullmatch"  # compressed-tensors' entries (vLLM, transformers): re.match; recipes: re.fullmatch
ErrorType = type[RepairError]
_LITERAL = re.compile(r"(?:[A-Za-z0-9_\-/:,;=<>@#%&~'\"` ]|\\[.\-_/:#&~])+")
_ASCII = (1 << 128) - 1
_IGNORECASE, _DOTALL, _ASCII_FLAG = int(re.IGNORECASE), int(re.DOTALL), int(re.ASCII)
CHUNK = 64  # patterns per RE2 program
_CLASS_ESCAPES = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W",
                  C.CATEGORY_SPACE: r"\s", C.CATEGORY_NOT_SPACE: r"\S"}
# Each class escape's ASCII members as Python's re decides them (Unicode and re.ASCII rules): a constant table
_CLASS_MASKS = {(cat, a): sum(1 << c for c in range(128) if re.fullmatch(e, chr(c), a)) for cat, e in _CLASS_ESCAPES.items()
                for a in (0, int(re.ASCII))}
_AT = {C.AT_BEGINNING: r"\A", C.AT_BEGINNING_STRING: r"\A", C.AT_END: r"\z", C.AT_END_STRING: r"\z", C.AT_BOUNDARY: r"\b",
       C.AT_NON_BOUNDARY: r"\B"}  # on a non-empty ASCII name without a newline


class Inexpressible(Exception):
    """The pattern uses what RE2 cannot express exactly: Python's re matches it."""


@dataclass(frozen=True)
class RegexSet:
    """A list of regular expressions, any of which may match a name (`matches`), compiled once."""

    patterns: tuple[str, ...]
    mode: str
    literals: frozenset[str]
    literal_lengths: tuple[int, ...]
    engines: dict[str, tuple]  # literal prefix -> RE2 regexes (bytes) over the translated patterns that start with it
    prefix_lengths: tuple[int, ...]
    inner: dict[str, tuple]  # literal every match holds (not at its start) -> RE2 regexes over those patterns
    inner_lengths: tuple[int, ...]
    python: tuple[re.Pattern, ...]  # the patterns RE2 cannot express, by Python's re
    parsed: tuple[tuple[str, object], ...]  # (pattern, parse tree) of every non-literal pattern, for unusual names
    _slow: dict = field(default_factory=dict, compare=False, hash=False, repr=False)  # Python regexes built on demand

    @classmethod
    def compile(cls, patterns, mode: str, where: object, error: ErrorType = BadInput) -> "RegexSet":
        """Parse, check and compile `patterns` (without their `re:` prefix); a bad one is refused with one line."""
        patterns = tuple(dict.fromkeys(patterns))
        literals, parsed, translated, inside, python = set(), [], {}, {}, []
        for pattern in patterns:
            if _LITERAL.fullmatch(pattern):
                literals.add(re.sub(r"\\(.)", r"\1", pattern))
                continue
            tree = _checked(pattern, where, error)
            parsed.append((pattern, tree))
            try:
                prefix, held = _required(tree)
                (translated.setdefault(prefix, []) if prefix or not held else inside.setdefault(held, [])).append((re2_syntax(tree), tree))
            except Inexpressible:
                python.append(_python(pattern, tree, where, error))
        engines, inner = _programs(translated, python), _programs(inside, python)
        return cls(patterns, mode, frozenset(literals), tuple(sorted({len(x) for x in literals})), engines,
                   tuple(sorted({len(x) for x in engines})), inner, tuple(sorted({len(x) for x in inner})), tuple(python), tuple(parsed))

    def matches(self, name: str) -> bool:
        """Whether any pattern matches `name` as Python's re.match (MATCH) or re.fullmatch (FULLMATCH) would."""
        if self.mode == FULLMATCH and name in self.literals or \
                self.mode == MATCH and any(name[:n] in self.literals for n in self.literal_lengths if n <= len(name)):
            return True
        if re2_exact(name):
            text = name.encode()
            for n in self.prefix_lengths:
                for engine in self.engines.get(name[:n], ()) if n <= len(name) else ():
                    if (engine.fullmatch if self.mode == FULLMATCH else engine.match)(text):
                        return True
            held = {name[i:i + n] for n in self.inner_lengths for i in range(len(name) - n + 1)}
            for key in held & self.inner.keys():
                for engine in self.inner[key]:
                    if (engine.fullmatch if self.mode == FULLMATCH else engine.match)(text):
                        return True
            return any(self._run(p, name) for p in self.python)
        return any(self._run(self._slow_pattern(pattern, tree), name) for pattern, tree in self.parsed)

    def _run(self, compiled: re.Pattern, name: str) -> bool:
        return (compiled.fullmatch if self.mode == FULLMATCH else compiled.match)(name) is not None

    def _slow_pattern(self, pattern: str, tree) -> re.Pattern:
        found = self._slow.get(pattern)
        if found is None:
            found = self._slow[pattern] = _compiler.compile(tree)
        return found


def re2_exact(name: str) -> bool:
    """Whether `name` is one the RE2 translation decides exactly as Python's re: non-empty ASCII without a newline."""
    return bool(name) and name.isascii() and "\n" not in name


def _checked(pattern: str, where: object, error: ErrorType):
    """Python's parse tree of `pattern`, or one line saying why Python refuses it or would hang on it."""
    try:
        tree = _parser.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        raise error(f"{where}: {short(pattern)} is not a valid regular expression ({_first_clause(exc)}); fix the pattern") from None
    try:
        problem = backtracking_problem(tree)
    except RecursionError:
        problem = "its nesting is too deep to check"
    if problem:
        raise error(f"{where}: {short(pattern)} would backtrack catastrophically ({problem}); Python's re, which the runtimes "
                    "match such patterns with, would hang on it too; rewrite it without nested or overlapping repetition")
    return tree


def _python(pattern: str, tree, where: object, error: ErrorType) -> re.Pattern:
    """Python's compiled regex from its parse tree (a few errors, e.g. a variable-width look-behind, show only here)."""
    try:
        return _compiler.compile(tree)
    except (re.error, RecursionError, OverflowError, ValueError, RuntimeError) as exc:
        raise error(f"{where}: {short(pattern)} is not a valid regular expression ({_first_clause(exc)}); fix the pattern") from None


def _required(tree) -> tuple[str, str]:
    """(the literal text every match starts with, the longest literal every match holds), for case-sensitive
    patterns: patterns are grouped by them, so a name is tried only against the groups its own text selects."""
    if int(tree.state.flags) & _IGNORECASE:
        return "", ""
    runs, run = [], []
    for op, av in tree:
        if op == C.LITERAL and av < 128:
            run.append(chr(av))
            continue
        runs.append("".join(run))
        run = []
    runs.append("".join(run))
    return runs[0], max(runs, key=len)


def _programs(groups: dict[str, list[tuple[str, object]]], python: list[re.Pattern]) -> dict[str, tuple]:
    """RE2 programs of up to CHUNK patterns per group; a pattern RE2 refuses after all (its program too large)
    joins `python`, Python's re (it passed the backtracking check)."""
    out = {}
    for key, group in groups.items():
        programs = []
        for i in range(0, len(group), CHUNK):
            try:
                programs.append(_re2([text for text, _ in group[i:i + CHUNK]]))
            except re2.error:
                for text, tree in group[i:i + CHUNK]:
                    try:
                        programs.append(_re2([text]))
                    except re2.error:
                        python.append(_compiler.compile(tree))
        out[key] = tuple(programs)
    return out


def _re2(translated: list[str]):
    """One RE2 program for a group of translated patterns: small enough that its DFA stays in memory."""
    options = re2.Options()
    options.log_errors = False
    return re2._Regexp("|".join(f"(?:{t})" for t in translated).encode("ascii"), options)  # not re2.compile's cache


def re2_syntax(node, flags: int | None = None) -> str:
    """RE2 syntax equivalent to Python's parse tree on a non-empty ASCII name without a newline."""
    flags = int(node.state.flags) if flags is None else flags
    return "".join(_translate_item(op, av, flags) for op, av in node)


def _translate_item(op, av, flags: int) -> str:
    if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
        return _ascii_class(_char_mask(op, av, flags))
    if op == C.SUBPATTERN:
        return f"(?:{_translate_items(av[3], (flags | int(av[1])) & ~int(av[2]))})"
    if op == C.BRANCH:
        return "(?:" + "|".join(_translate_items(b, flags) for b in av[1]) + ")"
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):
        low, high, body = av
        if low > 1000 or (high != C.MAXREPEAT and high > 1000):
            raise Inexpressible
        return f"(?:{_translate_items(body, flags)}){{{low},{'' if high == C.MAXREPEAT else high}}}"
    if op == C.AT and av in _AT:
        return _AT[av]
    raise Inexpressible  # backreferences, lookarounds, conditionals, atomic groups, possessive repeats


def _translate_items(items, flags: int) -> str:
    return "".join(_translate_item(op, av, flags) for op, av in items)


def _char_mask(op, av, flags: int) -> int:
    """The ASCII characters one character item matches, exactly as Python's re decides (flags included)."""
    if op == C.LITERAL and not flags & _IGNORECASE:
        return 1 << av if av < 128 else 0
    if flags & _IGNORECASE:  # Python's case folding (the Kelvin sign, the long s): asked of Python's re itself
        single = _compiler.compile(_parser.SubPattern(_parser.State(), [(op, av)]), flags)
        return sum(1 << c for c in range(128) if single.fullmatch(chr(c)))
    if op == C.LITERAL:
        return 1 << av if av < 128 else 0
    if op == C.NOT_LITERAL:
        return _ASCII & ~(1 << av if av < 128 else 0)
    if op == C.ANY:
        return _ASCII if flags & _DOTALL else _ASCII & ~(1 << 10)
    mask, negate = 0, False
    for sub_op, sub_av in av:
        if sub_op == C.NEGATE:
            negate = True
        elif sub_op == C.LITERAL:
            mask |= 1 << sub_av if sub_av < 128 else 0
        elif sub_op == C.RANGE:
            low, high = sub_av[0], min(sub_av[1], 127)
            mask |= ((1 << (high + 1)) - (1 << low)) if low <= high else 0
        elif sub_op == C.CATEGORY and (sub_av, flags & _ASCII_FLAG) in _CLASS_MASKS:
            mask |= _CLASS_MASKS[sub_av, flags & _ASCII_FLAG]
        else:
            raise Inexpressible
    return _ASCII & ~mask if negate else mask


def _ascii_class(mask: int) -> str:
    if not mask:
        return r"[^\x00-\x{10ffff}]"  # matches nothing
    if mask & (mask - 1) == 0:
        return f"\\x{mask.bit_length() - 1:02x}"
    runs, c = [], 0
    while c < 128:
        if mask >> c & 1:
            end = c
            while end + 1 < 128 and mask >> (end + 1) & 1:
                end += 1
            runs.append(f"\\x{c:02x}" if end == c else f"\\x{c:02x}-\\x{end:02x}")
            c = end
        c += 1
    return "[" + "".join(runs) + "]"


def _first_clause(exc: Exception) -> str:
    return str(exc).split(";")[0].strip()[:120]
