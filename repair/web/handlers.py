"""What each button does: read the widgets, ask a worker or the job table, return the page's text.

Every handler returns one line for every failure (the library's own line where it has one) and never
raises into gradio, whose bare "Error" toast is what users of other Spaces complain about.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from repair.errors import RepairError, UsageError, one_line
from repair.hub.errors import LOGIN, scrub
from repair.hub.source import WORK_PREFIX
from repair.hub.spec import REPO_ID
from repair.io import staging
from repair.io.names import inside, name_problem
from repair.web.choices import cli_options
from repair.web.jobs import JobTable
from repair.web.render import NOT_QUANTIZED
from repair.web.spares import Spares
from repair.web.session import Identity, Login

SIGN_IN = "sign in with Hugging Face (the button at the top) with an account that may read it"
DOCTOR_TIMEOUT = 600
MAX_ID_CHARS = 300  # owner/name is at most 193 characters; the rest is room for @revision
MAX_TP = 256  # doctor simulates every rank: a page open to anyone bounds the work one click may ask for


@dataclass(frozen=True)
class Server:
    """What the handlers share: how people sign in, the jobs, where workers run, the local root (if any)."""

    login: Login
    jobs: JobTable
    spares: Spares
    root: Path | None = None


def one_line_errors(blank):
    """A handler whose failures become the page's outputs for one error line (`blank(line)`), never a traceback."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except RepairError as err:
                return blank(str(err))
            except Exception as exc:  # noqa: BLE001 - one line, and the bug is named as ours
                return blank(scrub(one_line(f"internal error in the web page: {type(exc).__name__}: {exc}; this is a bug in "
                                            "ckpt-repair, please report it")))
        return wrapper
    return decorate


def source_of(server: Server, repo: str, local: str | None) -> str:
    """The source a worker opens: a Hub repo id `owner/name[@revision]`, or a folder under the root
    (never outside it). A repo id is never read as a local path (workers run in an empty folder)."""
    if local:
        if server.root is None:
            raise UsageError("local folders are not offered by this server (start it with --root DIR)")
        why = name_problem(local) or ("names a hidden folder" if any(p.startswith(".") for p in local.split("/")) else None)
        if why:
            raise UsageError(f"local folder {local!r} {why}; choose one the list offers")
        path = inside(server.root, local, server.root, "choose a folder under the root")
        if not path.is_dir():
            raise UsageError(f"{local}: no such folder under {server.root}")
        return str(path)
    text = _short((repo or "").strip(), "the Hub repo id", "owner/name or owner/name@revision")
    name, at, revision = text.partition("@")
    if not text:
        raise UsageError("give a Hub repo id, owner/name or owner/name@revision")
    if not REPO_ID.fullmatch(name) or "--" in name or ".." in name:
        raise UsageError(f"{text!r} is not a Hub repo id: expected owner/name or owner/name@revision (a branch, tag or commit)")
    if at and (not revision or revision.strip() != revision or re.search(r"[\x00-\x1f\x7f]", revision)):
        raise UsageError(f"{text}: empty or malformed revision after '@'; give a branch, tag or commit sha")
    return text


def _short(text: str, what: str, expected: str) -> str:
    """`text`, refused without echoing it when no valid name is that long (anyone may paste a megabyte)."""
    if len(text) > MAX_ID_CHARS:
        raise UsageError(f"{what} is {len(text):,} characters long: expected {expected}, at most {MAX_ID_CHARS} characters")
    return text


def targets_of(value) -> str:
    """The target field's choices as one `--target` value (`a,b`, as the CLI takes it); each part may itself be
    a typed list. The library resolves and checks every part (repair.targets.profiles.resolve_many)."""
    parts = [str(v).strip() for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None and str(v).strip()]
    if not parts:
        raise UsageError("choose a runtime and release in the target field (one or several), e.g. vllm==0.32.0")
    return _short(",".join(parts), "the target list", "runtime==X.Y.Z, comma-separated")


def tp_degree(value) -> int:
    try:
        degree = 1 if value is None else int(value)
    except (TypeError, ValueError, OverflowError):
        degree = 0
    if not 1 <= degree <= MAX_TP:
        raise UsageError(f"tensor-parallel degree {value!r}: give a whole number from 1 to {MAX_TP}")
    return degree


