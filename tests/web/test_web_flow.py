"""The whole flow in a browser, on the split-module 31B-shape repo served by the local Hub: type the repo
id, see doctor's verdict (its exact text), sign in (gradio's local mock), open a pull request and follow
its link; the PR's files equal, bitwise, what `hub fix --pr` writes. The same with a fork."""

from __future__ import annotations

import re

from huggingface_hub import HfApi

from tests.web.web_helpers import Steps, check, cli, doctor_text, fix, open_page, sign_in

TARGET = "vllm==0.21.0"  # drafter layers built BF16: the packed projections stop the loader


def tree(api: HfApi, repo: str, revision: str) -> dict:
    """Every file at a revision by content hash (git blob id; LFS sha256): equal trees are equal bytes."""
    return {e.path: (e.size, e.blob_id, e.lfs.sha256 if e.lfs else None) for e in api.list_repo_tree(repo, revision=revision, recursive=True)
            if hasattr(e, "blob_id")}


def test_pull_request_from_the_page_equals_hub_fix_pr(app, hub, big_repo, browser_session, screens):
    page = open_page(browser_session(), app.url)
    steps = Steps(page, screens, "flow-pr")
    steps.shot("opened")
    check(page, big_repo, TARGET)
    steps.shot("verdict")
    doctor = cli(app.env, "doctor", big_repo, "--target", TARGET)
    assert doctor_text(page) == doctor.stdout.rstrip("\n")
    assert "would stop" in doctor.stdout and "would stop" in page.locator("#doctor textarea").input_value()
    assert "Fails to load" in page.locator("#verdict").inner_text()
    assert "model-00003-of-00003.safetensors" in page.locator("#transfer").inner_text()
    sign_in(page)
    steps.shot("signed-in")
    check(page, big_repo, TARGET)  # the page reloaded on sign-in
    fix(page, "pr")
    page.locator("#job", has_text="running").or_(page.locator("#pr-link")).first.wait_for()
    steps.shot("running")
    assert re.search(r"[?&]job=[0-9a-f]{16}", page.url)
    link = page.locator("#pr-link")
    link.wait_for()
    steps.shot("pull-request")
    url = link.get_attribute("href")
    assert url == f"{hub.endpoint}/{big_repo}/discussions/1"
    assert "Doctor after" in page.locator("#result").inner_text()
    planned = re.search(r"A fix downloads ([\d,]+) bytes", page.locator("#transfer").inner_text())[1]
    assert f"download: {planned} of {planned} bytes" in page.locator("#job").inner_text()  # progress in bytes, by phase
    assert re.search(r"upload: ([\d,]+) of \1 bytes", page.locator("#job").inner_text())

    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    api.change_discussion_status(big_repo, 1, "closed")  # so `hub fix --pr` opens its own instead of pointing at ours
    done = cli(app.env, "hub", "fix", big_repo, "--pr", "--target", TARGET, "--quiet")
    assert done.returncode == 0, done.stderr
    assert tree(api, big_repo, "refs/pr/1") == tree(api, big_repo, "refs/pr/2")


def test_fork_from_the_page_equals_hub_fix_to(app, hub, big_repo, browser_session, screens):
    page = open_page(browser_session(), app.url)
    steps = Steps(page, screens, "flow-fork")
    sign_in(page)
    check(page, big_repo, TARGET)
    fix(page, "fork", fork="alice/gemma-31b-fixed-web")
    link = page.locator("#fork-link")
    link.wait_for()
    steps.shot("fork")
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    from_page = tree(api, "alice/gemma-31b-fixed-web", "main")
    assert link.get_attribute("href").startswith(f"{hub.endpoint}/alice/gemma-31b-fixed-web/commit/")
    api.delete_repo("alice/gemma-31b-fixed-web")  # the CLI makes the same fork afresh
    done = cli(app.env, "hub", "fix", big_repo, "--to", "alice/gemma-31b-fixed-web", "--target", TARGET, "--quiet")
    assert done.returncode == 0, done.stderr
    assert from_page == tree(api, "alice/gemma-31b-fixed-web", "main")
