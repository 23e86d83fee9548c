"""`ckpt-repair hub ...`: work on Hugging Face Hub repos (or a Hub-compatible server at HF_ENDPOINT)."""

from __future__ import annotations

from pathlib import Path

import click

from repair.cli.fix_options import FixOptions, shared
from repair.cli.main import say


@click.group()
def hub() -> None:
    """Repair models on the Hugging Face Hub without downloading all of them."""


@hub.command("fix")
@click.argument("src")
@click.option("--to", "dst", default=None, help="The fork to create (server-side duplicate of SRC) or update: owner/name.")
@click.option("--pr", is_flag=True, help="Open a pull request on SRC with the same fix (skipped if an open one exists).")
@click.option("--private", is_flag=True, help="Create the fork private.")
@shared("dry_run", help="Plan from remote headers and say what would be downloaded and committed; change nothing.")
@shared("target_spec")
@shared("recipe_path")
@shared("original")
@shared("requantize")
@shared("force")
@click.option("--workdir", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
              help="Where to stage the changed shards (default: the system temp folder); it needs room for the largest one, twice.")
@shared("as_json", help="Print the result as JSON.")
@shared("quiet", help="Print the summary and errors only (no progress lines or bars).")
@shared("jobs")
def hub_fix(src: str, dst: str | None, pr: bool, private: bool, workdir: Path | None, **values) -> None:
    """Repair Hub repo SRC[@REV] into fork DST and/or a pull request on SRC, in one commit each.

    Only the shards that change (and small files) are downloaded; unchanged files stay on the Hub.
    """
    from repair.hub.workflow import HubFix, hub_fix as run

    o = FixOptions.take(values)
    echo = (lambda line: None) if o.quiet else (lambda line: click.echo(line, err=True))  # progress: stderr
    result = run(HubFix(src, dst, pr, private, o.dry_run, o.recipe(), o.original, o.force, workdir, o.quiet, o.jobs), echo)
    say(o.as_json, result, _text(result))


def _text(result: dict) -> str:
    status = result["status"]
    if status == "noop":
        return "nothing to repair; nothing uploaded"
    if status == "dry-run":
        return "(dry run: nothing downloaded beyond headers, scales and small files; nothing uploaded)"
    if status == "up-to-date":
        return "nothing to do: the fork already has this fix and/or an open pull request has it"
    lines = []
    if result.get("fork"):
        lines.append(f"fork: {result['fork']['url']}")
    if result.get("pr"):
        lines.append(f"pull request: {result['pr']['url']}" + (" (already open)" if result["pr"].get("existing") else ""))
    after = result.get("doctor_after") or {}
    for verdict in after.get("targets", [after]):  # several targets: one verdict each
        lines.append(f"doctor after: {len(verdict.get('findings', []))} finding(s) for {verdict.get('target')}")
    return "\n".join(lines)
