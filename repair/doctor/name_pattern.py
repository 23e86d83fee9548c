"""Many names as a few compact patterns, in natural order: 89 routers are `model.layers.{3..91}.mlp.gate`.

A name splits into text and numbers. A number is a digit run (ASCII) of at most 18 digits without a
leading zero; any other digits stay text, so each name comes back exactly. Names with the same text
whose numbers form a product of sets become one pattern, each set written as runs (`{0..3,7,9,10}`).
`{` and `}` in a name (and a `\\` before them or another `\\`) are escaped with `\\`, so `expand(pattern)` gives back exactly the names
that made it (names are data: they may hold anything). Natural order sorts `layers.3` before `layers.10`.
"""

from __future__ import annotations

import re
from itertools import product
from typing import Iterable

_NUMBER = re.compile(r"(?<![0-9])(0|[1-9][0-9]{0,17})(?![0-9])")
_SPECIAL = re.compile(r"\\(?=[\\{}]|\Z)|[{}]")  # a brace, or a backslash that an escape could be read into
MAX_FIELDS = 16  # names with more numbers than this are kept whole (bounds the work on hostile names)


def natural_key(name: str) -> tuple:
    """Sort key: text parts as text, numbers as numbers (`layers.3` < `layers.10`)."""
    parts = _NUMBER.split(name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def natural_sorted(names: Iterable[str]) -> list[str]:
    return sorted(names, key=natural_key)


def compact(names: Iterable[str]) -> list[str]:
    """The names as patterns (each name once), in the natural order of each pattern's first name."""
    skeletons: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
    whole: list[str] = []
    for name in set(names):
        parts = _NUMBER.split(name)
        if len(parts) // 2 > MAX_FIELDS:
            whole.append(name)
            continue
        skeletons.setdefault(tuple(parts[0::2]), []).append(tuple(int(p) for p in parts[1::2]))
    found = [(natural_key(name), _escape(name)) for name in whole]
    for texts, numbers in skeletons.items():
        for fields in _cover(numbers, len(texts) - 1):
            first = _join(texts, [str(f[0]) for f in fields], escape=False)
            found.append((natural_key(first), _join(texts, [_field(f) for f in fields], escape=True)))
    return [pattern for _, pattern in sorted(found)]


def expand(pattern: str) -> list[str]:
    """Every name a pattern stands for (the inverse of `compact`), in natural order."""
    pieces: list[list[str]] = []
    text, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and pattern[i + 1:i + 2] in ("\\", "{", "}"):
            text.append(pattern[i + 1])
            i += 2
        elif c == "{":
            end = pattern.index("}", i)
            pieces += [["".join(text)], [str(n) for n in _values(pattern[i + 1:end])]]
            text, i = [], end + 1
        else:
            text.append(c)
            i += 1
    pieces.append(["".join(text)])
    return natural_sorted("".join(choice) for choice in product(*pieces))


def _cover(numbers: list[tuple[int, ...]], width: int) -> list[tuple[tuple[int, ...], ...]]:
    """Exact cover of a set of number tuples by products of sets: the values of the first field that share
    the same set of remaining tuples form one product with it (recursion depth: the fields, at most MAX_FIELDS)."""
    if width == 0:
        return [()]
    by_first: dict[int, set[tuple[int, ...]]] = {}
    for t in numbers:
        by_first.setdefault(t[0], set()).add(t[1:])
    by_rest: dict[frozenset, list[int]] = {}
    for value, rest in by_first.items():
        by_rest.setdefault(frozenset(rest), []).append(value)
    out = []
    for rest, values in by_rest.items():
        for tail in _cover(list(rest), width - 1):
            out.append((tuple(sorted(values)), *tail))
    return out


def _field(values: tuple[int, ...]) -> str:
    """`7`, or `{3..91}`, `{0,2}`, `{0..3,7,9,10}`: runs of three or more as a..b."""
    if len(values) == 1:
        return str(values[0])
    runs, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            run = values[start:i]
            runs += [f"{run[0]}..{run[-1]}"] if len(run) >= 3 else [str(v) for v in run]
            start = i
    return "{" + ",".join(runs) + "}"


def _values(inside: str) -> list[int]:
    out = []
    for item in inside.split(","):
        lo, dots, hi = item.partition("..")
        out += list(range(int(lo), int(hi) + 1)) if dots else [int(lo)]
    return out


def _join(texts: tuple[str, ...], fields: list[str], escape: bool) -> str:
    out = [_escape(texts[0]) if escape else texts[0]]
    for field, text in zip(fields, texts[1:]):
        out += [field, _escape(text) if escape else text]
    return "".join(out)


def _escape(text: str) -> str:
    """Braces, and backslashes before a brace, a backslash or the end, get a backslash (`re:a\\.b` stays readable)."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(0), text)
