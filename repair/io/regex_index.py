"""Many patterns against many names in one pass over the names: whether any pattern matches a name (`matches`), and
which patterns match at least one of a list of names (`used`), never every pattern tried on every name.

doctor asks both of every module of a checkpoint: is it excluded (some entry matches it), and which exclusion
entries match no module at all (unused-exclusion). ModelOpt 0.23 lists 489 exact names for DeepSeek-R1's 45k
modules; trying each entry on each name took a minute.

Each pattern (an "owner": an exclusion entry, a `re:` pattern) has one or more alternatives, Python parse trees
matched as Python's `re.match` (MATCH) or `re.fullmatch` (FULLMATCH) would. They are translated into RE2 sets
(patterns.re2_syntax: exact on non-empty ASCII names without a newline) and run as one automaton per set; a name
outside that domain, and an alternative RE2 cannot express, gets the alternative's own Python test. RE2's sets
have no NFA to fall back to, so their compiler runs the DFA once and refuses the set when its memory would not
do (google/re2 re2/compile.cc, Compiler::CompileSet); a refused set is split, down to single alternatives, and
an alternative no set takes goes to Python.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from functools import partial
from re import _compiler, _constants as C, _parser
from typing import Callable, Iterable

import re2

from repair.io.patterns import FULLMATCH, MATCH, Inexpressible, RegexSet, re2_exact, re2_syntax

SEARCH = "search"  # re.search: literal substrings (an RE2 set that is unanchored shares one leading `.*` among them)
SET_SIZE = 256  # anchored alternatives per RE2 set (each holds its own automaton thread in every DFA state)
SET_MEMORY = 64 << 20  # an RE2 set's memory bound (its DFA's state cache; filled only as the names need states)
LONGEST = 1024  # a longer pattern goes to Python's re alone: RE2 compiles a megabyte-long one for minutes, logging
Test = Callable[[str], bool]
_ANCHORS = {SEARCH: re2._Anchor.UNANCHORED, MATCH: re2._Anchor.ANCHOR_START, FULLMATCH: re2._Anchor.ANCHOR_BOTH}


@dataclass(frozen=True)
class Alternative:
    """One way `owner` matches a name: as `mode` runs RE2 syntax `re2` (None: RE2 cannot take it), and a factory of
    the Python test deciding names the RE2 syntax is not exact on (built only when a name needs it)."""

    owner: int
    mode: str  # SEARCH, MATCH or FULLMATCH
    re2: bytes | None
    python: Callable[[], Test]


@dataclass(frozen=True)
class PatternIndex:
    """Alternatives of `owners` patterns, compiled into RE2 sets once."""

    owners: int
    sets: tuple[tuple[object, tuple[int, ...]], ...]  # (an RE2 set, the owner of each of its members in order)
    python: tuple[int, ...]  # the alternatives (by position) RE2 cannot take
    alternatives: tuple[Alternative, ...]
    _tests: dict = field(default_factory=dict, compare=False, hash=False, repr=False)  # Python tests built on demand

    @classmethod
    def build(cls, owners: int, alternatives: Iterable[Alternative]) -> "PatternIndex":
        alternatives = tuple(alternatives)
        sets, python = [], [i for i, a in enumerate(alternatives) if a.re2 is None]
        for mode, anchor in _ANCHORS.items():
            members = [(i, a.re2) for i, a in enumerate(alternatives) if a.mode == mode and a.re2 is not None]
            size = max(len(members), 1) if mode == SEARCH else SET_SIZE
            for start in range(0, len(members), size):
                _add_sets(members[start:start + size], anchor, alternatives, sets, python)
        return cls(owners, tuple(sets), tuple(sorted(python)), alternatives)

    def matches(self, name: str) -> bool:
        """Whether any alternative matches `name`."""
        if not re2_exact(name):
            return any(self._test(i)(name) for i in range(len(self.alternatives)))
        text = name.encode()
        return any(s.Match(text) for s, _ in self.sets) or any(self._test(i)(name) for i in self.python)

    def matching(self, name: str) -> set[int]:
        """The owners with an alternative matching `name`."""
        if not re2_exact(name):
            return {a.owner for i, a in enumerate(self.alternatives) if self._test(i)(name)}
        text = name.encode()
        found = {owners[j] for s, owners in self.sets for j in s.Match(text)}
        found.update(self.alternatives[i].owner for i in self.python if self._test(i)(name))
        return found

    def used(self, names: Iterable[str]) -> frozenset[int]:
        """The owners with an alternative matching at least one of `names`: one pass of each set over each name."""
        found: set[int] = set()
        for name in names:
            if len(found) == self.owners:
                break
            if not re2_exact(name):
                found.update(a.owner for i, a in enumerate(self.alternatives) if a.owner not in found and self._test(i)(name))
                continue
            text = name.encode()
            for s, owners in self.sets:
                found.update(owners[j] for j in s.Match(text) or ())
            found.update(self.alternatives[i].owner for i in self.python
                         if self.alternatives[i].owner not in found and self._test(i)(name))
        return frozenset(found)

    def _test(self, i: int) -> Test:
        test = self._tests.get(i)
        if test is None:
            test = self._tests[i] = self.alternatives[i].python()
        return test


def _add_sets(members: list[tuple[int, bytes]], anchor, alternatives, sets: list, python: list[int]) -> None:
    """One RE2 set over `members`, or (refused: too large for its memory bound) sets over each half."""
    if not members:
        return
    options = re2.Options()
    options.log_errors = False
    options.max_mem = SET_MEMORY
    built = re2._re2.Set(anchor, options)
    if all(built.Add(text) >= 0 for _, text in members) and built.Compile():
        sets.append((built, tuple(alternatives[i].owner for i, _ in members)))
    elif len(members) == 1:
        python.append(members[0][0])
    else:
        half = len(members) // 2
        _add_sets(members[:half], anchor, alternatives, sets, python)
        _add_sets(members[half:], anchor, alternatives, sets, python)


def used_patterns(regexes: RegexSet, names: Iterable[str]) -> frozenset[str]:
    """The patterns of `regexes` matching at least one of `names`, each as `regexes.matches` decides it."""
    trees = dict(regexes.parsed)
    alternatives = [Alternative(i, regexes.mode, _re2_of(trees[p]), partial(_compiled, trees[p], regexes.mode)) if p in trees else
                    Alternative(i, regexes.mode, _re2_of(_parser.parse(p)), partial(_literal, re.sub(r"\\(.)", r"\1", p), regexes.mode))
                    for i, p in enumerate(regexes.patterns)]
    return frozenset(regexes.patterns[i] for i in PatternIndex.build(len(regexes.patterns), alternatives).used(names))


def _compiled(tree, mode: str) -> Test:
    compiled = _compiler.compile(tree)
    run = compiled.fullmatch if mode == FULLMATCH else compiled.match
    return lambda name: run(name) is not None


def _literal(text: str, mode: str) -> Test:
    return text.__eq__ if mode == FULLMATCH else lambda name: name.startswith(text)


def substring(owner: int, text: str) -> Alternative:
    """`text in name`: RE2's literal of it, searched."""
    literal = "".join(f"\\x{{{ord(c):x}}}" for c in text).encode("ascii") if len(text) <= LONGEST else None
    return Alternative(owner, SEARCH, literal, partial(_holds, text))


