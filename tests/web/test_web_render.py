"""What the page renders from a Hub's answers: a hostile Hub names the pull request or the fork commit with a
`javascript:` (or any non-web) address; the page shows it as text, never as a link a click would run. Checked on
the HTML itself and in chromium, which is what would run it."""

from __future__ import annotations

import json

import pytest

from repair.web.render import esc, result
from tests.web.conftest import CHROMIUM, FLAGS

HOSTILE = ["javascript:alert(document.cookie)", " javascript:alert(1)", "JaVaScRiPt:alert(1)", "java\tscript:alert(1)",
           "\x01javascript:alert(1)", "data:text/html,<script>alert(1)</script>", "vbscript:msgbox(1)", "//evil.example/x",
           "http://127.0.0.1/a b", "https://hub.example/x\njavascript:alert(1)", "", None, 42,
           # not ASCII: a bidi override or line separator makes the shown address read as another (a real Hub address
           # is percent-encoded ASCII)
           "https://hub.example/alice/\u202emodel.exe", "https://hub.example/x\u2028y", "https://hub.example/\u200bx"]


def done(url) -> dict:
    return {"state": "done", "result": {"status": "ok", "pr": {"url": url}, "fork": {"url": url}}}


@pytest.mark.parametrize("url", HOSTILE, ids=repr)
def test_a_hostile_hubs_address_is_never_a_link(url):
    page = result(done(url))
    assert "<a " not in page and "href" not in page, page
    assert "Pull request:" in page  # still said, as text


def test_a_web_address_is_a_link_and_only_that_runs_in_the_browser(playwright_driver, tmp_path):
    good = "http://127.0.0.1:8000/alice/model/discussions/3"
    assert f"href='{good}'" in result(done(good))
    browser = playwright_driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
    try:
        page = browser.new_page()
        page.set_content("".join(result(done(url)) for url in HOSTILE[:-2]) + result(done(good)))
        hrefs = page.eval_on_selector_all("a", "links => links.map(a => a.href)")
        assert hrefs == [good, good], hrefs  # the pull request and the fork commit of the last one only
        assert page.locator("text=javascript:alert(document.cookie)").count() == 2  # shown as text, pr and fork
    finally:
        browser.close()


def test_a_config_only_fix_shows_no_empty_byte_counts():
    """A fix that commits JSON only moves no tensor bytes: '0 of 0 bytes' lines would only puzzle a reader."""
    from repair.web.render import job

    shown = job({"id": "abc", "state": "done", "progress": {"download": [0, 0], "upload": [0, 0]}})
    assert "0 of 0 bytes" not in shown and "Job" in shown
    assert "- upload: 5 of 10 bytes" in job({"id": "abc", "state": "running", "phase": "uploading", "progress": {"upload": [5, 10]}})


def test_a_finding_some_targets_share_is_said_for_them_never_in_another_targets_words(tmp_path):
    """vLLM 0.21 fails this checkpoint, every later release (and SGLang, TensorRT-LLM) loads it with a warning: that
    warning, led by the targets it is for, must not say 'vllm==0.32.0 loads it' for sglang==0.5.23 and the rest."""
    from repair.demo.examples import TINY, write_assistant
    from repair.web.analyze import analyze

    specs = ["vllm==0.21.0", "vllm==0.32.0", "sglang==0.5.23", "trtllm==1.4.0"]
    folder = write_assistant(tmp_path / "m", TINY)
    answer = analyze({"source": str(folder), "target": ",".join(specs), "tp": 1})
    some = [line for line in answer["findings"]["warning"] if line.startswith("vllm==0.32.0, sglang==0.5.23, trtllm==1.4.0: ")]
    assert some, answer["findings"]
    for line in some:
        said = line.split(": ", 1)[1]
        assert not any(spec in said for spec in specs), line  # no one target's name where all of them are meant


