"""The web front door (`ckpt-repair serve`, and the Hugging Face Space's app file): paste a repo id, see
what the runtime will do, open a pull request or create a fixed fork.

This module only wires gradio widgets to repair.web.handlers; the library does the work in worker
processes. Run as a script (a Space runs `python app.py`), it serves on GRADIO_SERVER_NAME/PORT.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import gradio as gr

from repair.errors import OutputError, UsageError
from repair.io import staging
from repair.web import choices, handlers, render
from repair.web.handlers import Server, fix_request, one_line_errors, run_doctor, source_of
from repair.web.jobs import KEEP_FINISHED_S, JobTable
from repair.web.session import Login, default_host, local_login, on_space
from repair.web.spares import Spares

CSS = (".ckpt-error{color:#b00020;font-weight:600}.verdicts{display:flex;flex-wrap:wrap;gap:12px}"
       ".verdict{flex:1 1 260px;border:1px solid #ccc;border-radius:8px;padding:8px 12px}"
       ".verdict[data-loads=yes]{color:#0a7d28;border-color:#0a7d28}.verdict[data-loads=no]{color:#b00020;border-color:#b00020}")
SET_URL = "(job) => { if (job) { const u = new URL(window.location); u.searchParams.set('job', job); window.history.replaceState(null, '', u); } return job; }"


def build(server: Server) -> gr.Blocks:
    signed_in_note = server.login.problem or ("Sign in to open a pull request or create a fork as yourself." if server.login.space
                                              else f"Local server: fixes run as {server.login.local.user} (this machine's login).")
    # gradio copies each report download into its cache: those copies go with their job (and all at a restart)
    with gr.Blocks(title="ckpt-repair", analytics_enabled=False, delete_cache=(3600, KEEP_FINISHED_S)) as demo:
        gr.Markdown(f"# {render.TOOL}\nPaste a Hub model repo: see what the runtime will do with it, then get a fixed fork or a pull request.")
        with gr.Row():
            if server.login.space or server.login.local.signed_in:
                gr.LoginButton(elem_id="login")
            gr.Markdown(render.esc(signed_in_note), elem_id="signin-note")
        with gr.Row():
            repo = gr.Textbox(label="Hub repo id (owner/name or owner/name@revision)", elem_id="repo", scale=3)
            folders = _local_folders(server.root)
            local = gr.Dropdown(label=f"or a local folder under {server.root}", choices=[""] + folders, value="", visible=server.root is not None,
                                allow_custom_value=True, elem_id="local")  # a typed name: the handler checks it
        with gr.Row():
            targets = choices.targets()
            target = gr.Dropdown(label="Runtimes and releases (one or several: a verdict each, and the fix satisfies them all; "
                                       "or type one, e.g. sglang==0.5.23)", choices=targets, value=[targets[0]], multiselect=True,
                                 allow_custom_value=True, elem_id="target", scale=2)  # a typed release or list: the handler checks it
            tp = gr.Number(label="Tensor-parallel degree", value=1, precision=0, elem_id="tp")  # range: the handler
            recipe = gr.Dropdown(label="Repair", choices=choices.recipes(), value=choices.FOR_TARGET, elem_id="recipe")
        check = gr.Button("Check", variant="primary", elem_id="check")
        error = gr.HTML(elem_id="error")
        verdict = gr.HTML(elem_id="verdict")
        doctor = gr.Textbox(label="doctor (what `ckpt-repair doctor` prints)", lines=8, interactive=False, elem_id="doctor")
        findings = gr.Markdown(elem_id="findings")
        modules = gr.Dataframe(headers=[*render.HEADERS[:6], "built as", render.HEADERS[-1]], interactive=False, elem_id="modules", label="Modules")
        plan = gr.Textbox(label="The plan", lines=6, interactive=False, elem_id="plan")
        transfer = gr.HTML(elem_id="transfer")
        analysis = gr.State(None)
        with gr.Row():
            mode = gr.Radio([("Open a pull request", "pr"), ("Create a fixed fork", "fork")], value="pr", label="Publish as", elem_id="mode")
            fork = gr.Textbox(label="Fork name (owner/name; empty: yours/<name>-fixed)", elem_id="fork")
            private = gr.Checkbox(label="Private fork", elem_id="private")
        go = gr.Button("Fix", variant="primary", elem_id="fix")
        command = gr.Markdown(elem_id="command")
        job_id = gr.Textbox(visible=False, elem_id="job-id")
        job = gr.Markdown(elem_id="job")
        result = gr.HTML(elem_id="result")
        report = gr.File(label="repair_report.json", elem_id="report", interactive=False)
        gr.Markdown(f"<small id='tool-version'>{render.TOOL}</small>")

        @one_line_errors(lambda line: (render.error(line, time.time_ns()), "", "", "", [], "", "", None))
        def on_check(repo_text, local_name, target_spec, degree, recipe_name, profile: gr.OAuthProfile | None,
                     oauth: gr.OAuthToken | None):
            who = server.login.identify(profile, oauth)
            degree = handlers.tp_degree(degree)
            request = {"source": source_of(server, repo_text, local_name), "target": handlers.targets_of(target_spec), "tp": degree,
                       "recipe": recipe_name}
            answer = run_doctor(server, who, request)
            kept = {**request, "target": answer["target"], "local": bool(local_name), "bytes": answer["bytes"], "plan_error": answer["plan_error"], "noop": answer["noop"],
                    "quantized": answer["quantized"]}
            return ("", render.verdict(answer, degree, time.time_ns()), answer["doctor_text"], render.findings(answer), answer["modules"],
                    answer["plan_text"] or "", render.transfer(answer), kept)
        check.click(on_check, [repo, local, target, tp, recipe], [error, verdict, doctor, findings, modules, plan, transfer, analysis],
                    concurrency_limit=4)

        @one_line_errors(lambda line: (render.error(line), gr.skip(), gr.skip(), gr.skip()))
        def on_fix(kept, how, fork_name, is_private, profile: gr.OAuthProfile | None, oauth: gr.OAuthToken | None):
            who = server.login.identify(profile, oauth)
            request = fix_request(kept, how, fork_name, is_private, who)
            started = server.jobs.submit(who.user, request, who.token)
            status = server.jobs.view(started.id, who.user)
            return "", render.same_as(handlers.command_line(kept, request)), started.id, render.job(status)
        go.click(on_fix, [analysis, mode, fork, private], [error, command, job_id, job]).then(None, [job_id], [job_id], js=SET_URL)

        @one_line_errors(lambda line: (render.error(line), gr.skip(), gr.skip()))
        def on_poll(current, profile: gr.OAuthProfile | None, oauth: gr.OAuthToken | None):
            if not current:
                return gr.skip(), gr.skip(), gr.skip()
            status = server.jobs.view(current, server.login.identify(profile, oauth).user)
            if status is None:
                line = "no such job for you: it belongs to another account, or the server has restarted; sign in as its owner"
                return render.error(line), "", None
            if status.get("error"):
                status["error"] = handlers.worker_line(server, status["error"])
            done = status.get("result") or {}
            path = server.jobs.state / "jobs" / status["id"] / done["report_file"] if done.get("report_file") else None
            return render.job(status), render.result(status), str(path) if path else None
        gr.Timer(1.0).tick(on_poll, [job_id], [job, result, report], show_progress="hidden")

        def on_load(request: gr.Request):
            return request.query_params.get("job", "") if request else ""
        demo.load(on_load, None, [job_id])
    return demo


def _local_folders(root: Path | None) -> list[str]:
    """Checkpoint folders (holding a config.json) up to two levels under the root, as names relative to it; never
    one a link leads outside the root, nor a hidden one."""
    if root is None:
        return []
    found = [p.parent for pattern in ("*/config.json", "*/*/config.json") for p in root.glob(pattern)]
    names = [p.relative_to(root).as_posix() for p in found if p.resolve().is_relative_to(root.resolve())]
    return sorted(n for n in names if not any(part.startswith(".") for part in n.split("/")))


def make_server(root: Path | None = None, state: Path | None = None, *, workers: int = 1, max_queued: int = 8) -> Server:
    """The server's shared parts: the login, a state folder (marked, removed at exit) and the job table."""
    login = Login(True) if on_space() else local_login()
    parent = Path(state) if state is not None else Path(tempfile.gettempdir())
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging.remove_stale(parent, "ckpt-repair-web-")
        folder = staging.new_marked(parent, "ckpt-repair-web-")
    except OSError as exc:
        raise OutputError(f"{parent}: cannot make the server's state folder here ({exc.strerror or exc}); give a writable "
                          "folder as --state") from None
    jobs = JobTable(folder, workers=workers, max_queued=max_queued).start()
    return Server(login, jobs, Spares(jobs.state / "cwd", jobs.env, jobs.state / "doctor-tmp"), root.resolve() if root else None)