def searched(owner: int, pattern: str) -> Alternative:
    """re.search(pattern, name), for a pattern of our own (no backtracking check: ours are simple)."""
    compiled = re.compile(pattern)
    return Alternative(owner, SEARCH, _re2_of(_parser.parse(pattern)), lambda: _test(compiled, compiled.search))


def glob(owner: int, pattern: str) -> Alternative:
    """fnmatch.fnmatchcase(name, pattern), which is re.match of fnmatch.translate(pattern). Python writes each
    `*fixed` piece inside the pattern as an atomic group `(?>.*?fixed)`; `fixed` has no `*`, so its first
    occurrence is as good as any later one (a `*` follows it) and the group matches what a plain one does: RE2,
    which has no atomic groups, gets plain ones."""
    regex = fnmatch.translate(pattern)
    tree = _plain_groups(_parser.parse(regex)) if len(regex) <= LONGEST else None
    return Alternative(owner, MATCH, _re2_of(tree), lambda: _test(re.compile(regex)))


def _re2_of(tree) -> bytes | None:
    """RE2's syntax for Python's parse tree, None where RE2 should not take it (inexpressible, or too long)."""
    try:
        syntax = re2_syntax(tree).encode("ascii") if tree is not None else None
    except Inexpressible:
        return None
    return syntax if syntax is not None and len(syntax) <= 8 * LONGEST else None


def _holds(text: str) -> Test:
    return lambda name: text in name


def _test(compiled: re.Pattern, run=None) -> Test:
    run = run or compiled.match
    return lambda name: run(name) is not None


def _plain_groups(tree):
    """The parse tree with every atomic group a plain group (valid for fnmatch's translations, see `glob`)."""
    tree.data = [_plain_item(op, av) for op, av in tree.data]
    return tree


def _plain_item(op, av):
    if op == C.ATOMIC_GROUP:
        return C.SUBPATTERN, (None, 0, 0, _plain_groups(av))
    if op == C.SUBPATTERN:
        return op, (*av[:3], _plain_groups(av[3]))
    if op == C.BRANCH:
        return op, (av[0], [_plain_groups(b) for b in av[1]])
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):
        return op, (av[0], av[1], _plain_groups(av[2]))
    return op, av
