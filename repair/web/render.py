"""The library's answers as the page's text: the verdict, findings by severity, the bytes a fix moves,
a job's status and its result. Text only: nothing here decides anything about a checkpoint."""

from __future__ import annotations

import html
import re

from repair.version import __version__

TOOL = f"ckpt-repair {__version__}"
HEADERS = ("module", "stored", "logical shape", "expected", "declared", "algorithm", "note")  # the module table's; "built as" goes before "note"
NOT_QUANTIZED = ("this model is not quantized (no quantization declared, every weight stored unquantized): "
                 "ckpt-repair repairs quantized checkpoints, so there is nothing to repair")


def esc(text: object) -> str:
    """Text from a checkpoint, a server or a user, safe inside Markdown/HTML."""
    return html.escape(str(text), quote=True).replace("`", "&#96;").replace("*", "&#42;").replace("_", "&#95;").replace("[", "&#91;")


def same_as(command: str) -> str:
    """The CLI line as one Markdown code span: fenced by one backtick more than the longest run inside, padded so a
    backtick at either end stays code (CommonMark strips one space each side), whatever a revision holds."""
    fence = "`" * (max(map(len, re.findall("`+", command)), default=0) + 1)
    return f"Same as: {fence} {command} {fence}"


def error(line: str, answered: int | None = None) -> str:
    """One error line; `answered` (a time stamp) tells an answer to a new Check from the one before."""
    stamp = f" data-answered='{answered}'" if answered is not None else ""
    return f"<div class='ckpt-error'{stamp}>error: {esc(line)}</div>"


def verdict(answer: dict, tp: int, answered: int = 0) -> str:
    """One verdict per target, side by side (a row of cards); `data-loads` says whether every target loads it."""
    cards = "".join(_card(v, tp, answer.get("noop")) for v in answer["verdicts"])
    loads = "yes" if all(v["exit_code"] == 0 for v in answer["verdicts"]) else "no"
    return f"<div id='verdict-text' data-answered='{answered}' data-loads='{loads}' class='verdicts'>{cards}</div>"


def _card(v: dict, tp: int, noop: bool | None) -> str:
    where = f"{esc(v['target'])}, tensor parallel {tp}"
    head = f"<div class='verdict' data-target='{esc(v['target'])}' data-loads='{'no' if v['exit_code'] else 'yes'}' title='{esc(v['label'])}'>"
    if v["stops"]:
        stops = "".join(f"<li>{'rank ' + str(s['rank']) + ' ' if tp > 1 else ''}stops at <code>{esc(s['tensor'])}</code> with: "
                        f"<code>{esc(s['error'])}</code></li>" for s in v["stops"])
        return f"{head}<b>Fails to load</b> on {where}:<ul>{stops}</ul></div>"
    if v["exit_code"]:
        return f"{head}<b>Problems</b> on {where}: {v['errors']} error(s); see the findings.</div>"
    also = f"; {v['warnings']} warning(s) below, which the plan repairs" if v["warnings"] and not noop else ""
    notes = v.get("notes", 0)
    also += f"; {notes} note{'s' if notes > 1 else ''} below: read {'them' if notes > 1 else 'it'} before relying on this" if notes else ""
    return f"{head}<b>Loads</b> on {where}: doctor found no error{also}.</div>"


def findings(answer: dict) -> str:
    parts = []
    for severity, items in answer["findings"].items():
        if items:
            parts.append(f"**{severity}s ({len(items)})**\n" + "\n".join(f"- {esc(i)}" for i in items))
    return "\n\n".join(parts) or "No findings."


def transfer(answer: dict) -> str:
    if answer.get("plan_error"):
        return error(answer["plan_error"])
    if not answer.get("quantized", True):
        return error(NOT_QUANTIZED)
    if answer.get("noop"):
        return "Nothing to repair for this choice: the fix would change nothing."
    b = answer["bytes"]
    return (f"A fix downloads <b>{b['download']:,} bytes</b> ({esc(', '.join(b['download_files'])) or 'no shard'}) and uploads "
            f"about <b>{b['upload']:,} bytes</b> of tensors ({esc(', '.join(b['upload_files']))}); every other file stays on the Hub.")


def job(status: dict | None) -> str:
    if status is None:
        return ""
    state = status.get("state", "queued")
    lines = [f"**Job `{esc(status['id'])}`: {esc(state)}**" + (f" ({status['ahead']} job(s) ahead of yours)" if state == "queued" else "")]
    if state == "running":
        lines.append(f"Phase: {esc(status.get('phase', ''))}")
    for phase, (done, total) in (status.get("progress") or {}).items():
        if total:  # a config-only fix moves no tensor bytes
            lines.append(f"- {phase}: {done:,} of {total:,} bytes")
    if status.get("error"):
        lines.append(error(status["error"]))
    if state in ("queued", "running"):
        lines.append("You may close this page: the job goes on, and this page's address shows it again.")
    return "\n\n".join(lines)


WEB_ADDRESS = re.compile(r"https?://[!#-&(-;=?-_a-~]+")  # printable ASCII but quotes, <, >, `: a Hub's address is percent-encoded


def link(url: object, elem_id: str) -> str:
    """A Hub's address as a link only when it is a plain http(s) one: a hostile Hub's `javascript:`, `data:` or
    whitespace-hidden scheme (browsers drop tabs and leading spaces) is shown as text, which no click runs; so is one
    holding any non-ASCII character (a bidi override or line separator would make it read as another address)."""
    text = url if isinstance(url, str) else repr(url)
    if isinstance(url, str) and WEB_ADDRESS.fullmatch(url):
        return f"<a id='{elem_id}' href='{esc(url)}' target='_blank' rel='noopener noreferrer'>{esc(url)}</a>"
    return f"<code id='{elem_id}'>{esc(text)}</code> (the Hub gave this address, which is not a web address; not linked)"


def result(status: dict | None) -> str:
    if not status or status.get("state") != "done" or not status.get("result"):
        return ""
    r = status["result"]
    lines = [f"<b>Done</b> by {TOOL}."]
    if r.get("status") in ("noop", "up-to-date"):
        lines.append("Nothing to do: " + ("the source needs no repair." if r["status"] == "noop" else "the fork or an open pull request already has this fix."))
    if r.get("pr"):
        lines.append(f"Pull request: {link(r['pr'].get('url'), 'pr-link')}" + (" (already open)" if r["pr"].get("existing") else ""))
    if r.get("fork") and r["fork"].get("url"):
        lines.append(f"Fork commit: {link(r['fork']['url'], 'fork-link')}")
    after = r.get("doctor_after") or {}
    for each in after.get("targets", [after] if after else []):  # several targets: one verdict each
        found = each.get("findings", [])
        lines.append(f"Doctor after, for {esc(each.get('target'))}: {len(found)} finding(s)"
                     + "".join(f"<br>{esc(f.get('severity'))}: {esc(f.get('message'))}" for f in found))
    return "".join(f"<p>{line}</p>" for line in lines)