def worker_line(server: Server, line: str) -> str:
    """A library line as the page should say it, not the CLI's HF_TOKEN / `hf auth login`: on a Space, signing in is
    how a visitor gives a token; locally the page reads the Hub with this machine's login, whose account it names."""
    if server.login.space:
        return line.replace(LOGIN, SIGN_IN)
    user = server.login.local.user
    local = (f"this page reads the Hub as {user}, this machine's login; for another account run `hf auth login` on this "
             "machine, then restart `ckpt-repair serve`") if user else (
        "this page has no Hugging Face login; run `hf auth login` on this machine, then restart `ckpt-repair serve`")
    return line.replace(LOGIN, local)


def run_doctor(server: Server, who: Identity, request: dict) -> dict:
    """doctor + inspect + plan in a worker with the caller's token; the worker's one line on failure."""
    proc = server.spares.take()
    try:
        out, _ = proc.communicate(json.dumps({**request, "token": who.token}), timeout=DOCTOR_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise UsageError(f"{request['source']}: doctor took longer than {DOCTOR_TIMEOUT} s; try again later") from None
    finally:  # a worker killed (here, or by anything else) leaves its work folder: removed now, by the marker and pid rule
        if proc.poll() is not None:
            staging.remove_stale(server.spares.tmp, WORK_PREFIX)
    try:
        answer = json.loads(out)
    except ValueError:
        raise UsageError(f"{request['source']}: the worker ended without an answer (status {proc.returncode}); try again") from None
    if not answer.get("ok"):
        raise UsageError(worker_line(server, answer.get("error") or "the worker failed without saying why"))
    return answer


def fix_request(analysis: dict | None, mode: str, fork: str, private: bool, who: Identity) -> dict:
    """The job a fix button asks for, checked: the analysed Hub source, a PR or a named fork."""
    if not who.signed_in:
        raise UsageError("sign in with Hugging Face first (the button at the top): the fix is committed as you")
    if not analysis:
        raise UsageError("check a repo first: the fix is planned from what the check found")
    if analysis.get("local"):
        raise UsageError("a local folder cannot be published from the page; run `ckpt-repair fix` on it")
    if not analysis.get("quantized", True):
        raise UsageError(NOT_QUANTIZED)
    if analysis.get("plan_error") or analysis.get("noop"):
        raise UsageError(analysis.get("plan_error") or "nothing to repair: the fix would change nothing")
    request = {k: analysis[k] for k in ("source", "target", "recipe", "bytes")}
    if mode == "fork":
        name = _short((fork or "").strip(), "the fork name", "owner/name") or f"{who.user}/{default_fork(analysis['source'].split('@')[0].split('/')[1])}"
        if not REPO_ID.fullmatch(name) or "--" in name or ".." in name:
            raise UsageError(f"fork name {name!r}: expected owner/name (your account or an organization you may write to)")
        request.update(mode="fork", fork=name, private=bool(private))
    else:
        request.update(mode="pr")
    return request


MAX_NAME = 96  # the Hub's limit on a repo name (huggingface_hub's validate_repo_id)
SUFFIX = "-fixed"


def default_fork(name: str) -> str:
    """`<name>-fixed`; when that passes the Hub's 96 characters, the name cut short plus 8 hex of its sha256, so
    the same source always gets the same fork and two long names that share a beginning get two."""
    if len(name) + len(SUFFIX) <= MAX_NAME:
        return name + SUFFIX
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    kept = name[:MAX_NAME - len(SUFFIX) - len(digest) - 1].rstrip("-.")  # no `--`, `.-` or `..` at the cut
    return f"{kept}-{digest}{SUFFIX}"


def command_line(analysis: dict, request: dict) -> str:
    """The `ckpt-repair hub fix` command that does the same, for the page and the user's notes."""
    where = ["--pr"] if request["mode"] == "pr" else ["--to", request["fork"]] + (["--private"] if request.get("private") else [])
    return shlex.join(["ckpt-repair", "hub", "fix", analysis["source"], *where, *cli_options(analysis.get("recipe"), analysis.get("target"))])
