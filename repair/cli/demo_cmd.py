"""`ckpt-repair demo`: the main job on the built-in example."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--workdir", type=click.Path(path_type=Path), help="Where to write the example folders (default: a new temp folder).")
def demo(workdir: Path | None) -> None:
    """Build a tiny broken NVFP4 Gemma 4 assistant, show what is wrong, fix it, show it fixed."""
    from repair.demo.run import run_demo

    run_demo(workdir, click.echo)
