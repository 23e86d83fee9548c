"""Would Python's backtracking `re` blow up on a pattern? A static check on the pattern's own parse tree.

A backtracking matcher explores every way the pattern can match a prefix of the name before it gives up.
That number explodes where the pattern is ambiguous around a loop (Weideman et al., "Analyzing Matching
Time Behavior of Backtracking Regular Expression Matchers by Using Ambiguity of NFA", 2016):

- exponential (EDA): a loop can read the same text along two different paths, as in `(a+)+`, `(a|a)*`,
  `(.*\\.)*`: each extra character doubles the paths tried when the match fails;
- polynomial of degree d (IDA): d loops in a row can each read the same text, as in `.*.*.*X`: n^d paths
  on a name of n characters.

The check builds the pattern's position automaton (Glushkov's construction: one state per character item,
one transition per way to follow it, so `(a+)+`'s inner and outer loop are two transitions) over character
sets probed on a finite alphabet, and refuses EDA and IDA of degree 3 or more. It over-approximates where
that is cheap and safe: repeats counted above 8 are treated as unbounded loops, a backreference as a loop
over any character, a lookaround's body is checked as a pattern of its own. Refusing means: a failing name
of a few dozen characters already takes Python's re (and the runtime's matcher) seconds to years.
"""

from __future__ import annotations

import re
from re import _constants as C, _parser

from repair.io.ambiguity import MAX_DEGREE, degree as degree_of, two_paths

EXPAND = 8  # counted repeats up to this many are unrolled (exact); larger ones become loops (conservative)
_PROBE = [chr(c) for c in range(128)] + ["é", "\u0663", "\xa0", "\u2028", "\u212a", "\u017f", "\u4e00", "\U0001f600"]
_CATEGORIES = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W",
               C.CATEGORY_SPACE: r"\s", C.CATEGORY_NOT_SPACE: r"\S"}
_IGNORECASE, _DOTALL, _ASCII = int(re.IGNORECASE), int(re.DOTALL), int(re.ASCII)
_PROBE_INDEX = {ch: i for i, ch in enumerate(_PROBE)}
_PROBE_CATEGORIES = {(e, a): sum(1 << i for i, ch in enumerate(_PROBE) if re.fullmatch(e, ch, a))
                     for e in (*_CATEGORIES.values(), r"[^\x00-\U0010ffff]") for a in (0, re.ASCII)}  # a constant table
_CHAR_ITEMS = (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN)
_REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT)


def backtracking_problem(parsed: _parser.SubPattern) -> str | None:
    """Why Python's re would backtrack catastrophically on the parsed pattern, or None when it would not."""
    loops = _simple_loops(parsed)
    if loops is not None and loops <= MAX_DEGREE:
        return None  # at most two loops, each over one character item: at most n^2, and one way round each
    auto = _Automaton(int(parsed.state.flags), _Alphabet(_codes(parsed)))
    auto.build(parsed)
    for body in auto.lookarounds:
        inner = backtracking_problem(body)
        if inner:
            return inner
    return auto.problem()


def _simple_loops(node) -> int | None:
    """How many repetitions the pattern has, when each repeats one character item and nothing else can loop
    or look around (None otherwise): the common case, decided without building the automaton."""
    count = 0
    for op, av in node:
        if op in _REPEATS:
            body = list(av[2])
            if av[1] > 1 and not (len(body) == 1 and body[0][0] in _CHAR_ITEMS):
                return None
            count += av[1] > 1
        elif op == C.SUBPATTERN or op == C.BRANCH:
            for inner in ([av[3]] if op == C.SUBPATTERN else av[1]):
                found = _simple_loops(inner)
                if found is None:
                    return None
                count += found
        elif op not in _CHAR_ITEMS and op != C.AT:
            return None
    return count


def _codes(node) -> set[int]:
    """Every character code the pattern names (literals, range ends), so the probe alphabet holds them all."""
    out = set()
    for op, av in node:
        if op in (C.LITERAL, C.NOT_LITERAL):
            out.add(av)
        elif op == C.RANGE:
            out.update(av)
        elif op == C.IN or op == C.BRANCH:
            out |= _codes(av if op == C.IN else [x for b in av[1] for x in b])
        elif op in _REPEATS:
            out |= _codes(av[2])
        elif op == C.SUBPATTERN:
            out |= _codes(av[3])
        elif op == C.ATOMIC_GROUP:
            out |= _codes(av)
        elif op == C.GROUPREF_EXISTS:
            out |= _codes(list(av[1]) + (list(av[2]) if av[2] is not None else []))
    return out


