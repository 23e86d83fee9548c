"""The tool's own error types.

Every error a user can cause carries the one line they see: what is wrong, where, and what
to do. The CLI prints that line and exits 2; nothing else reaches the user as a traceback.
A failed check of the tool's own plan or output is an InternalError (exit 3): a bug in
ckpt-repair, never blamed on the input.
"""

from __future__ import annotations


class RepairError(Exception):
    """Base of every error the tool raises on purpose; `str(err)` is the user-facing line."""

    exit_code = 2

    def __init__(self, message: str = ""):
        super().__init__(one_line(str(message)))


def one_line(text: str) -> str:
    """Escape newlines and other control characters: names read from a broken file may hold
    anything, and the error must stay one line that cannot forge more output."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class BadInput(RepairError):
    """The checkpoint (or another file we were given) is malformed or unsupported."""


class UsageError(RepairError):
    """The command line or recipe asks for something that cannot be done."""


class OutputError(RepairError):
    """The output location cannot be written as asked (exists, inside the input, disk full)."""


class InternalError(RepairError):
    """A check of our own plan or output failed: a bug in ckpt-repair, not in the input.

    Raised only before anything is published, so the line can promise that; it never tells the
    user to change or delete their files.
    """

    exit_code = 3

    def __init__(self, check: str, detail: str):
        super().__init__(
            f"internal error: {check} failed: {detail}; this is a bug in ckpt-repair, not in the input; nothing was published and the "
            "input is unchanged; please report it to the ckpt-repair issue tracker with the command line you ran"
        )


def short(value: object, limit: int = 80) -> str:
    """repr() of a value read from hostile data, cut to fit in an error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def where(path: object, tensor: str | None = None) -> str:
    """Format a location as `file` or `file: tensor` for error lines."""
    return f"{path}: {tensor}" if tensor else str(path)


def interrupted(exc: BaseException | None) -> bool:
    """Whether a Ctrl-C (or SIGTERM, which the CLI turns into one) caused `exc`: Python 3.11 wraps one arriving while a
    class is created (a dataclass field's __set_name__, in any import) in a RuntimeError whose cause it is."""
    for _ in range(16):  # a cause chain a program can make circular or long: a bounded walk
        if exc is None or isinstance(exc, KeyboardInterrupt):
            return exc is not None
        exc = exc.__cause__
    return False
