"""`python -m repair` and the installed `ckpt-repair` script (entry point `repair.__main__:run`).

The CLI is imported here inside a `try`, so a Ctrl-C while it is still importing is one line and exit 130,
never a KeyboardInterrupt traceback; only the interpreter's own start comes before this module."""

import os
import sys

# numpy's OpenBLAS starts a pool of threads at import that spin for a while: ~0.05 s of CPU per command
# (measured, BENCHMARKS.md "One pass"), and no command multiplies matrices with numpy. A user's own value wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

try:
    from repair.cli import console_main
except BaseException as exc:  # a Ctrl-C, or one Python 3.11 wrapped in a RuntimeError (repair/errors.py interrupted)
    cause = exc
    while cause is not None and not isinstance(cause, KeyboardInterrupt):
        cause = cause.__cause__
    if cause is None:
        raise
    sys.stderr.write("interrupted; nothing was written\n")
    sys.stderr.flush()
    os._exit(130)


def run() -> None:
    console_main()


if __name__ == "__main__":
    run()