class _Alphabet:
    """The probe alphabet: fixed representatives of every class the tool meets, plus the pattern's own characters;
    a character set is the bit mask of the probe characters it holds (two sets intersect when their masks do)."""

    def __init__(self, codes: set[int]) -> None:
        extra = sorted({c for code in codes if code > 127 for c in _case_variants(chr(code))} - _PROBE_INDEX.keys())
        self.chars = _PROBE + extra
        self.index = _PROBE_INDEX | {ch: len(_PROBE) + i for i, ch in enumerate(extra)} if extra else _PROBE_INDEX
        self.all = (1 << len(self.chars)) - 1
        self.newline = 1 << _PROBE_INDEX["\n"]

    def bit(self, code: int, flags: int) -> int:
        if not flags & _IGNORECASE:
            return 1 << self.index[chr(code)]
        return sum(1 << self.index[ch] for ch in set(_case_variants(chr(code))) if ch in self.index)

    def category(self, category: int, ascii_only: int) -> int:
        """A class escape's set: the fixed probe's bits from the table, the pattern's own characters tested."""
        escape = _CATEGORIES.get(category, r"[^\x00-\U0010ffff]")
        extra = sum(1 << self.index[ch] for ch in self.chars[len(_PROBE):] if re.fullmatch(escape, ch, ascii_only))
        return _PROBE_CATEGORIES[escape, ascii_only] | extra

    def where(self, contains) -> int:
        return sum(1 << i for i, ch in enumerate(self.chars) if contains(ch))


def _case_variants(ch: str) -> tuple[str, ...]:
    return tuple(c for c in (ch, ch.lower(), ch.upper(), ch.swapcase()) if len(c) == 1)


