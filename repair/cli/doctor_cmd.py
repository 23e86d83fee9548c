"""`ckpt-repair doctor`: diagnose a checkpoint against a target runtime (headers only, no torch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--target", "target_spec", default=None, help="vllm==X.Y.Z (default: newest known), sglang==X.Y.Z, trtllm==X.Y.Z or bf16; several, comma-separated, side by side (exit: the worst).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel degree to simulate.")
@click.option("--strict", is_flag=True, help="Warnings count as problems too (exit 1).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON (every finding).")
@click.option("--deep", is_flag=True, help="Read every NVFP4 block scale (default: scalars and a sample of each block-scale tensor).")
@click.option("--verbose", "-v", is_flag=True, help="One line per finding (default: alike findings grouped).")
@click.option("--quiet", "-q", is_flag=True, help="The summary line and the errors only.")
def doctor(src: Path, target_spec: str | None, tp: int, strict: bool, as_json: bool, deep: bool, verbose: bool, quiet: bool) -> None:
    """Predict what TARGET does with SRC: exit 0 healthy, 1 problems, 2 bad input."""
    from repair.doctor.diagnose import diagnose_each
    from repair.doctor.side_by_side import verdicts_json, verdicts_text, worst_exit_code
    from repair.cli.sources import open_source  # a local folder, or a Hub repo id (headers + scale bytes)
    from repair.targets.profiles import resolve_many

    ckpt = open_source(src)
    targets = resolve_many(target_spec)
    found = diagnose_each(ckpt, targets, tp, deep=deep, progress=_bar if deep else None)  # the block scales read once
    detail = "quiet" if quiet else "verbose" if verbose else "normal"
    click.echo(json.dumps(verdicts_json(found, strict), indent=2) if as_json else verdicts_text(found, strict, detail, str(src)))
    sys.exit(worst_exit_code(found, strict))

def _bar(total: int):
    """--deep's progress: bytes of block scales, rate and time left (on a terminal only)."""
    from repair.io.progress import byte_bar

    return byte_bar(total, "block scales", sys.stderr.isatty())
