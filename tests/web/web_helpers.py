"""Driving the page as a person would (Playwright on chromium), with a screenshot of every step, and the
command line the page is compared with."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.web.conftest import REPO

TIMEOUT = 120_000  # ms: a fix of the 31B-shape repo on two shared cores


class Steps:
    """Screenshots named `<name>-NN-<step>.png` in the session's screenshot folder."""

    def __init__(self, page, folder: Path, name: str):
        self.page, self.folder, self.name, self.n = page, folder, name, 0

    def shot(self, step: str) -> Path:
        self.n += 1
        path = self.folder / f"{self.name}-{self.n:02d}-{step}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def open_page(context, url: str):
    page = context.new_page()
    page.set_default_timeout(TIMEOUT)
    page.goto(url)
    page.locator("#check").wait_for()
    page.locator("#target .token").first.wait_for()  # each component mounts as its code loads: the button can come
    return page  # before the target field, whose default chip says it is there (a click on its Clear would be lost)


def sign_in(page) -> None:
    page.locator("#login").click()
    page.locator("#login", has_text="Logout").wait_for()


def pick_targets(page, targets: list[str], typed: bool = False) -> None:
    """Empty the target field (its Clear button), then add each target: typed (the field takes it when it loses
    focus, as when a visitor clicks on), or clicked in the field's list; waits until the chips are exactly these."""
    from playwright.sync_api import expect

    field = page.locator("#target")
    for _ in range(3):  # a person clicks Clear again when the chips stay: a click during a re-render can be lost
        if not field.locator(".token").count():
            break
        field.locator(".remove-all").click()
        try:
            expect(field.locator(".token")).to_have_count(0, timeout=3000)
        except AssertionError:
            continue
    expect(field.locator(".token")).to_have_count(0)
    for target in targets:
        field.locator("input").click()
        if typed:
            field.locator("input").fill(target)
        else:
            page.locator(f"[role=option][aria-label='{target}']").click()
        page.locator("#repo textarea, #repo input").first.click()  # the list closes; a typed value becomes a chip
    expect(field.locator(".token > span")).to_have_text(targets)


def check(page, repo: str, target: str | None = None) -> None:
    """Type the repo id (and type the target, one or `a,b`), press Check, wait for the verdict or the error line."""
    if target:
        pick_targets(page, [target], typed=True)
    page.locator("#repo textarea, #repo input").first.fill(repo)
    answered = "[...document.querySelectorAll('#verdict-text, #error .ckpt-error')].map(e => e.dataset.answered).join()"
    before = page.evaluate(answered)
    page.locator("#check").click()
    page.wait_for_function(f"(before) => {{ const now = {answered}; return now && now !== before; }}", arg=before)


def doctor_text(page) -> str:
    return page.locator("#doctor textarea").input_value()


def error_text(page) -> str:
    return page.locator("#error .ckpt-error").inner_text()


def fix(page, mode: str = "pr", fork: str | None = None, private: bool = False) -> None:
    page.locator("#mode label", has_text="Open a pull request" if mode == "pr" else "Create a fixed fork").click()
    if fork:
        page.locator("#fork textarea, #fork input").first.fill(fork)
    if private:
        page.locator("#private input").check()
    page.locator("#fix").click()


def job_error(page) -> str:
    page.locator("#job .ckpt-error, #error .ckpt-error").first.wait_for()
    return page.locator("#job .ckpt-error, #error .ckpt-error").first.inner_text()


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repair", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def job_files(app, page) -> list[str]:
    """What the finished job of this page left in its folder on the server."""
    page.wait_for_url("**job=*")
    job = page.url.split("job=")[1]
    folder = next(app.state.glob(f"*/jobs/{job}"))
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def current_job(page) -> str | None:
    return page.evaluate("new URL(location).searchParams.get('job')")


def job_ended(page, before: str | None, state: str) -> str:
    """Wait for a job newer than `before` (the page's address names it) to reach `state`; its id."""
    page.wait_for_function("(before) => { const j = new URL(location).searchParams.get('job'); return j && j !== before; }", arg=before)
    job = current_job(page)
    ended = page.locator("#job", has_text=job).filter(has_text=re.compile(r": (done|failed|killed)\b"))
    ended.wait_for()
    assert f": {state}" in ended.inner_text(), ended.inner_text()  # says which state and why when it is another
    return job
