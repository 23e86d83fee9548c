"""Findings of one kind and message as one line, so a 45k-module checkpoint reads in a screen.

Findings differ mostly in their subject: 89 routers give 89 messages that are equal once the subject
is taken out. Such a group is one line with its count and the subjects' compact pattern (name_pattern.py)
in place of the subject, then the first few subjects, in natural order. Groups smaller than GROUP_FROM
stay one line per finding, as does everything under --verbose; --json always lists every finding.
"""

from __future__ import annotations

from dataclasses import dataclass

from repair.doctor.findings import Finding
from repair.doctor.name_pattern import compact, natural_key, natural_sorted
from repair.errors import one_line

GROUP_FROM = 4  # a group this large is one line; smaller ones list their findings
SHOWN = 3  # subjects (and patterns) named on a group's lines


@dataclass(frozen=True)
class _Key:
    """What findings of one group share: kind, severity, and the message and runtime error around the subject."""

    label: str
    code: str
    message: tuple[str, ...]
    runtime_error: tuple[str, ...] | None
    ranks: tuple[int, ...]


def finding_lines(findings, tp: int, verbose: bool = False, label: str | None = None) -> list[str]:
    """Text lines for findings (label: their severity, or e.g. "note"), grouped unless `verbose`."""
    groups: dict[_Key, list[Finding]] = {}
    for f in findings:
        groups.setdefault(_key(f, label), []).append(f)
    lines: list[str] = []
    for key, members in groups.items():
        if verbose or len(members) < GROUP_FROM:
            for f in sorted(members, key=lambda f: natural_key(f.subject)):
                lines += _one(key.label, f, tp, key.runtime_error is not None)
        else:
            lines += _group(key, [f.subject for f in members], tp)
    return [one_line(line) for line in lines]  # names are data: a newline or escape code in one must not forge output


def _key(f: Finding, label: str | None) -> _Key:
    return _Key(label or str(f.severity), str(f.code), _around(f.message, f.subject),
                None if f.runtime_error is None else _around(f.runtime_error, f.subject), f.ranks)


def _around(text: str, subject: str) -> tuple[str, ...]:
    """The text split at its subject: equal tuples are the same message about different subjects."""
    return tuple(text.split(subject)) if subject else (text,)


def _one(label: str, f: Finding, tp: int, runtime: bool) -> list[str]:
    lines = [f"{label}: [{f.code}] {f.message}"]
    if runtime:
        lines.append(f"    runtime error{_ranks(f.ranks, tp)}: {f.runtime_error}")
    return lines


def _group(key: _Key, subjects: list[str], tp: int) -> list[str]:
    pattern = pattern_text(subjects)
    message = pattern.join(key.message) if len(key.message) > 1 else f"{key.message[0]} ({pattern})"
    lines = [f"{key.label}: [{key.code}] {len(subjects)} alike: {message}", f"    {first_text(subjects)}"]
    if key.runtime_error is not None:
        lines.insert(1, f"    runtime error{_ranks(key.ranks, tp)}: {pattern.join(key.runtime_error)}")
    return lines


def pattern_text(subjects: list[str]) -> str:
    """The subjects' compact patterns, the first SHOWN of them when there are more."""
    patterns = compact(subjects)
    return ", ".join(patterns[:SHOWN]) + (f" (+{len(patterns) - SHOWN} more pattern(s))" if len(patterns) > SHOWN else "")


def first_text(subjects: list[str]) -> str:
    """The first few subjects in natural order, and where to find them all."""
    first = natural_sorted(set(subjects))
    return f"{', '.join(first[:SHOWN])}, ... (--verbose or --json lists all {len(subjects)})"


def names_text(names, verbose: bool = False) -> str:
    """A list of names inline: all of them when few (or verbose), else their count and compact patterns."""
    names = list(names)
    if verbose or len(names) < GROUP_FROM:
        return one_line(", ".join(names))  # names from a config: no forged lines
    return one_line(f"{len(names)} entries: {pattern_text(names)} (--verbose lists them)")


def _ranks(ranks: tuple[int, ...], tp: int) -> str:
    return f" (rank {', '.join(map(str, ranks))})" if tp > 1 and ranks else ""  # none named: not one rank's error
