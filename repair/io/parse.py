"""The one error path for parsing user data: JSON, TOML and UTF-8 text (regular expressions: io/patterns.py).

Each of these parsers fails in more ways than its documented error: a lone byte that is not
UTF-8, nesting deep enough to exhaust the recursion limit (RecursionError), a number longer than
Python's int-string limit (ValueError). Every file and recipe a user gives us is parsed
here, so any such failure becomes one line naming the source, of the error type the caller picks
(BadInput for a checkpoint's files, UsageError for recipes and command-line patterns), and never
a traceback.
"""

from __future__ import annotations

import gc
import json
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from repair.errors import BadInput, RepairError
from repair.io.names import file_type_problem

ErrorType = type[RepairError]


def read_text(path: Path, fix: str, error: ErrorType = BadInput) -> str:
    """A file's UTF-8 text; `fix` is the next step the error line gives. Its type is checked with
    stat first: a FIFO would block the read forever, a device (/dev/zero) would fill the memory."""
    why = file_type_problem(path)
    if why is not None and why != "is missing" and not why.startswith("cannot be read"):
        raise error(f"{path}: {why}; {fix}")
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror}); {fix}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); {fix}") from None


def parse_json(text: str | bytes, where: object, fix: str, error: ErrorType = BadInput,
               object_pairs_hook: Callable | None = None) -> object:
    """JSON text as Python values; every way decoding fails is one line naming `where`."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}; {fix}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte {exc.start}); {fix}") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read; {fix}") from None
    except ValueError as exc:  # an over-long number: Python's int-string conversion limit
        raise error(f"{where}: JSON value cannot be read ({_first_clause(exc)}); {fix}") from None


def parse_toml(text: str, where: object, fix: str, error: ErrorType = BadInput) -> dict:
    """TOML text as a dict; every way decoding fails is one line naming `where`."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: invalid TOML: {exc}; {fix}") from None
    except RecursionError:
        raise error(f"{where}: TOML nested too deeply to read; {fix}") from None
    except ValueError as exc:
        raise error(f"{where}: TOML value cannot be read ({_first_clause(exc)}); {fix}") from None


def _first_clause(exc: Exception) -> str:
    return str(exc).split(";")[0].strip()[:120]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a large header is parsed and read: ~10 objects per tensor and no cycles
    among them, and the collector (run every 700 allocations, the older generations over the whole growing heap)
    took a quarter of doctor's time on 180k tensors. Reference counting still frees everything; restored after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
