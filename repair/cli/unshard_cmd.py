"""`ckpt-repair unshard`: rebuild the standard checkpoint from `fix --tp` output."""

from __future__ import annotations

from pathlib import Path

import click

from repair.cli.main import say


@click.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Output folder (must not exist).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (only once the new output is complete).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def unshard(src: Path, out: Path, overwrite: bool, as_json: bool) -> None:
    """Reassemble the per-rank checkpoints in SRC (written by `fix --tp N`) into one standard checkpoint at OUT."""
    from repair.tp.unshard import unshard as run, unshard_text

    result = run(src, out, overwrite=overwrite)
    say(as_json, {"status": "written", "out": str(result.out), "report": result.report}, unshard_text(result))