class _Automaton:
    """A position automaton: `masks[p]` is position p's character set on the probe alphabet, `edges` the transitions
    (source, target), an edge's index telling parallel transitions apart, and `loops` the positions of every
    repetition that can repeat, in pattern order. A part of the pattern that can read nothing in two ways (`(|)`)
    doubles the transitions across it, as the matcher tries both."""

    def __init__(self, flags: int, alphabet: _Alphabet) -> None:
        self.flags = flags
        self.alphabet = alphabet
        self.masks: list[int] = []
        self.edges: list[tuple[int, int]] = []
        self.loops: list[tuple[int, int]] = []  # (first position, end) of each looping repetition's body
        self.lookarounds: list[_parser.SubPattern] = []

    def build(self, node) -> tuple[int, list[int], list[int]]:
        """(ways to read nothing, capped at 2; first positions; last positions) of a node, adding its positions and
        inner transitions; a position listed twice is entered (or left) in two ways."""
        return self._sequence(list(node), self.flags)

    def _sequence(self, items, flags) -> tuple[int, list[int], list[int]]:
        empty, first, last = 1, [], []
        for op, av in items:
            e2, f2, l2 = self._item(op, av, flags)
            self._link(last, f2)
            first = _cap(first + f2 * empty)
            last = _cap(l2 + last * e2)
            empty = min(2, empty * e2)
        return empty, first, last

    def _item(self, op, av, flags) -> tuple[int, list[int], list[int]]:
        if op in _CHAR_ITEMS:
            p = self._position(_mask(self.alphabet, op, av, flags))
            return 0, [p], [p]
        if op in (C.SUBPATTERN, C.ATOMIC_GROUP):
            sub_flags, body = ((flags | int(av[1])) & ~int(av[2]), av[3]) if op == C.SUBPATTERN else (flags, av)
            return self._sequence(list(body), sub_flags)
        if op == C.BRANCH:
            return self._union([list(b) for b in av[1]], flags)
        if op == C.GROUPREF_EXISTS:
            return self._union([list(av[1]), list(av[2]) if av[2] is not None else []], flags)
        if op in _REPEATS:
            return self._repeat(av[0], av[1], list(av[2]), flags)
        if op == C.GROUPREF:  # any text of any length: a loop over every character (conservative)
            p = self._position(self.alphabet.all)
            self._link([p], [p])
            self.loops.append((p, p + 1))
            return 1, [p], [p]
        if op in (C.ASSERT, C.ASSERT_NOT):
            self.lookarounds.append(av[1])
        return 1, [], []  # anchors and lookarounds read no character

    def _union(self, branches, flags) -> tuple[int, list[int], list[int]]:
        empty, first, last = 0, [], []
        for branch in branches:
            e, f, l = self._sequence(branch, flags)
            empty, first, last = min(2, empty + e), _cap(first + f), _cap(last + l)
        return empty, first, last

    def _repeat(self, low: int, high: int, body, flags) -> tuple[int, list[int], list[int]]:
        if high == 0:
            return 1, [], []
        if high != C.MAXREPEAT and high <= EXPAND:  # unrolled: `low` copies, then optional ones
            once = [(C.SUBPATTERN, (None, 0, 0, body))]
            return self._sequence(once * low + [(C.MAX_REPEAT, (0, 1, body))] * (high - low), flags) if high > 1 \
                else self._optional(low, body, flags)
        start = len(self.masks)
        empty, first, last = self._sequence(body, flags)
        self._link(last, first)  # the loop: every way out of the body back into it
        if len(self.masks) > start:
            self.loops.append((start, len(self.masks)))
        return min(2, empty + (low == 0)), first, last

    def _optional(self, low: int, body, flags) -> tuple[int, list[int], list[int]]:
        empty, first, last = self._sequence(body, flags)
        return min(2, empty + (low == 0)), first, last

    def _position(self, mask: int) -> int:
        self.masks.append(mask)
        return len(self.masks) - 1

    def _link(self, sources: list[int], targets: list[int]) -> None:
        self.edges.extend((s, t) for s in sources for t in targets)

    def problem(self) -> str | None:
        """The outermost loops are the automaton's cycles: a nested loop's positions are inside its outer loop's."""
        loops, end = [], -1
        for start, stop in sorted(self.loops, key=lambda r: (r[0], -r[1])):
            if start >= end:
                loops.append(list(range(start, stop)))
                end = stop
        if not loops:
            return None
        follow: list[list[tuple[int, int]]] = [[] for _ in self.masks]
        for index, (source, target) in enumerate(self.edges):
            follow[source].append((target, index))
        for loop in loops:
            if two_paths(loop, follow, self.masks):
                return "exponentially: a loop can read the same text in two different ways"
        degree = degree_of(loops, follow, self.masks)
        if degree > MAX_DEGREE:
            return f"polynomially: {degree} loops in a row can each read the same text (n^{degree} steps on a name of n characters)"
        return None


def _cap(positions: list[int]) -> list[int]:
    """At most two entries per position: two ways in are enough to tell ambiguity, and lists stay linear."""
    if len(positions) < 5 and len(set(positions)) == len(positions):
        return positions
    seen: dict[int, int] = {}
    out = []
    for p in positions:
        if seen.get(p, 0) < 2:
            seen[p] = seen.get(p, 0) + 1
            out.append(p)
    return out


def _mask(alphabet: _Alphabet, op, av, flags: int) -> int:
    """One character item's set on the probe alphabet (IGNORECASE over-approximated by case variants)."""
    if op == C.LITERAL:
        return alphabet.bit(av, flags)
    if op == C.NOT_LITERAL:
        return alphabet.all & ~alphabet.bit(av, flags) if not flags & _IGNORECASE else alphabet.all
    if op == C.ANY:
        return alphabet.all if flags & _DOTALL else alphabet.all & ~alphabet.newline
    mask, negate = 0, False
    for sub_op, sub_av in av:
        if sub_op == C.NEGATE:
            negate = True
        elif sub_op == C.LITERAL:
            mask |= alphabet.bit(sub_av, flags)
        elif sub_op == C.RANGE:
            low, high = sub_av
            mask |= alphabet.where(lambda ch: any(low <= ord(c) <= high for c in (_case_variants(ch) if flags & _IGNORECASE else (ch,))))
        elif sub_op == C.CATEGORY:
            mask |= alphabet.category(sub_av, flags & _ASCII)
    return alphabet.all & ~mask if negate else mask
