"""The page's API through gradio_client, and the parts under it: the choices the library knows, doctor equal
to the CLI's at TP 2, local folders only under --root, sign-in before a fix, the bounded queue and one job
per user, and the Space's README front matter."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gradio_client import Client

from repair.targets.profiles import target_choices
from repair.web.choices import FOR_TARGET
from repair.web.jobs import JobTable
from tests.web.conftest import REPO, App, hub_env
from tests.web.web_helpers import cli


def _component(client: Client, elem_id: str) -> dict:
    return next(c["props"] for c in client.config["components"] if c.get("props", {}).get("elem_id") == elem_id)


def test_the_page_offers_the_targets_the_library_knows_newest_first(app):
    client = Client(app.url, verbose=False)
    offered = [value for _, value in _component(client, "target")["choices"]]
    assert offered == list(target_choices())
    assert _component(client, "target")["value"] == [target_choices()[0]]


def test_doctor_through_the_api_equals_the_cli_at_tp_2(app, repos):
    client = Client(app.url, verbose=False)
    out = client.predict(repos["tiny"], "", "vllm==0.21.0", 2, FOR_TARGET, api_name="/on_check")
    error, verdict, doctor = out[0], out[1], out[2]
    assert error == ""
    assert doctor == cli(app.env, "doctor", repos["tiny"], "--target", "vllm==0.21.0", "--tp", "2").stdout.rstrip("\n")
    assert "rank 1 would stop" in doctor and "rank 1 stops at" in verdict


def test_a_fix_needs_a_signed_in_user(app, repos):
    client = Client(app.url, verbose=False)
    out = client.predict(None, "pr", "", False, api_name="/on_fix")
    assert "sign in with Hugging Face first" in out[0]


@pytest.fixture(scope="module")
def rooted(hub, tmp_path_factory):
    """A local server offering the folders under ROOT (a checkpoint inside; one outside; a link leading out)."""
    from repair.demo.examples import TINY, write_assistant

    base = tmp_path_factory.mktemp("rooted")
    root = base / "root"
    write_assistant(root / "models" / "tiny", TINY)
    write_assistant(base / "outside" / "tiny", TINY)
    (root / "escape").symlink_to(base / "outside")
    app = App(base / "app", hub_env(hub, base / "home", hub.token), "--root", str(root))
    yield app, root
    app.stop()


def test_local_folders_only_under_the_root(rooted):
    app, root = rooted
    client = Client(app.url, verbose=False)
    assert [v for _, v in _component(client, "local")["choices"]] == ["", "models/tiny"]
    out = client.predict("", "models/tiny", "vllm==0.21.0", 1, FOR_TARGET, api_name="/on_check")
    assert out[0] == "" and out[2] == cli(app.env, "doctor", str(root / "models" / "tiny"), "--target", "vllm==0.21.0").stdout.rstrip("\n")
    for name, says in (("../outside/tiny", "'..' component"), (str(root / "models" / "tiny"), "absolute path"),
                       ("escape/tiny", "outside"), ("models/none", "no such folder")):
        error = html.unescape(client.predict("", name, "vllm==0.21.0", 1, FOR_TARGET, api_name="/on_check")[0])
        assert "ckpt-error" in error and says in error, (name, error)


def test_local_folders_are_not_offered_without_a_root(app):
    client = Client(app.url, verbose=False)
    error = client.predict("", "models/tiny", "vllm==0.21.0", 1, FOR_TARGET, api_name="/on_check")[0]
    assert "local folders are not offered by this server" in error


def test_root_beyond_loopback_needs_expose_root(tmp_path):
    done = subprocess.run([sys.executable, "-m", "repair", "serve", "--host", "0.0.0.0", "--root", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: --root with --host 0.0.0.0: local folders are offered only on 127.0.0.1; "
                                                 "add --expose-root to offer them anyway"]


def test_the_machines_login_is_lent_only_on_loopback(tmp_path):
    """Off a Space the page signs everyone in as this machine's Hub account (doctor reads its private repos,
    a fix publishes as it): on 0.0.0.0 that is anyone on the network, so serve refuses without the flag."""
    env = {k: v for k, v in os.environ.items() if k not in ("SYSTEM", "SPACE_ID")}
    done = subprocess.run([sys.executable, "-m", "repair", "serve", "--host", "0.0.0.0", "--state", str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --host 0.0.0.0: off a Space the page signs everyone who reaches it in as this "
                                                 "machine's Hugging Face account (its private repos, publishing as it), so only on "
                                                 "127.0.0.1; add --expose-login to serve it anyway"]
    assert not any(tmp_path.iterdir())  # refused before anything started


def test_the_space_entry_point_listens_beyond_loopback_only_on_a_space(monkeypatch):
    from repair.web.session import default_host

    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("SYSTEM", raising=False)
    assert default_host() == "127.0.0.1"  # `python app.py` on a laptop: the machine's login stays local
    monkeypatch.setenv("SYSTEM", "spaces")
    monkeypatch.setenv("SPACE_ID", "someone/ckpt-repair")
    assert default_host() == "0.0.0.0"


def test_one_job_per_user_and_a_bounded_queue_that_says_how_many_are_ahead(tmp_path):
    jobs = JobTable(tmp_path, workers=0, max_queued=2, env=dict(os.environ))  # no worker slot: every job waits
    first = jobs.submit("alice", {"source": "alice/x"}, "hf_alice")
    second = jobs.submit("bob", {"source": "alice/x"}, "hf_bob")
    assert jobs.view(first.id, "alice")["ahead"] == 0 and jobs.view(second.id, "bob")["ahead"] == 1
    assert jobs.view(first.id, "bob") is None and jobs.view(first.id, None) is None  # nobody else sees it
    from repair.errors import UsageError

    with pytest.raises(UsageError, match=r"^you already have a job queued \([0-9a-f]{16}\); wait for it to finish"):
        jobs.submit("alice", {"source": "alice/y"}, "hf_alice")
    with pytest.raises(UsageError, match=r"^the queue is full \(2 jobs waiting\); try again in a few minutes$"):
        jobs.submit("carol", {"source": "alice/x"}, "hf_carol")
    assert "hf_" not in repr(first) and "hf_alice" not in str(jobs.view(first.id, "alice"))
    jobs.close()


def test_the_space_readme_deploys_this_app_with_oauth():
    space = REPO / "space"
    front = re.match(r"---\n(.*?)\n---\n", (space / "README.md").read_text(), re.S)[1]
    fields = dict(re.findall(r"^(\w+): *(.*)$", front, re.M))
    scopes = re.findall(r"^  - (\S+)$", front, re.M)
    pinned = re.search(r'"gradio\[oauth\]==([\d.]+)"', (REPO / "pyproject.toml").read_text())[1]
    assert fields["sdk"] == "gradio" and fields["sdk_version"] == pinned and fields["hf_oauth"] == "true"
    assert (space / fields["app_file"]).is_file() and "from repair.web.app import main" in (space / fields["app_file"]).read_text()
    assert {"read-repos", "gated-repos", "write-discussions"} <= set(scopes) and {"contribute-repos", "manage-repos"} & set(scopes)
    wanted = re.search(r"dependencies = \[(.*?)\]", (REPO / "pyproject.toml").read_text(), re.S)[1]
    listed = [line for line in (space / "requirements.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert listed == re.findall(r'"([^"]+)"', wanted)  # a Space installs these before it copies the project
    assert Path(REPO / "repair" / "web" / "app.py").read_text().count("def main(") == 1


def test_a_tensor_parallel_degree_out_of_range_is_one_line(app, repos):
    client = Client(app.url, verbose=False)
    for degree in (0, -2, 100_000_000):
        error = html.unescape(client.predict(repos["tiny"], "", "vllm==0.32.0", degree, FOR_TARGET, api_name="/on_check")[0])
        assert f"error: tensor-parallel degree {degree}: give a whole number from 1 to 256" in error, error


def test_a_spare_worker_has_not_imported_the_hub_client_before_its_token_arrives():
    """Workers are started ahead (repair.web.spares) with no token; huggingface_hub reads its token settings at
    import, so it must not be imported until the request (and the user's token) has been read."""
    code = "import sys, repair.web.worker; print('huggingface_hub' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_a_worker_that_cannot_start_fails_its_job_in_one_line(tmp_path, monkeypatch):
    import subprocess as sp

    jobs = JobTable(tmp_path, workers=1, max_queued=2, env=dict(os.environ))

    def no_process(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(sp, "Popen", no_process)
    job = jobs.submit("alice", {"source": "alice/x"}, "hf_alice")
    seen = jobs.view(job.id, "alice")
    assert seen["state"] == "failed" and seen["error"].startswith("the worker process could not start (Cannot allocate memory)")
    assert jobs.submit("alice", {"source": "alice/x"}, "hf_alice").state == "failed"  # the user may try again at once
    jobs.close()


def test_the_module_table_and_findings_stay_bounded_on_a_deepseek_sized_model():
    from types import SimpleNamespace

    from repair.web.analyze import MAX_FINDINGS, MAX_ROWS, _first, module_rows

    def view(i):
        module = SimpleNamespace(name=f"model.layers.{i}.mlp.experts.0.up_proj", precision="nvfp4", logical_shape=(8, 16),
                                 tensor=lambda role: object())
        return SimpleNamespace(module=module, expected_shape=None, declared="quantized", algorithm="NVFP4")

    rows = module_rows(SimpleNamespace(modules=[view(i) for i in range(MAX_ROWS + 500)]), {"vllm==0.32.0": {}, "sglang==0.5.23": {}})["data"]
    assert len(rows) == MAX_ROWS + 1 and rows[-1][0].startswith("... and 500 more modules") and len(rows[-1]) == len(rows[0]) == 9
    listed = _first([f"finding {i}" for i in range(MAX_FINDINGS + 7)])
    assert len(listed) == MAX_FINDINGS + 1 and listed[-1].startswith("... and 7 more")


@pytest.mark.parametrize("text", ["alice/model@" + "x" * 1_000_000, "a" * 1_000_000, "alice/" + "b" * 1_000_000])
def test_a_huge_repo_id_is_refused_in_one_short_line(text):
    """Anyone may paste a megabyte: it is refused before a worker or the Hub sees it, and the line does not echo it."""
    from types import SimpleNamespace

    from repair.errors import UsageError
    from repair.web.handlers import source_of

    with pytest.raises(UsageError) as refused:
        source_of(SimpleNamespace(root=None), text, "")
    assert len(str(refused.value)) < 300 and "\n" not in str(refused.value)


def test_a_huge_fork_name_is_refused_in_one_short_line():
    from repair.errors import UsageError
    from repair.web.handlers import fix_request
    from repair.web.session import Identity

    analysis = {"source": "alice/model", "target": None, "recipe": None, "bytes": {}, "quantized": True}
    with pytest.raises(UsageError) as refused:
        fix_request(analysis, "fork", "bob/" + "c" * 1_000_000, False, Identity("bob", "hf_x"))
    assert len(str(refused.value)) < 300


def test_a_state_folder_that_cannot_be_made_is_one_line_not_a_traceback():
    done = subprocess.run([sys.executable, "-m", "repair", "serve", "--state", "/proc/no-such-folder/state", "--port", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: /proc/no-such-folder/state: cannot make the server's state folder"), lines


def test_a_busy_port_is_one_line_not_a_traceback(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "repair", "serve", "--port", str(port), "--state", str(tmp_path)], cwd=REPO,
                              capture_output=True, text=True, timeout=90)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"error: 127.0.0.1:{port}: cannot listen there (the port is taken, or the address is "
                                                    "not this machine's); choose another --port (0: any free one) or --host")
    assert not any(tmp_path.iterdir())  # the state folder went with the server


def test_a_typed_hidden_folder_under_the_root_is_refused_as_the_list_leaves_it_out(tmp_path):
    """The list never offers `.ssh`, `.cache/...` or `x/.git`; typing the name (allow_custom_value) must not reach it either."""
    from types import SimpleNamespace

    from repair.errors import UsageError
    from repair.web.handlers import source_of

    for name in (".cache/hub", "models/.secret"):
        (tmp_path / name).mkdir(parents=True)
        with pytest.raises(UsageError, match="hidden"):
            source_of(SimpleNamespace(root=tmp_path), "", name)


def test_a_default_fork_name_stays_within_the_hubs_96_characters_deterministically():
    """`<name>-fixed` of a 91-96 character repo name would pass the Hub's limit: the default is cut, and a hash of the
    whole name keeps two long names apart; huggingface_hub's own validator accepts every one."""
    from huggingface_hub.utils import validate_repo_id

    from repair.web.handlers import fix_request
    from repair.web.session import Identity

    def default_fork(name: str) -> str:
        analysis = {"source": f"alice/{name}@main", "target": None, "recipe": None, "bytes": {}, "quantized": True}
        return fix_request(analysis, "fork", "", False, Identity("bob", "hf_x"))["fork"]

    assert default_fork("m" * 90) == "bob/" + "m" * 90 + "-fixed"  # 96: fits, unchanged
    names = ["m" * 91, "m" * 96, "m" * 95 + "x", "a" * 80 + "-" + "b" * 15, "a" * 80 + "." + "b" * 15, "a" * 79 + ".-" + "b" * 15, "x.y" * 32]
    made = [default_fork(n) for n in names]
    for name, fork in zip(names, made):
        owner, repo = fork.split("/")
        validate_repo_id(fork)
        assert owner == "bob" and len(repo) <= 96 and repo.endswith("-fixed") and "--" not in repo and ".." not in repo, fork
        assert repo[:40] == name[:40] and default_fork(name) == fork  # recognisable, and the same every time
    assert len(set(made)) == len(made)


def test_a_check_killed_at_its_timeout_leaves_no_work_folder(hub, repos, tmp_path, monkeypatch):
    """doctor's worker hangs on the Hub (its shard reads never answer) after making its work folder; at the timeout
    the server kills it and removes that folder at once, not at the next check."""
    import threading

    from repair.errors import UsageError as Refused
    from repair.hub.source import WORK_PREFIX
    from repair.web import handlers
    from repair.web.handlers import Server, run_doctor
    from repair.web.session import Identity, Login
    from repair.web.spares import Spares

    hub.add_repo("alice/hanging-assistant", _tiny(tmp_path))
    reached, release = threading.Event(), threading.Event()
    dispatch = hub._dispatch

    def hanging(h):
        if "hanging-assistant" in h.path and h.path.partition("?")[0].endswith(".safetensors") and h.method == "GET":
            reached.set()
            release.wait(60)
        return dispatch(h)

    monkeypatch.setattr(hub, "_dispatch", hanging)
    monkeypatch.setattr(handlers, "DOCTOR_TIMEOUT", 8)
    jobs = JobTable(tmp_path / "state", workers=0, env=hub_env(hub, tmp_path / "home"))
    spares = Spares(jobs.state / "cwd", jobs.env, jobs.state / "doctor-tmp")
    server = Server(Login(False, Identity("alice", hub.token)), jobs, spares)
    try:
        with pytest.raises(Refused, match="doctor took longer than 8 s"):
            run_doctor(server, server.login.local, {"source": "alice/hanging-assistant", "target": "vllm==0.32.0", "tp": 1})
        assert reached.is_set(), "the worker never reached the shard reads: its work folder was not made yet"
        assert not list(spares.tmp.glob(f"{WORK_PREFIX}*")), "the killed check's work folder is still there"
    finally:
        release.set()
        spares.close()
        jobs.close()


def _tiny(base: Path) -> Path:
    from repair.demo.examples import TINY, write_assistant

    return write_assistant(base / "tiny", TINY)


def test_the_same_as_command_runs_as_printed_for_any_target_spelling():
    """The page's `hub fix` line for a target list spelled with spaces (`vllm == 0.32.0`, which --target takes) splits
    back into the same arguments, as a shell reads it."""
    import shlex

    from repair.web.handlers import command_line

    analysis = {"source": "alice/model@main", "target": "vllm == 0.32.0,sglang==0.5.23", "recipe": FOR_TARGET}
    line = command_line(analysis, {"mode": "fork", "fork": "bob/model-fixed", "private": True})
    assert shlex.split(line) == ["ckpt-repair", "hub", "fix", "alice/model@main", "--to", "bob/model-fixed", "--private",
                                 "--target", "vllm == 0.32.0,sglang==0.5.23"]


@pytest.mark.parametrize("revision", ["main", "a`b", "``x``", "`", "end`"])
def test_the_same_as_line_is_one_code_span_whatever_the_revision_holds(revision):
    """A revision (a user's or a server's text) holding backticks cannot end the page's code span early: a CommonMark
    reader (markdown-it, as gradio's Markdown) shows the whole command, and only it, as code."""
    from markdown_it import MarkdownIt

    from repair.web.handlers import command_line
    from repair.web.render import same_as

    command = command_line({"source": f"alice/model@{revision}", "target": "vllm==0.32.0", "recipe": FOR_TARGET},
                           {"mode": "pr"})
    tokens = MarkdownIt("commonmark").parseInline(same_as(command))[0].children
    assert [t.type for t in tokens] == ["text", "code_inline"], tokens
    assert tokens[0].content == "Same as: " and tokens[1].content == command
