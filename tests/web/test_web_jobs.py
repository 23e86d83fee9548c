"""Jobs that survive the browser: two users signed in by OAuth (as on a Space) run jobs at the same time and
each sees only their own; closing the tab does not stop a job and its address shows it again; a killed
worker leaves nothing behind and its page says what happened."""

from __future__ import annotations

import html
import json
import os
import shutil
import signal
import sys
import threading
import time

import pytest

from tests.web.conftest import REPO, App, hub_env
from tests.web.oidc_provider import Provider
from tests.web.web_helpers import Steps, check, fix, open_page, sign_in

TARGET = "vllm==0.32.0"
BOB_TOKEN = "hf_bob_test_token_0123456789"


@pytest.fixture(scope="module")
def space(hub, tmp_path_factory):
    """The page as a Space serves it: gradio's real OAuth against a test provider with two accounts."""
    hub.add_token(BOB_TOKEN, user="bob")
    with Provider({"alice": hub.token, "bob": BOB_TOKEN}) as provider:
        folder = tmp_path_factory.mktemp("space")
        app = App(folder, {**hub_env(hub, folder / "home"), **provider.env()}, "--workers", "2")
        yield app
        app.stop()


def oauth_sign_in(page, user: str) -> None:
    page.locator("#login").click()
    page.locator(f"#as-{user}").click()  # the provider's consent page
    page.locator("#login", has_text=f"Logout ({user})").wait_for()


def statuses(app: App) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in app.state.glob("*/jobs/*/status.json")}


def test_two_users_run_jobs_at_once_and_each_sees_only_their_own(space, hub, repos, browser_session, screens, monkeypatch):
    meet = threading.Barrier(2, timeout=90)  # each fork's commit waits for the other's: two jobs at once, whatever the load
    dispatch = hub._dispatch

    def commits_meet(h):
        if h.method == "POST" and "/commit/" in h.path and ("/tiny-by-alice/" in h.path or "/tiny-by-bob/" in h.path):
            try:
                meet.wait()
            except threading.BrokenBarrierError:  # the other job never came: the timing assertion below says so
                pass
        return dispatch(h)

    monkeypatch.setattr(hub, "_dispatch", commits_meet)
    pages = {}
    for user in ("alice", "bob"):
        page = open_page(browser_session(user), space.url)
        oauth_sign_in(page, user)
        check(page, repos["tiny"], TARGET)
        pages[user] = page
    fix(pages["alice"], "fork", fork="alice/tiny-by-alice")
    fix(pages["bob"], "fork", fork="bob/tiny-by-bob")
    for user, page in pages.items():
        page.locator("#fork-link").wait_for()
        Steps(page, screens, f"two-users-{user}").shot("done")
    jobs = {u: p.url.split("job=")[1] for u, p in pages.items()}
    assert jobs["alice"] != jobs["bob"]
    assert f"/alice/tiny-by-alice/commit/" in pages["alice"].locator("#fork-link").get_attribute("href")
    assert f"/bob/tiny-by-bob/commit/" in pages["bob"].locator("#fork-link").get_attribute("href")
    assert "tiny-by-bob" not in pages["alice"].content() and "tiny-by-alice" not in pages["bob"].content()
    seen = statuses(space)
    a, b = seen[jobs["alice"]], seen[jobs["bob"]]
    assert a["started"] < b["ended"] and b["started"] < a["ended"], "the two jobs did not run at the same time"

    pages["bob"].goto(f"{space.url}/?job={jobs['alice']}")  # bob opens alice's job address
    pages["bob"].locator("#job .ckpt-error").wait_for()
    Steps(pages["bob"], screens, "two-users-bob").shot("alices-job")
    assert "no such job for you" in pages["bob"].locator("#job").inner_text()
    assert "tiny-by-alice" not in pages["bob"].content()
    for token in (BOB_TOKEN, hub.token):  # the OAuth tokens reached workers only: not the log, not a file, not a page
        assert token not in space.log.read_text(errors="replace")
        assert not [p for p in space.folder.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        assert all(token not in page.content() for page in pages.values())


def test_closing_the_tab_does_not_stop_the_job_and_a_killed_worker_leaves_nothing(app, hub, big_repo, browser_session, screens):
    context = browser_session("closer")
    page = open_page(context, app.url)
    sign_in(page)
    check(page, big_repo, "vllm==0.21.0")
    fix(page, "fork", fork="alice/gemma-killed")
    page.wait_for_url("**job=*")
    address = page.url
    page.close()  # the tab goes; the job does not
    job = address.split("job=")[1]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = list(app.state.glob(f"*/jobs/{job}/status.json"))
        if found and json.loads(found[0].read_text())["phase"] in ("downloading", "uploading"):
            break
        time.sleep(0.1)
    path = found[0]
    assert json.loads(path.read_text())["state"] == "running"
    folder = path.parent
    assert [p for p in folder.iterdir() if p.name.startswith("ckpt-repair-hub-")], "the job has no work folder while it runs"
    os.kill(json.loads(path.read_text())["pid"], signal.SIGKILL)

    page = open_page(context, address)  # reopening the job's address shows it
    page.locator("#job", has_text="killed").wait_for()
    Steps(page, screens, "killed").shot("killed")
    text = page.locator("#job").inner_text()
    assert "the worker process was killed by signal SIGKILL while" in text and "nothing was committed" in text
    assert "temporary files were removed" in text
    assert sorted(p.name for p in folder.iterdir()) == ["status.json"]
    assert not hub.discussions(big_repo) or all(d["title"] for d in hub.discussions(big_repo))
    assert "gemma-killed" not in {r.path for r in hub.requests if r.method == "POST" and "/commit/" in r.path}


def test_the_space_layout_serves_the_page_with_oauth(hub, repos, tmp_path, browser_session):
    """The project laid out as the README's deploy says (space/* at the top, repair/ beside it, nothing installed),
    run as a Space runs it (`python app.py`, SYSTEM=spaces, the OAuth variables): sign in, and a Check works."""
    layout = tmp_path / "space-repo"
    shutil.copytree(REPO / "repair", layout / "repair", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "recipes", layout / "recipes")
    for name in ("README.md", "app.py", "requirements.txt"):
        shutil.copy(REPO / "space" / name, layout / name)
    with Provider({"alice": hub.token}) as provider:
        env = {**hub_env(hub, tmp_path / "home"), **provider.env(), "GRADIO_SERVER_NAME": "127.0.0.1", "PYTHONPATH": "",
               "TMPDIR": str(tmp_path)}
        app = App(tmp_path / "app", env, command=[sys.executable, "app.py"], cwd=layout)
        try:
            page = open_page(browser_session("space"), app.url)
            oauth_sign_in(page, "alice")
            check(page, repos["tiny"], TARGET)
            assert page.locator("#doctor textarea").input_value().startswith(f"target {TARGET}")
        finally:
            app.stop()
    assert not list(tmp_path.glob("ckpt-repair-web-*")), "the Space's state folder outlived it"


def test_a_private_repo_on_a_space_asks_the_visitor_to_sign_in(space, repos):
    """Signed out on a Space, a private repo's line says what the page offers (the sign-in button), not the CLI's
    HF_TOKEN / `hf auth login`."""
    from gradio_client import Client

    from repair.web.choices import FOR_TARGET

    error = html.unescape(Client(space.url, verbose=False).predict(repos["private"], "", TARGET, 1, FOR_TARGET, api_name="/on_check")[0])
    assert "no such model repo on" in error and "sign in with Hugging Face (the button at the top)" in error, error
    assert "HF_TOKEN" not in error and "hf auth login" not in error, error
