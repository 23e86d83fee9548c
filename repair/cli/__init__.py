"""The `ckpt-repair` command line; one module per command, registered on the group in main.py."""

from repair.cli.main import cli, main
from repair.cli import demo_cmd, doctor_cmd, fix_cmd, inspect_cmd, recipes_cmd, unshard_cmd  # noqa: F401  (registers the commands)
from repair.cli import hub_cmd  # noqa: F401,E402  (the `hub` group)

__all__ = ["cli", "main"]