def serve(server: Server, host: str, port: int | None) -> gr.Blocks:
    """The page, served in gradio's threads (the caller blocks, see run_until_stopped)."""
    demo = build(server)
    demo.queue(max_size=64, default_concurrency_limit=8)
    try:
        demo.launch(server_name=host, server_port=port, css=CSS, show_error=False, quiet=True, prevent_thread_lock=True,
                    ssr_mode=False, footer_links=[])
    except OSError:  # gradio's own text names its launch() parameter and an environment variable
        raise UsageError(f"{host}:{port}: cannot listen there (the port is taken, or the address is not this machine's); "
                         "choose another --port (0: any free one) or --host") from None
    return demo


def run_until_stopped(server: Server, host: str, port: int | None, announce=lambda url: None) -> None:
    """Serve until Ctrl-C or SIGTERM (a Space or a service manager stopping it): then running workers are
    stopped and the state folder is removed, as after Ctrl-C."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        demo = serve(server, host, port)
        announce(demo.local_url)
        demo.block_thread()  # returns on KeyboardInterrupt
    finally:
        close(server)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """The Space's entry point: host and port from gradio's own environment variables."""
    run_until_stopped(make_server(), default_host(), int(os.environ.get("GRADIO_SERVER_PORT", "7860")))


def close(server: Server) -> None:
    server.spares.close()
    server.jobs.close()
    shutil.rmtree(server.jobs.state, ignore_errors=True)


if __name__ == "__main__":
    main()
