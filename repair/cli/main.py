"""The `ckpt-repair` command line: parse, call the API, print. Nothing else lives here.

Each command lives in its own module (`repair/cli/<name>_cmd.py`), imported only when that command
runs (or `--help` lists it), so a header-only command pays for its own imports alone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from contextlib import contextmanager

import click

from repair.version import __version__
from repair.cli.lazy import LazyGroup
from repair.errors import RepairError, interrupted, one_line
from repair.io.output import PUBLISHED

HOOK = os.environ.get("CKPT_REPAIR_INTERRUPT_AT_IMPORT", "")  # tests: a Ctrl-C arriving while the CLI is still importing
if HOOK == "wrapped":  # as Python 3.11 wraps one arriving while a class is created
    raise RuntimeError("Error calling __set_name__ (a Ctrl-C in a class body)") from KeyboardInterrupt()
if HOOK and HOOK != "wrapped-later":
    os.kill(os.getpid(), signal.SIGINT)

CANNOT_START_THREAD = "can't start new thread"  # CPython's RuntimeError when the system refuses a thread
COMMANDS = {name: f"repair.cli.{name}_cmd:{name}" for name in ("demo", "doctor", "fix", "hub", "inspect", "recipes", "serve", "unshard")}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckpt-repair")
def cli() -> None:
    """Repair quantized checkpoints so the runtime that loads them accepts them."""


def say(as_json: bool, payload: dict, text: str) -> None:
    click.echo(json.dumps(payload, indent=2) if as_json else text)


def main(argv: list[str] | None = None) -> None:
    """Entry point: tool errors become one line on stderr and their exit code (2 bad input, 3 internal error)."""
    _printable_paths()
    PUBLISHED.clear()  # per run: an in-process caller (the tests, the API user) runs main more than once
    with _terminate_as_interrupt():
        _run(argv)


def _run(argv: list[str] | None) -> None:
    try:
        cli.main(args=argv, prog_name="ckpt-repair", standalone_mode=False)
    except RepairError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:  # click turns Ctrl-C into Abort
        _interrupted()
    except click.ClickException as err:  # a usage error: one line like every other refusal, naming the help to read
        ctx = getattr(err, "ctx", None)
        command = ctx.command_path if ctx is not None else "ckpt-repair"
        click.echo(f"error: {one_line(err.format_message()).rstrip('.')}; see `{command} --help`", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _interrupted()
    except MemoryError:
        _ran_out("out of memory")
    except RuntimeError as err:
        if str(err) == CANNOT_START_THREAD:
            _ran_out("the system refused to start a thread (can't start new thread: out of memory, or of the threads "
                     "ulimit -u or a container's pids limit allows)")
        if not interrupted(err):
            _bug(err)
        _interrupted()
    except Exception as err:  # noqa: BLE001 - no check raised it: a bug of ours, said as the README promises
        _bug(err)


def _bug(err: Exception) -> None:
    """An exception no check of ours raised is a bug in ckpt-repair: one line and exit 3, never a traceback on the
    terminal of someone whose input is fine. The traceback goes to a file the line names, for the report;
    CKPT_REPAIR_TRACEBACK=1 raises it as it is instead (the test suite, debugging)."""
    if os.environ.get("CKPT_REPAIR_TRACEBACK"):
        raise err
    click.echo(f"error: internal error: {type(err).__name__}: {one_line(str(err))[:300]}; this is a bug in ckpt-repair, "
               f"not in the input; {_written()}; please report it with the command line you ran{_saved(err)}", err=True)
    sys.exit(3)


def _saved(err: Exception) -> str:
    """Where the traceback was written (never the command line itself: it may hold a token)."""
    import tempfile
    import traceback

    try:
        fd, path = tempfile.mkstemp(prefix="ckpt-repair-bug-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as out:
            out.write(f"ckpt-repair {__version__}, Python {sys.version.split()[0]}\n")
            traceback.print_exception(err, file=out)
    except OSError:
        return " (CKPT_REPAIR_TRACEBACK=1 prints where it happened)"
    return f" and the traceback saved in {path}"


def _ran_out(what: str) -> None:
    """The machine ran out of something mid-run (not the input's fault, nor a check of ours): one line and exit 2."""
    click.echo(f"error: {what}; {_written()}; free some (stop other work or raise the limit), then re-run", err=True)
    sys.exit(2)


@contextmanager
def _terminate_as_interrupt():
    """SIGTERM (a service manager, `timeout`, the web page's shutdown) does what Ctrl-C does for the whole run, so
    every command's cleanup runs: `hub fix`'s work folder of downloaded shards, a Hub doctor's mirror. Without it
    SIGTERM ends the process at once and leaves them for the next run's stale-folder removal. A parent's SIG_IGN is
    kept; `fix`'s writer installs its own gate while it writes (io/staging.interrupts_raise)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _interrupted() -> None:
    """Ctrl-C / SIGTERM: after OUT was published (the summary was being printed) it is complete, not absent."""
    click.echo(f"interrupted; {_written()}", err=True)
    sys.exit(130)


def _written() -> str:
    return f"{PUBLISHED[-1]} was already written and is complete" if PUBLISHED else "nothing was written"


def _printable_paths() -> None:
    """A path with a byte that is not UTF-8 reaches print as a lone surrogate; a UTF-8 terminal's strict
    encoder would turn the summary or the one error line into a traceback. Print it as `\\udcff`."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
