"""The web app's worker process: `python -m repair.web.worker doctor|fix JOBDIR`, one per request or job.

The server never runs library work with a user's token in its own process: a worker gets the request
(JSON, with the user's token) on stdin, makes the token its own HF_TOKEN before huggingface_hub is
imported (`use_token`: so huggingface_hub, and the error scrubber, find it and nothing else), runs the
library, and answers on stdout (doctor) or in JOBDIR/status.json (fix). Its imports come first, so the
server can start a doctor worker before anyone asks (handlers.Spares). Every failure the library reports as one line comes back as that line;
anything else becomes one line that names the bug as ours, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from repair.errors import RepairError
from repair.hub.errors import scrub
from repair.web.analyze import analyze
from repair.web.fixjob import run_fix
from repair.web.progress import phase_of

STATUS = "status.json"


def use_token(token: str | None) -> None:
    """The user's token as this process's HF_TOKEN or, signed out, no token at all: never a login saved on the
    server's machine, nor a Space's own HF_TOKEN secret. Before huggingface_hub reads its settings at import."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_DISABLE_IMPLICIT_TOKEN"):
        os.environ.pop(name, None)
    if token:
        os.environ["HF_TOKEN"] = token
    else:
        os.environ.update(HF_TOKEN_PATH=os.devnull, HF_HUB_DISABLE_IMPLICIT_TOKEN="1")
    if "huggingface_hub" in sys.modules:  # imported early after all: its settings are read again
        from huggingface_hub import constants

        constants.HF_TOKEN_PATH = os.environ.get("HF_TOKEN_PATH", constants.HF_TOKEN_PATH)
        constants.HF_HUB_DISABLE_IMPLICIT_TOKEN = not token


def read_request() -> dict:
    request = json.loads(sys.stdin.read() or "{}")
    use_token(request.pop("token", None))
    return request


class Status:
    """JOBDIR/status.json, rewritten whole (write then rename) on every change; the page polls it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.lock = threading.Lock()
        self.value = {"state": "running", "phase": "checking the source and the destination", "lines": [],
                      "progress": {}, "result": None, "error": None, "started": time.time(), "pid": os.getpid()}

    def update(self, **changes) -> None:
        with self.lock:
            self.value.update(changes)
            tmp = self.folder / f".{STATUS}.{os.getpid()}"
            tmp.write_text(json.dumps(self.value))
            os.replace(tmp, self.folder / STATUS)

    def say(self, line: str) -> None:
        self.update(lines=self.value["lines"] + [line], phase=phase_of(line, self.value["phase"]))


def fix(request: dict, folder: Path) -> None:
    status = Status(folder)
    status.update()
    try:
        result = run_fix(request, folder, status)
    except RepairError as err:
        status.update(state="failed", error=str(err), phase="failed", ended=time.time())
        return
    except Exception as exc:  # noqa: BLE001 - the page shows one line, never a traceback
        status.update(state="failed", phase="failed", error=unexpected(exc), ended=time.time())
        return
    status.update(state="done", phase="done", result=result, ended=time.time())


def unexpected(exc: BaseException) -> str:
    return scrub(f"internal error in the worker: {type(exc).__name__}: {exc}; this is a bug in ckpt-repair; "
                 "please report it with the repo id you gave").splitlines()[0]


def main(argv: list[str]) -> int:
    request = read_request()
    if argv[:1] == ["doctor"]:
        try:
            answer = {"ok": True, **analyze(request)}
        except RepairError as err:
            answer = {"ok": False, "error": str(err)}
        except Exception as exc:  # noqa: BLE001
            answer = {"ok": False, "error": unexpected(exc)}
        sys.stdout.write(json.dumps(answer))
        return 0
    if argv[:1] == ["fix"] and len(argv) == 2:
        fix(request, Path(argv[1]))
        return 0
    sys.stderr.write("usage: python -m repair.web.worker doctor|fix JOBDIR\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
