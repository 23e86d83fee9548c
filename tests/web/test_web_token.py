"""The token never leaves the server: a whole session in the browser (sign in, check, open a pull request,
download the report) is recorded with every response body (a HAR), and neither it, the server's log, nor
any file the server, its workers or gradio wrote holds the token."""

from __future__ import annotations

import base64
import json

from tests.web.conftest import CHROMIUM, FLAGS
from tests.web.web_helpers import TIMEOUT, Steps, check, fix, job_files, sign_in


def test_the_token_is_in_no_page_response_log_or_file(app, hub, repos, playwright_driver, tmp_path, screens):
    token = hub.token
    assert token in app.env["HF_TOKEN"]  # the server holds it: it is the machine's login
    har = tmp_path / "session.har"
    context = playwright_driver.chromium.launch_persistent_context(
        str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=FLAGS, record_har_path=str(har), record_har_content="embed")
    page = context.new_page()
    page.set_default_timeout(TIMEOUT)
    page.goto(app.url)
    steps = Steps(page, screens, "token")
    sign_in(page)
    steps.shot("signed-in")
    check(page, repos["tiny"], "vllm==0.21.0")
    steps.shot("verdict")
    fix(page, "pr")
    page.locator("#pr-link").wait_for()
    steps.shot("pull-request")
    page.locator("#report a, #report button").first.wait_for()
    with page.expect_download() as download:
        page.locator("#report a").first.click()
    report = download.value.path().read_text()
    assert job_files(app, page) == ["repair_report.json", "status.json"]  # a finished job leaves no temporary file
    assert json.loads(report)["tool"]["name"] == "ckpt-repair"
    context.close()

    entries = json.loads(har.read_text())["log"]["entries"]
    bodies = []
    for e in entries:
        content = e["response"].get("content", {})
        text = content.get("text") or ""
        bodies.append(base64.b64decode(text).decode("latin-1") if content.get("encoding") == "base64" else text)
    assert any("ckpt-repair" in b for b in bodies) and any("pr-link" in b or "discussions" in b for b in bodies), "the HAR holds no page"
    assert len(bodies) > 20
    leaks = [e["request"]["url"] for e, b in zip(entries, bodies) if token in b]
    assert not leaks, f"the token is in these responses: {leaks}"
    assert token not in app.log.read_text(errors="replace")
    written = [p for p in app.folder.rglob("*") if p.is_file()]
    assert written, "the server wrote nothing to search"
    assert not [p for p in written if token.encode() in p.read_bytes()]
    pr_files = hub.repo_files(repos["tiny"], "refs/pr/" + _last_pr(hub, repos["tiny"]))
    assert not [n for n, data in pr_files.items() if token.encode() in data]


def _last_pr(hub, repo: str) -> str:
    return str(max(d["num"] for d in hub.discussions(repo) if d["is_pull_request"]))