@pytest.mark.parametrize("tp", [1, 2])
def test_the_page_diagnoses_each_target_once_and_plans_what_the_cli_plans(tmp_path, monkeypatch, tp):
    """Check runs doctor once per target and hands those verdicts to the plan (it diagnosed them twice: ~1 s more than
    the CLI on the 31B shape); the plan is the one `api.plan` makes on its own."""
    from repair import api
    from repair.demo.examples import TINY, write_assistant
    from repair.doctor import diagnose as diagnose_module
    from repair.planning.text import plan_as_text
    from repair.web.analyze import analyze
    from repair.web.choices import recipe_for

    specs = "vllm==0.32.0,sglang==0.5.23"
    folder = write_assistant(tmp_path / "m", TINY)
    alone = plan_as_text(api.plan(folder, recipe_for(None, specs)))
    calls = []
    real = diagnose_module._diagnose
    monkeypatch.setattr(diagnose_module, "_diagnose", lambda *a, **k: calls.append(a[1].spec) or real(*a, **k))
    answer = analyze({"source": str(folder), "target": specs, "tp": tp})
    assert sorted(calls) == sorted(specs.split(",") * (1 if tp == 1 else 2))
    assert answer["plan_text"] == alone and answer["plan_error"] is None


def test_the_findings_panel_shows_doctors_notes_too(app, hub, tmp_path):
    """A release past the newest profile that loads no DBRX checkpoint in 0.32 gets a `load-refused` note (doctor exits
    0): the findings panel said "No findings." and only the doctor text box had it. The panel lists notes under
    their own heading, in the words of doctor's text, on the page's own answer (its API, which the browser calls)."""
    from gradio_client import Client

    from repair.web.choices import FOR_TARGET
    from tests.test_doctor_load_refused import DBRX_ERROR, write_dbrx
    from tests.web.web_helpers import cli

    hub.add_repo("alice/dbrx-notes", write_dbrx(tmp_path / "dbrx", quantized=True))
    out = Client(app.url, verbose=False).predict("alice/dbrx-notes", "", "vllm==0.33.0", 1, FOR_TARGET, api_name="/on_check")
    doctor = cli(app.env, "doctor", "alice/dbrx-notes", "--target", "vllm==0.33.0", "--json")
    [note] = [n for n in json.loads(doctor.stdout)["notes"] if n["code"] == "load-refused"]
    assert doctor.returncode == 0 and DBRX_ERROR in note["message"], doctor.stdout
    panel = out[3]
    assert "No findings" not in panel and "**notes (1)**" in panel, panel
    assert esc(f"[load-refused] {note['message']}") in panel, panel


def test_the_notes_panel_in_a_browser_reads_as_doctors_note(app, hub, browser_session, screens, tmp_path):
    """The same state as a person sees it: chromium renders the findings panel with a bold `notes (1)` heading and
    the `load-refused` line in doctor's own words under it, never "No findings."; a screenshot keeps the look."""
    from tests.test_doctor_load_refused import DBRX_ERROR, write_dbrx
    from tests.web.web_helpers import Steps, check, open_page

    hub.add_repo("alice/dbrx-notes-shown", write_dbrx(tmp_path / "dbrx", quantized=True))
    page = open_page(browser_session(), app.url)
    steps = Steps(page, screens, "notes-panel")
    check(page, "alice/dbrx-notes-shown", "vllm==0.33.0")
    panel = page.locator("#findings")  # check() waited for the verdict, which comes in the same answer as the panel
    shot = steps.shot("notes")
    shown = panel.inner_text()
    assert "No findings" not in shown and "[load-refused]" in shown and DBRX_ERROR in shown, shown
    heading, line = panel.locator("strong", has_text="notes (1)"), panel.locator("li", has_text="[load-refused]")
    assert heading.count() == 1 and line.count() == 1, panel.inner_html()
    assert heading.bounding_box()["y"] < line.bounding_box()["y"]  # the line is laid out under its heading
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
    card = page.locator("#verdict .verdict").inner_text()  # "Loads" alone read as all clear, with a note saying it may not
    assert "Loads" in card and "1 note below" in card, card
