"""huggingface_hub's errors as the tool's one-line errors, with any token scrubbed out.

huggingface_hub's messages carry URLs, request ids and server text; ours say what failed, where and
what to do. Everything that leaves this module is passed through `scrub`, which removes the current
token (and anything token-shaped), so no error line, log or report can show it.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

from repair.errors import BadInput, OutputError, RepairError, UsageError

_TOKENISH = re.compile(r"(hf_[A-Za-z0-9]{6,}|(?i:bearer)\s+\S+)")
LOGIN = "set HF_TOKEN or run `hf auth login`"


def scrub(text: str) -> str:
    """`text` without the current token or anything that looks like one."""
    try:
        from huggingface_hub import get_token

        token = get_token()
    except Exception:  # no token, or an auth helper failing: nothing to remove but the patterns
        token = None
    if token:
        text = text.replace(token, "***")
    return _TOKENISH.sub("***", text)


@contextmanager
def hub_call(subject: str, *, writing: bool = False, missing: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub / transport errors raised inside into the tool's errors about `subject`.

    `missing` is the message for a 404 on a file (EntryNotFound); `writing` marks uploads and commits,
    whose failures are OutputErrors that say nothing was committed.
    """
    try:
        yield
    except RepairError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below; anything unknown is re-raised as is
        mapped = translate(exc, subject, writing=writing, missing=missing)
        if mapped is None:
            raise
        raise mapped from None


def translate(exc: BaseException, subject: str, *, writing: bool = False, missing: str | None = None) -> RepairError | None:
    from huggingface_hub import errors as hf

    where = f"{subject}: "
    after = "; nothing was committed, re-run the same command" if writing else ""
    if isinstance(exc, hf.GatedRepoError):
        return BadInput(f"{where}the repo is gated: accept its conditions on the Hub page, then {LOGIN}")
    if isinstance(exc, hf.RepositoryNotFoundError):
        return BadInput(f"{where}no such model repo on {_endpoint()} (or it is private: {LOGIN})")
    if isinstance(exc, hf.RevisionNotFoundError):
        return BadInput(f"{where}no such revision (branch, tag or commit); check the name after '@'")
    if isinstance(exc, hf.EntryNotFoundError) and not isinstance(exc, hf.LocalEntryNotFoundError):
        return BadInput(f"{where}{missing or 'file not found in the repo at the pinned commit'}")
    if isinstance(exc, hf.HfHubHTTPError) and getattr(exc, "response", None) is not None:
        return _http(exc, where, writing, after)
    if isinstance(exc, hf.LocalTokenNotFoundError):
        return UsageError(f"{where}no token found: {LOGIN}")
    if isinstance(exc, (hf.OfflineModeIsEnabled,)):
        return UsageError(f"{where}HF_HUB_OFFLINE is set; unset it to use Hub repos")
    if _is_transport(exc) or isinstance(exc, (hf.LocalEntryNotFoundError, ConnectionError, TimeoutError)):
        kind = type(exc).__name__
        what = f"cannot reach {_endpoint()}" if "Connect" in kind or isinstance(exc, hf.LocalEntryNotFoundError) else \
            f"the connection to {_endpoint()} failed"
        return OutputError(scrub(f"{where}{what} ({kind}); check the network or HF_ENDPOINT{after}"))
    if isinstance(exc, RuntimeError) and "upload" in str(exc).lower():
        cause = exc.__cause__ or exc.__context__
        detail = type(cause).__name__ if cause is not None else "upload error"
        return OutputError(scrub(f"{where}upload failed ({detail}){after or '; re-run the same command'}"))
    if isinstance(exc, hf.HFValidationError):
        return UsageError(scrub(f"{where}{_first_line(exc)}"))
    if isinstance(exc, ValueError) and "metadata" in str(exc).lower():
        return OutputError(scrub(f"{where}the Hub refused the model card ({_first_line(exc)}){after}"))
    if isinstance(exc, (FileNotFoundError, EOFError)):
        return BadInput(scrub(f"{where}{_first_line(exc)}; the file changed or vanished on the Hub, re-run"))
    return None


def _http(exc, where: str, writing: bool, after: str) -> RepairError:
    status = exc.response.status_code
    said = f" ({_first_line(exc.server_message)})" if getattr(exc, "server_message", None) else ""
    if status == 401:
        return BadInput(scrub(f"{where}not authorized{said}: {LOGIN} with a token that can {'write' if writing else 'read'} it"))
    if status == 403:
        return BadInput(scrub(f"{where}the token may not {'write to' if writing else 'read'} this repo{said}; use a token with that access"))
    if status == 412:
        return OutputError(scrub(f"{where}the repo changed while this run was working{said}{after}"))
    if status == 429:
        return OutputError(scrub(f"{where}the Hub is rate-limiting requests{said}; wait and re-run"))
    kind = OutputError if writing or status >= 500 else BadInput
    return kind(scrub(f"{where}the Hub answered HTTP {status}{said}{after or '; re-run, or check the repo'}"))


def _is_transport(exc: BaseException) -> bool:
    """httpx-family transport errors (huggingface_hub's HTTP library), without importing it by name."""
    from huggingface_hub import errors as hf

    base = getattr(hf, "HTTPError", None)
    return base is not None and isinstance(exc, base) and not isinstance(exc, hf.HfHubHTTPError)


def _first_line(value: object) -> str:
    line = str(value).strip().splitlines()[0] if str(value).strip() else ""
    return line[:200]


def _endpoint() -> str:
    from repair.hub.client import endpoint

    return endpoint()
