"""Errors as sentences, in the browser: each bad input gets the library's one line (what, where, what to
do), never a bare "Error" and never a traceback."""

from __future__ import annotations

import pytest

from tests.web.web_helpers import Steps, check, current_job, error_text, fix, job_ended, job_error, job_files, open_page, sign_in

TARGET = "vllm==0.32.0"


def assert_one_line(text: str) -> None:
    assert text.startswith("error: ") and "\n" not in text.strip(), text
    assert "Traceback" not in text and text.strip() != "error:" and len(text) > 30, text


@pytest.mark.parametrize("repo, says", [
    ("not a repo id", "is not a Hub repo id: expected owner/name"),
    ("alice/no-such-model", "alice/no-such-model: no such model repo"),
    ("carol/secret-assistant", "carol/secret-assistant: no such model repo on"),  # private, and not alice's
    ("alice/tiny-assistant@no-such-branch", "no such revision"),
])
def test_bad_sources_get_one_line(app, repos, browser_session, screens, repo, says):
    page = open_page(browser_session(), app.url)
    check(page, repo, TARGET)
    Steps(page, screens, f"error-{repo.replace('/', '_').replace(' ', '_')}").shot("error")
    line = error_text(page)
    assert_one_line(line)
    assert says in line
    if "secret" in repo:  # the page's words: no environment variable a visitor cannot set; whose login it read with
        assert "private" in line and "HF_TOKEN" not in line, line
        assert "this page reads the Hub as alice, this machine's login" in line, line
    assert page.locator("#verdict-text").count() == 0


def test_not_quantized_no_write_rights_and_the_hub_dropping_mid_job(app, hub, repos, browser_session, screens):
    page = open_page(browser_session(), app.url)
    steps = Steps(page, screens, "errors-jobs")
    sign_in(page)
    check(page, repos["plain"], TARGET)
    assert "not quantized" in page.locator("#transfer").inner_text()
    fix(page, "pr")
    line = job_error(page)
    steps.shot("not-quantized")
    assert_one_line(line)
    assert "not quantized" in line

    check(page, repos["tiny"], TARGET)
    before = current_job(page)  # read before the click: the address names the new job right after it
    fix(page, "fork", fork="bob/tiny-fixed")  # alice may not create repos under bob
    steps.shot("fork-asked")
    first = job_ended(page, before, "failed")
    line = job_error(page)
    steps.shot("no-write-rights")
    assert_one_line(line)
    assert "--to bob/tiny-fixed: alice may not create repos under 'bob'" in line

    check(page, repos["config_only"], TARGET)
    assert "0 bytes" in page.locator("#transfer").inner_text()  # a config-only fix: the commit is the only upload
    hub.fail_uploads_after(0, times=1)  # the connection drops as the commit is sent
    fix(page, "pr")
    job_ended(page, first, "failed")
    line = job_error(page)
    steps.shot("hub-dropped")
    assert_one_line(line)
    assert "nothing was committed" in line and ("connection" in line or "cannot reach" in line), line
    assert not [d for d in hub.discussions(repos["config_only"]) if d["is_pull_request"]]
    assert job_files(app, page) == ["status.json"]  # a failed job leaves no temporary file
