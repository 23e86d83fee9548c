"""A stand-in for the Hub's OpenID provider on 127.0.0.1, so the page runs exactly as on a Space (SYSTEM=spaces,
OAUTH_* variables, gradio's real OAuth routes and authlib) with more than one account.

/authorize shows one link per account ("Sign in as alice"); following it returns to the app with a code;
/token answers with that account's Hub token as the access token and an id_token signed with an HS256
key published at /jwks, as the Hub's provider does with its own keys.
"""

from __future__ import annotations

import html
import json
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from joserfc import jwt
from joserfc.jwk import OctKey

CLIENT_ID = "ckpt-repair-test-client"
CLIENT_SECRET = "test-client-secret"


class Provider:
    def __init__(self, accounts: dict[str, str]):
        self.accounts = dict(accounts)  # user name -> Hub token
        self.key = OctKey.import_key(secrets.token_bytes(32), {"kid": "test-key"})
        self.codes: dict[str, tuple[str, str | None]] = {}  # code -> (user, nonce)
        self.lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                provider.get(self)

            def do_POST(self):
                provider.post(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "Provider":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def env(self) -> dict:
        """What a Space gives the app (hf_oauth: true), pointing here."""
        return {"SYSTEM": "spaces", "SPACE_ID": "test/ckpt-repair", "OAUTH_CLIENT_ID": CLIENT_ID, "OAUTH_CLIENT_SECRET": CLIENT_SECRET,
                "OAUTH_SCOPES": "openid profile read-repos gated-repos contribute-repos write-discussions", "OPENID_PROVIDER_URL": self.url}

    def get(self, h) -> None:
        path, _, query = h.path.partition("?")
        params = dict(urllib.parse.parse_qsl(query))
        if path == "/.well-known/openid-configuration":
            return _json(h, {"issuer": self.url, "authorization_endpoint": f"{self.url}/authorize", "token_endpoint": f"{self.url}/token",
                             "userinfo_endpoint": f"{self.url}/userinfo", "jwks_uri": f"{self.url}/jwks",
                             "id_token_signing_alg_values_supported": ["HS256"], "response_types_supported": ["code"]})
        if path == "/jwks":
            return _json(h, {"keys": [self.key.as_dict(private=True)]})
        if path == "/authorize":
            links = []
            for user in self.accounts:
                code = secrets.token_hex(8)
                with self.lock:
                    self.codes[code] = (user, params.get("nonce"))
                back = params["redirect_uri"] + ("&" if "?" in params["redirect_uri"] else "?") + urllib.parse.urlencode(
                    {"code": code, "state": params.get("state", "")})
                links.append(f"<p><a id='as-{user}' href='{html.escape(back, quote=True)}'>Sign in as {user}</a></p>")
            body = ("<html><body><h1>Hugging Face (test provider)</h1><p>Authorize ckpt-repair to act for you:</p>"
                    + "".join(links) + "</body></html>").encode()
            h.send_response(200)
            h.send_header("Content-Type", "text/html")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return None
        return _json(h, {"error": "not found"}, 404)

    def post(self, h) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        form = dict(urllib.parse.parse_qsl(h.rfile.read(length).decode()))
        if h.path != "/token":
            return _json(h, {"error": "not found"}, 404)
        with self.lock:
            found = self.codes.pop(form.get("code", ""), None)
        if found is None:
            return _json(h, {"error": "invalid_grant"}, 400)
        user, nonce = found
        now = int(time.time())
        claims = {"iss": self.url, "sub": f"sub-{user}", "aud": CLIENT_ID, "iat": now, "exp": now + 3600, "name": user.title(),
                  "preferred_username": user, "profile": f"{self.url}/{user}", "picture": "", **({"nonce": nonce} if nonce else {})}
        id_token = jwt.encode({"alg": "HS256", "kid": "test-key"}, claims, self.key)
        return _json(h, {"access_token": self.accounts[user], "token_type": "bearer", "expires_in": 3600, "id_token": id_token,
                         "scope": "openid profile"})


def _json(h, value: dict, status: int = 200) -> None:
    body = json.dumps(value).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)
