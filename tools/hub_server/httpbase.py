"""HTTP plumbing shared by all routes: body reading, JSON answers, auth, request log, fault injection."""

from __future__ import annotations

import json
import logging
import socket
import struct
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote

from .errors import HubError

logger = logging.getLogger("tools.hub_server")

MAX_JSON_BODY = 512 * 1024 * 1024  # commit payloads carry base64 regular files
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it. ``status`` is 0 when the server reset the connection (fault injection)."""

    method: str
    path: str  # percent-decoded URL path, e.g. "/alice/model/resolve/main/model.safetensors"
    query: str  # raw query string ("" when none)
    range: str | None  # the Range header, if any
    status: int


@dataclass(frozen=True)
class UploadFault:
    n_bytes: int
    status: int | None  # None: reset the connection; else answer this status


class _Aborted(Exception):
    def __init__(self, fault: UploadFault):
        super().__init__("upload aborted by fault injection")
        self.fault = fault


class HubRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "LocalHub/1.0"
    timeout = 120  # idle keep-alive connections are dropped after this many seconds

    def log_message(self, format, *args):  # noqa: A002 - quiet server
        pass

    def setup(self):
        super().setup()
        self.server.hub._track(self.connection, True)

    def do_GET(self):
        self._handle("GET")

    def do_HEAD(self):
        self._handle("HEAD")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_DELETE(self):
        self._handle("DELETE")

    # ------------------------------------------------------------ dispatch
    def _handle(self, method: str) -> None:
        self.method = method
        self.hub = self.server.hub
        self.store = self.hub.store
        raw_path, _, self.raw_query = self.path.partition("?")
        self.segs = [unquote(s) for s in raw_path.split("/")[1:]]
        self.query = parse_qs(self.raw_query, keep_blank_values=True)
        self.status_sent = 0
        self._headers_sent = False
        self._body_consumed = not self._has_body()
        self._fault: UploadFault | None = None
        self._reset = False
        self._recorded = False
        try:
            self.hub._dispatch(self)
        except _Aborted as aborted:
            self._abort(aborted.fault)
        except HubError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # a server bug: answer 500 (the client may retry) and log it
            logger.exception("LocalHub internal error on %s %s", method, self.path)
            self._send_error(HubError(500, "LocalHub internal error"))
        finally:
            self._record(self.status_sent)

    def _record(self, status: int) -> None:
        """Log the request once, *before* the client can see any answer (so the log is complete on return)."""
        if not self._recorded:
            self._recorded = True
            self.hub._record(RequestRecord(self.method, unquote(self.path.partition("?")[0]), self.raw_query,
                                           self.headers.get("Range"), status))

    def _send_error(self, err: HubError) -> None:
        if self._headers_sent:
            self.close_connection = True
            return
        headers = {"X-Error-Message": _header_safe(err.message), **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self.send_json(err.status, {"error": err.message, **err.extra}, headers)

    def _abort(self, fault: UploadFault) -> None:
        self.close_connection = True
        if fault.status is None:
            self._reset = True  # the socket is closed with SO_LINGER=0 in finish(): the client sees a reset
            self.status_sent = 0
            self._record(0)
        else:
            self.send_json(fault.status, {"error": "Simulated upload failure (LocalHub fault injection)"},
                           {"X-Error-Message": "Simulated upload failure", "Connection": "close"})

    def finish(self):
        self.server.hub._track(self.connection, False)
        if not self._reset_requested():
            return super().finish()
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()
            self.wfile.close()
        finally:
            self.connection.close()

    def _reset_requested(self) -> bool:
        return getattr(self, "_reset", False)

    # ---------------------------------------------------------------- body
    def _has_body(self) -> bool:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return True
        try:
            return int(self.headers.get("Content-Length") or 0) > 0
        except ValueError:
            return False

    def arm_upload_fault(self) -> None:
        """Called by upload routes before reading the body: consumes one pending fault, if any."""
        self._fault = self.hub._take_fault()

    def iter_body(self):
        """Yield the request body in blocks (Content-Length or chunked). Honours an armed upload fault."""
        if self._body_consumed:
            if self._fault is not None:
                raise _Aborted(self._fault)
            return
        self._body_consumed = True
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            blocks = self._iter_chunked()
        else:
            blocks = self._iter_length(int(self.headers.get("Content-Length") or 0))
        seen = 0
        for block in blocks:
            seen += len(block)
            if self._fault is not None and seen >= self._fault.n_bytes:
                raise _Aborted(self._fault)
            yield block
        if self._fault is not None:  # body shorter than n_bytes: the upload still fails once it is read
            raise _Aborted(self._fault)

    def _iter_length(self, remaining: int):
        while remaining > 0:
            block = self.rfile.read(min(READ_CHUNK, remaining))
            if not block:
                raise HubError(400, "Request body ended early")
            remaining -= len(block)
            yield block

    def _iter_chunked(self):
        for _ in range(1 << 30):  # bounded: one iteration per chunk
            line = self.rfile.readline(1024)
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                for _ in range(64):  # trailer lines, then the blank line
                    if self.rfile.readline(1024) in (b"\r\n", b"\n", b""):
                        break
                return
            data = self.rfile.read(size)
            self.rfile.readline(16)
            yield data

    def read_body(self, limit: int = MAX_JSON_BODY) -> bytes:
        out, total = [], 0
        for block in self.iter_body():
            total += len(block)
            if total > limit:
                self.close_connection = True
                raise HubError(413, "Payload too large")
            out.append(block)
        return b"".join(out)

    def read_json(self):
        body = self.read_body()
        if not body:
            return {}
        try:
            return json.loads(body)
        except ValueError:
            raise HubError(400, "Body is not valid JSON") from None

    def read_form_or_json(self) -> dict:
        body = self.read_body()
        if "json" in self.headers.get("Content-Type", ""):
            return json.loads(body or b"{}")
        return {k: v for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}

    # ----------------------------------------------------------- answering
    def send_bytes(self, status: int, body: bytes, headers: dict | None = None,
                   content_type: str = "application/octet-stream", length: int | None = None) -> None:
        """Send headers, then ``body`` unless this is a HEAD (``length`` overrides Content-Length)."""
        if not self._body_consumed:  # never leave an unread body on a kept-alive connection
            self.close_connection = True
            headers = {**(headers or {}), "Connection": "close"}
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self._headers_sent = True
        self.status_sent = status
        if self.method != "HEAD" and body:
            self.wfile.write(body)

    def send_json(self, status: int, obj, headers: dict | None = None, content_type: str = "application/json"):
        self.send_bytes(status, json.dumps(obj).encode(), headers, content_type)

    def query_value(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default

    def query_int(self, name: str, default: int = 0) -> int:
        value = self.query_value(name)
        try:
            return int(value) if value not in (None, "") else default
        except ValueError:
            raise HubError(400, f"Query parameter {name!r} must be an integer") from None

    def query_flag(self, name: str) -> bool:
        return (self.query_value(name) or "").lower() in ("1", "true", "yes")

    # ---------------------------------------------------------------- auth
    def grant(self):
        """The known token's Grant (user, role), or None."""
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        return self.hub.grant_for(token) if scheme == "Bearer" else None

    def auth_state(self) -> str:
        if not self.headers.get("Authorization", ""):
            return "none"
        return "ok" if self.grant() is not None else "bad"

    def require_auth(self) -> str:
        state = self.auth_state()
        if state == "ok":
            return self.grant().user
        if state == "bad":
            raise HubError(401, "Invalid credentials in Authorization header")
        raise HubError(401, "You must be authenticated (Authorization: Bearer <token>) to do this")


def _header_safe(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ").encode("latin-1", "replace").decode("latin-1")[:500]
