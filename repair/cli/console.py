"""The installed `ckpt-repair` script (and `python -m repair`): run the command, then leave fast.

With torch loaded, the interpreter's teardown (finalising every module and object) took ~0.36 s
after the work was done. A command returns only once its output is complete: files written
unbuffered or closed, fsynced and renamed into place, worker threads joined. So the script runs
the atexit handlers (the Hub source's temp-folder cleanup, logging's flush), flushes stdout and
stderr, and ends with os._exit. Anything unusual (a worker thread still alive, a flush that
fails) takes the ordinary exit instead. `repair.cli.main` itself never exits this way: tests and
other callers run it in-process.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import NoReturn

INTERRUPTED = "interrupted; nothing was written"


def console_main() -> NoReturn:
    """Entry point of the console script: exit code 0, or the command's SystemExit code.

    The CLI is imported inside the `try`: a Ctrl-C while it is still importing (~0.2 s) is an interrupt like any
    other (exit 130, one line), not a KeyboardInterrupt traceback."""
    try:
        from repair.cli.main import main

        main()
    except SystemExit as stop:
        leave(exit_code(stop.code))
    except KeyboardInterrupt:
        interrupted_while_importing()
    leave(0)


def interrupted_while_importing() -> NoReturn:
    """Ctrl-C before the CLI's own handler is in place: one line and exit 130, as `main` says it later."""
    print(INTERRUPTED, file=sys.stderr)
    leave(130)


def exit_code(code: object) -> int:
    """The status Python itself would exit with for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): the message goes to stderr, status 1
    return 1


def leave(code: int) -> NoReturn:
    """Exit with `code` without the interpreter's teardown, once nothing can be lost by it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _finished)
    if _worker_alive() or not hasattr(atexit, "_run_exitfuncs"):
        _flush()
        sys.exit(code)  # the ordinary shutdown joins the worker (or we cannot run the handlers)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # e.g. a closed pipe: let the ordinary shutdown report it as before
        sys.exit(code)
    os._exit(code)


def _finished(signum: int, frame: object) -> NoReturn:
    """A Ctrl-C once the command has finished (its output complete, its lines printed): it only cuts the exit short,
    e.g. the wait for a worker thread, so one line and exit 130, never a KeyboardInterrupt out of threading's code."""
    _flush()
    os.write(2, b"interrupted; the command had already finished\n")
    os._exit(130)


def _flush() -> None:
    """Best effort: a flush cut short by the Ctrl-C itself (a reentrant call) or a closed pipe loses what it held."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):
            pass


def _worker_alive() -> bool:
    main_thread = threading.main_thread()
    return any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate())
