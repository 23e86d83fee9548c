"""`python -m repair`: the same entry point as the installed `ckpt-repair` script."""

from repair.cli import console_main

if __name__ == "__main__":
    console_main()
