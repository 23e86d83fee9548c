"""The `ckpt-repair` command line: parse, call the API, print. Nothing else lives here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from repair import __version__
from repair.errors import RepairError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckpt-repair")
def cli() -> None:
    """Repair quantized checkpoints so the runtime that loads them accepts them."""


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def inspect(src: Path, as_json: bool) -> None:
    """Show what SRC stores, module by module (reads headers only)."""
    from repair.inspection import as_json as to_json, as_text, inspect_checkpoint
    from repair.io.checkpoint import open_checkpoint

    result = inspect_checkpoint(open_checkpoint(src))
    click.echo(json.dumps(to_json(result), indent=2) if as_json else as_text(result))


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Output folder (must not exist).")
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (only once the new output is complete).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan / result as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def fix(src: Path, out: Path, dry_run: bool, overwrite: bool, as_json: bool, quiet: bool) -> None:
    """Repair SRC into OUT: dequantize wrongly packed layers and fix the exclusions."""
    from repair.execute import check_output, execute
    from repair.io.checkpoint import open_checkpoint
    from repair.plan import Recipe, make_plan
    from repair.plan_text import plan_as_json, plan_as_text

    plan = make_plan(open_checkpoint(src), Recipe())
    if plan.is_noop:
        _say(as_json, {"status": "noop", "plan": plan_as_json(plan)}, f"{src}: nothing to repair; it is already fixed. Nothing written.")
        return
    check_output(src, out, overwrite)
    if dry_run:
        _say(as_json, {"status": "dry-run", "plan": plan_as_json(plan)}, plan_as_text(plan) + "\n(dry run: nothing written)")
        return
    result = execute(plan, out, overwrite=overwrite, progress=None if not quiet else False, options={"recipe": "default"})
    _say(as_json, {"status": "written", "out": str(result.out), "plan": plan_as_json(plan)},
         plan_as_text(plan) + f"\nwrote {result.out} (report: {result.out / 'repair_report.json'})")


@cli.command()
@click.option("--workdir", type=click.Path(path_type=Path), help="Where to write the example folders (default: a new temp folder).")
def demo(workdir: Path | None) -> None:
    """Build a tiny broken NVFP4 Gemma 4 assistant, show what is wrong, fix it, show it fixed."""
    from repair.demo import run_demo

    run_demo(workdir, click.echo)


def _say(as_json: bool, payload: dict, text: str) -> None:
    click.echo(json.dumps(payload, indent=2) if as_json else text)


def main(argv: list[str] | None = None) -> None:
    """Entry point: tool errors become one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="ckpt-repair", standalone_mode=False)
    except RepairError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("interrupted; nothing was written", err=True)
        sys.exit(130)
