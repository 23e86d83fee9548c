"""`ckpt-repair hub ...`: work on Hugging Face Hub repos (or a Hub-compatible server at HF_ENDPOINT)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from repair.cli.main import say


@click.group()
def hub() -> None:
    """Repair models on the Hugging Face Hub without downloading all of them."""


@hub.command("fix")
@click.argument("src")
@click.option("--to", "dst", default=None, help="The fork to create (server-side duplicate of SRC) or update: owner/name.")
@click.option("--pr", is_flag=True, help="Open a pull request on SRC with the same fix (skipped if an open one exists).")
@click.option("--private", is_flag=True, help="Create the fork private.")
@click.option("--dry-run", is_flag=True, help="Plan from remote headers and say what would be downloaded and committed; change nothing.")
@click.option("--target", "target_spec", default=None, help="Fix for vllm==X.Y.Z or bf16 (default: the handshake repair).")
@click.option("--recipe", "recipe_path", default=None, help="A recipe file, a built-in recipe name, or an earlier repair_report.json.")
@click.option("--original", default=None, help="The original BF16 model (a local folder or a Hub repo id): BF16 modules are taken from it.")
@click.option("--requantize", default=None, help="Comma-separated modules to pack afresh from --original (ModelOpt-exact).")
@click.option("--force", is_flag=True, help="Use --original even if it does not reproduce the checkpoint's packed bytes.")
@click.option("--workdir", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
              help="Where to stage the changed shards (default: the system temp folder); it needs room for the largest one, twice.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", is_flag=True, help="No progress lines or bars.")
def hub_fix(src: str, dst: str | None, pr: bool, private: bool, dry_run: bool, target_spec: str | None, recipe_path: str | None,
            original: str | None, requantize: str | None, force: bool, workdir: Path | None, as_json: bool, quiet: bool) -> None:
    """Repair Hub repo SRC[@REV] into fork DST and/or a pull request on SRC, in one commit each.

    Only the shards that change (and small files) are downloaded; unchanged files stay on the Hub.
    """
    from repair.hub.workflow import HubFix, hub_fix as run
    from repair.planning.recipe import DEFAULT, load_recipe

    recipe = load_recipe(Path(recipe_path)) if recipe_path else DEFAULT  # the same flags -> recipe as `fix`
    if target_spec:
        recipe = replace(recipe, target=target_spec)
    if requantize:
        recipe = replace(recipe, requantize=recipe.requantize + tuple(m.strip() for m in requantize.split(",") if m.strip()))
    echo = (lambda line: None) if quiet else (lambda line: click.echo(line, err=True))  # progress: stderr
    result = run(HubFix(src, dst, pr, private, dry_run, recipe, original, force, workdir, quiet), echo)
    say(as_json, result, _text(result))


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
    lines.append(f"doctor after: {len(after.get('findings', []))} finding(s) for {after.get('target')}")
    return "\n".join(lines)
