"""README.md front matter: light validation and a small YAML-subset reader (the stdlib has no YAML parser).

The reader understands what model cards usually hold: ``key: scalar``, ``key: [a, b]``, ``key:`` followed by
``- item`` lines, and one level of ``key:`` / ``  sub: scalar`` mappings. Anything else is skipped, so
``cardData`` in model info is a best-effort view, never an error.
"""

from __future__ import annotations


def _block(content: str) -> list[str] | None:
    lines = content.splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    for i in range(1, len(lines)):
        if lines[i].strip() in ("---", "..."):
            return lines[1:i]
    return None


def front_matter_errors(content: str) -> list[str]:
    """Closed block, no tab indentation, top-level lines look like ``key: value``."""
    lines = content.splitlines()
    if not lines or lines[0].strip() != "---":
        return []
    block = _block(content)
    if block is None:
        return ["YAML front matter is not closed by a '---' line"]
    errors = []
    for number, line in enumerate(block, start=2):
        indent = line[: len(line) - len(line.lstrip())]
        if "\t" in indent:
            errors.append(f"line {number}: tabs cannot be used for indentation")
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and not indent and not stripped.startswith("-") \
                and ":" not in stripped:
            errors.append(f"line {number}: expected 'key: value', got {stripped!r}")
    return errors


def _scalar(text: str):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(p) for p in text[1:-1].split(",") if p.strip()]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~", ""):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_front_matter(content: str) -> dict | None:
    block = _block(content)
    if block is None:
        return None
    data: dict = {}
    key = None
    for line in block:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indented = line[:1] in (" ", "\t")
        if not indented and not stripped.startswith("-") and ":" in stripped:
            key, _, value = stripped.partition(":")
            key = key.strip()
            data[key] = _scalar(value) if value.strip() else None
        elif key is not None and stripped.startswith("- "):
            if not isinstance(data.get(key), list):
                data[key] = []
            data[key].append(_scalar(stripped[2:]))
        elif key is not None and indented and ":" in stripped:
            sub, _, value = stripped.partition(":")
            if not isinstance(data.get(key), dict):
                data[key] = {}
            data[key][sub.strip()] = _scalar(value)
    return data
