"""The `ckpt-repair` command line; one module per command, imported on demand by the group in main.py.

`main(argv)` runs a command in-process (it raises SystemExit like any click program);
`console_main()` is the installed script, which also skips the interpreter's teardown.
"""

from repair.cli.main import cli, main
from repair.cli.console import console_main

__all__ = ["cli", "console_main", "main"]
