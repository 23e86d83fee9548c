"""`ckpt-repair inspect`: what a checkpoint stores (headers only, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--target", "target_spec", default=None,
              help="The release whose build the declared column shows: vllm==X.Y.Z (default: newest known), sglang==X.Y.Z, "
                   "or trtllm==X.Y.Z (one).")
def inspect(src: Path, as_json: bool, target_spec: str | None) -> None:
    """Show what SRC stores, module by module (reads headers only)."""
    from repair.doctor.inspection import as_json as to_json, as_text, inspect_checkpoint
    from repair.cli.sources import open_source  # a local folder, or a Hub repo id (headers only)
    from repair.errors import UsageError
    from repair.targets.profiles import resolve_many

    targets = resolve_many(target_spec)  # a bad spec is one line before the source is opened
    if len(targets) > 1:
        raise UsageError(f"--target {target_spec[:200]!r}: inspect shows one release's reading; give one target "
                         "(doctor compares several side by side)")
    if not targets[0].profile.allows_quant_config:
        raise UsageError(f"--target {target_spec[:200]!r}: {targets[0].spec} reads no quantization config (it loads the "
                         "checkpoint dequantized), so no column declares as it builds; give the release whose reading "
                         "you want, e.g. vllm==0.32.0, sglang==0.5.23 or trtllm==1.0")
    result = inspect_checkpoint(open_source(src, scales=False), targets[0])
    click.echo(json.dumps(to_json(result), indent=2) if as_json else as_text(result))
