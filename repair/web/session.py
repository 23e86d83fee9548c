"""Who is asking, and with which token. On a Space: the Hugging Face OAuth sign-in (gradio's OAuthProfile
and OAuthToken). Locally: the machine's own login (HF_TOKEN or `hf auth login`), read once at start; the
sign-in button's local mock names that same account. The token is held in values whose repr hides it,
and leaves the server only on a worker's stdin."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from repair.errors import RepairError
from repair.hub.access import whoami
from repair.hub.errors import LOGIN


@dataclass(frozen=True)
class Identity:
    user: str | None  # the Hub account name; None: not signed in
    token: str | None = field(default=None, repr=False)

    @property
    def signed_in(self) -> bool:
        return self.user is not None


@dataclass(frozen=True)
class Login:
    """How this server signs people in: on a Space by OAuth; locally as the machine's account."""

    space: bool
    local: Identity = Identity(None)
    problem: str | None = None  # locally: why there is no account (no token, or the Hub refused it)

    def identify(self, profile, oauth) -> Identity:
        """The caller's identity from gradio's injected OAuthProfile / OAuthToken (None when signed out)."""
        if profile is None:
            return Identity(None, None if self.space else self.local.token)
        if self.space:
            return Identity(profile.username, oauth.token if oauth is not None else None)
        return Identity(self.local.user, self.local.token)  # the local mock's profile is this account


def on_space() -> bool:
    """Running as a Hugging Face Space (people sign in by OAuth), not on someone's machine."""
    return bool(os.environ.get("SYSTEM") == "spaces" and os.environ.get("SPACE_ID"))


def default_host() -> str:
    """Where the app file listens: everywhere on a Space (its proxy is the way in); elsewhere only on
    127.0.0.1, since off a Space the page lends the machine's login to whoever reaches it."""
    return os.environ.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if on_space() else "127.0.0.1")


def local_login() -> Login:
    """The machine's saved login or HF_TOKEN, and whose it is (asked of the Hub once)."""
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        return Login(False, problem=f"no Hugging Face login on this machine: {LOGIN}, then restart `ckpt-repair serve`")
    try:
        user = whoami("the login on this machine").user
    except RepairError as err:
        return Login(False, problem=str(err))
    return Login(False, Identity(user or None, token))
