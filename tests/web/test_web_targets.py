"""Several targets on the page, as on the command line: the target field takes `vllm==0.32.0,sglang==0.5.23`
(typed, or picked one by one from the list), the page shows one verdict per target side by side, doctor's text
is the CLI's, and the fix satisfies them all: its pull request holds what `hub fix --target a,b` writes."""

from __future__ import annotations

import pytest
from gradio_client import Client
from huggingface_hub import HfApi

from repair.web.choices import FOR_TARGET
from tests.web.test_web_flow import tree
from tests.web.web_helpers import Steps, check, cli, doctor_text, fix, open_page, pick_targets, sign_in

BOTH = "vllm==0.32.0,sglang==0.5.23"  # the README's example: vLLM loads it, SGLang 0.5.23 stops (sglang#36596)


@pytest.fixture(scope="module")
def prefixed(hub, tmp_path_factory) -> str:
    from repair.demo.examples import TINY, write_assistant

    folder = write_assistant(tmp_path_factory.mktemp("prefixed") / "p", TINY, broken=False, exclusion_prefix="model.")
    hub.add_repo("alice/prefixed-assistant", folder)
    return "alice/prefixed-assistant"


def test_the_page_offers_every_runtime_the_library_has_rules_for(app):
    client = Client(app.url, verbose=False)
    target = next(c["props"] for c in client.config["components"] if c.get("props", {}).get("elem_id") == "target")
    offered = [value for _, value in target["choices"]]
    assert {"vllm==0.32.0", "sglang==0.5.23", "trtllm==1.4.0", "bf16"} <= set(offered)
    assert target["multiselect"] and target["allow_custom_value"]  # several, and any release typed as the CLI takes it


def test_a_typed_target_list_through_the_api_is_the_clis_side_by_side_doctor(app, prefixed):
    client = Client(app.url, verbose=False)
    out = client.predict(prefixed, "", BOTH, 1, FOR_TARGET, api_name="/on_check")
    assert out[0] == ""
    assert out[2] == cli(app.env, "doctor", prefixed, "--target", BOTH).stdout.rstrip("\n")
    assert "data-target='vllm==0.32.0' data-loads='yes'" in out[1] and "data-target='sglang==0.5.23' data-loads='no'" in out[1]
    assert out[4]["headers"][-3:] == ["built as (vllm==0.32.0)", "built as (sglang==0.5.23)", "note"]
    rows = {r[0]: r for r in out[4]["data"]}
    assert rows["pre_projection"][-3:-1] == ["bf16", "nvfp4"]  # vLLM builds it BF16 (it reads model.pre_projection), SGLang NVFP4


def test_a_bad_part_of_the_list_is_one_line_naming_it(app, prefixed):
    client = Client(app.url, verbose=False)
    error = client.predict(prefixed, "", ["vllm==0.32.0", "sglang==9"], 1, FOR_TARGET, api_name="/on_check")[0]
    assert "ckpt-error" in error and "part 2 of --target" in error and "sglang==9" in error, error
    emptied = client.predict(prefixed, "", [], 1, FOR_TARGET, api_name="/on_check")[0]  # every chip removed
    assert "choose a runtime and release in the target field" in emptied, emptied
    huge = client.predict(prefixed, "", ["vllm==0.32.0"] * 100_000, 1, FOR_TARGET, api_name="/on_check")[0]
    assert "the target list is" in huge and "at most 300 characters" in huge and len(huge) < 400, huge[:500]


def test_several_targets_side_by_side_and_one_fix_for_all(app, hub, prefixed, browser_session, screens):
    page = open_page(browser_session(), app.url)
    steps = Steps(page, screens, "targets")
    sign_in(page)
    pick_targets(page, ["vllm==0.32.0", "sglang==0.5.23"])  # from the list, as a first-time visitor would
    steps.shot("picked")
    check(page, prefixed)
    steps.shot("verdicts")
    assert doctor_text(page) == cli(app.env, "doctor", prefixed, "--target", BOTH).stdout.rstrip("\n")
    vllm, sglang = (page.locator(f"#verdict-text [data-target='{t}']") for t in BOTH.split(","))
    assert vllm.get_attribute("data-loads") == "yes" and "Loads" in vllm.inner_text()
    assert sglang.get_attribute("data-loads") == "no" and "stops at post_projection.weight" in sglang.inner_text()
    left, right = vllm.bounding_box(), sglang.bounding_box()
    assert abs(left["y"] - right["y"]) < 2 and left["x"] + left["width"] <= right["x"], (left, right)  # side by side

    fix(page, "pr")
    link = page.locator("#pr-link")
    link.wait_for()
    steps.shot("pull-request")
    assert f"--target {BOTH}" in page.locator("#command").inner_text()
    after = page.locator("#result").inner_text()
    assert "Doctor after, for vllm==0.32.0: 0 finding(s)" in after and "Doctor after, for sglang==0.5.23: 0 finding(s)" in after, after

    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    number = link.get_attribute("href").rsplit("/", 1)[1]
    api.change_discussion_status(prefixed, int(number), "closed")  # so `hub fix --pr` opens its own
    done = cli(app.env, "hub", "fix", prefixed, "--pr", "--target", BOTH, "--quiet")
    assert done.returncode == 0, done.stderr
    assert tree(api, prefixed, f"refs/pr/{number}") == tree(api, prefixed, f"refs/pr/{int(number) + 1}")
    for target in BOTH.split(","):  # the page's pull request loads in both
        assert cli(app.env, "doctor", f"{prefixed}@refs/pr/{number}", "--target", target, "--strict").returncode == 0
