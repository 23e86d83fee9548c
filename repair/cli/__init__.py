"""The `ckpt-repair` command line; one module per command, imported on demand by the group in main.py.

`main(argv)` runs a command in-process (it raises SystemExit like any click program);
`console_main()` is the installed script, which also skips the interpreter's teardown.
"""

from repair.cli.console import console_main, interrupted_while_importing

try:  # the console script imports this package before console_main's `try`: a Ctrl-C here is an interrupt too
    from repair.cli.main import cli, main
except KeyboardInterrupt:
    interrupted_while_importing()

__all__ = ["cli", "console_main", "main"]
