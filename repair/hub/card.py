"""The fork's model card: the source card's text and metadata kept, `base_model: SRC` and tags added,
and one "Repair" section (what was wrong, what changed, the pinned source commit, the recipe,
doctor before and after) between markers, so a later repair replaces it instead of adding another.

Uses huggingface_hub's ModelCard for the YAML front matter (no templates, so no Jinja2).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from repair.version import __version__

BEGIN, END = "<!-- ckpt-repair:begin -->", "<!-- ckpt-repair:end -->"
TOOL_TAG = "ckpt-repair"
_FRONT_MATTER = re.compile(r"\A---\s*\n.*?\n---\s*(\n|\Z)", re.S)


@dataclass(frozen=True)
class RepairFacts:
    """Everything the section states; built by the workflow from the plan and the two diagnoses."""

    source_repo: str
    source_sha: str
    asked: str | None
    endpoint: str
    recipe: dict
    fix_id: str
    target: str
    before: str  # doctor text
    after: str
    changes: str  # plan text without its first line
    rewritten: tuple[str, ...]
    removed: tuple[str, ...]
    original: str | None = None


def fix_id(source_label: str, recipe: dict, original: str | None) -> str:
    """A short id that is the same exactly when the same source commit gets the same recipe."""
    blob = json.dumps({"source": source_label, "recipe": recipe, "original": original}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def section(f: RepairFacts) -> str:
    src_url = f"{f.endpoint}/{f.source_repo}"
    asked = f" (asked for `{f.asked}`)" if f.asked and f.asked != f.source_sha else ""
    files = ", ".join(f"`{n}`" for n in f.rewritten) or "none"
    lines = [
        BEGIN,
        "## Repair (ckpt-repair)",
        "",
        f"This repository is [`{f.source_repo}`]({src_url}) at commit [`{f.source_sha}`]({src_url}/tree/{f.source_sha}){asked}, "
        f"repaired by ckpt-repair {__version__}. Files not listed below are the source's, byte for byte.",
        "",
        "### What was wrong",
        f"`ckpt-repair doctor --target {f.target}` on the source:",
        "", "```text", f.before, "```", "",
        "### What was changed",
        "", "```text", f.changes, "```", "",
        f"Rewritten: {files}." + (f" Removed: {', '.join(f'`{n}`' for n in f.removed)}." if f.removed else ""),
        "",
        "### After",
        "`doctor` on the repaired files:",
        "", "```text", f.after, "```", "",
        "### Provenance",
        f"- source: `{f.source_repo}` at `{f.source_sha}`",
        *([f"- original model: `{f.original}`"] if f.original else []),
        f"- recipe `{f.recipe.get('name', '?')}` (fix id `{f.fix_id}`):",
        "", "```json", json.dumps(f.recipe, indent=2), "```", "",
        "- `repair_report.json` records the sha256 of every file and the full doctor results before and after.",
        END,
    ]
    return "\n".join(lines)


def fork_card(source: str | None, *, source_repo: str, title: str, text: str, quantized: bool) -> str:
    """README.md for the fork: `source` (the source's README, or None) with metadata and section `text`."""
    from huggingface_hub import ModelCard

    card = _parse(source) if source else ModelCard(f"---\n{{}}\n---\n# {title}\n")  # an empty block: no "not found" log
    data = card.data
    previous = getattr(data, "base_model", None)
    data.base_model = source_repo
    if getattr(data, "base_model_relation", None) is not None:
        data.base_model_relation = None  # it described the source's relation to *its* base, not ours to the source
    tags = data.tags if isinstance(data.tags, list) else [data.tags] if data.tags else []
    for tag in (TOOL_TAG, "nvfp4") if quantized else (TOOL_TAG,):
        if tag not in tags:
            tags.append(tag)
    data.tags = tags
    if previous and previous != source_repo:
        text = text.replace(END, f"- the source card named `base_model: {_names(previous)}`\n{END}")
    body = _without_section(card.text).rstrip("\n")
    card.text = f"{body}\n\n{text}\n" if body else f"{text}\n"
    return str(card)


def pr_description(text: str) -> str:
    return _without_markers(text) + "\n\nOpened by `ckpt-repair hub fix --pr`; the title's id identifies this exact fix."


def _parse(source: str):
    """The source card; if its front matter is not valid YAML, its text is kept and the metadata restarted."""
    from huggingface_hub import ModelCard

    if not _FRONT_MATTER.match(source):
        source = "---\n{}\n---\n" + source  # no metadata yet: an empty block (and no "not found" log)
    try:
        return ModelCard(source)
    except Exception:  # noqa: BLE001 - yaml errors of any kind: keep the prose, drop the broken block
        return ModelCard("---\n{}\n---\n" + _FRONT_MATTER.sub("", source, count=1))


def _without_section(text: str) -> str:
    return re.sub(re.escape(BEGIN) + r".*?" + re.escape(END) + r"[^\n]*\n?", "", text, flags=re.S)


def _without_markers(text: str) -> str:
    return text.replace(BEGIN + "\n", "").replace("\n" + END, "")


def _names(value) -> str:
    return ", ".join(value) if isinstance(value, list) else str(value)
