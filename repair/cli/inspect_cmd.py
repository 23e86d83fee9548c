"""`ckpt-repair inspect`: what a checkpoint stores (headers only, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from repair.cli.main import cli


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def inspect(src: Path, as_json: bool) -> None:
    """Show what SRC stores, module by module (reads headers only)."""
    from repair.inspection import as_json as to_json, as_text, inspect_checkpoint
    from repair.io.checkpoint import open_checkpoint

    result = inspect_checkpoint(open_checkpoint(src))
    click.echo(json.dumps(to_json(result), indent=2) if as_json else as_text(result))
