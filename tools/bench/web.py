"""The web page's cost (`.venv-web/bin/python tools/benchmark.py --only web`): doctor through the page against
doctor through the CLI on the same Hub repo, alternated, and the server's memory idle and during a fix.

The repo is the broken 31B-shape assistant (split modules, a 512 MB embedding shard) on tools.hub_server
(127.0.0.1). "page" is one Check through gradio_client: the server runs doctor, inspect and the plan in
a worker process; "CLI" is `ckpt-repair doctor`. Memory is VmRSS from /proc: the server process alone, and its
largest worker process (the fix runs there; a spare doctor worker waits beside it) separately.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from tools.bench.measure import CLI, REPO, load

TARGET = "vllm==0.21.0"


def rss_mb(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in text.splitlines() if line.startswith("VmRSS:")), 0.0)


def children(pid: int) -> list[int]:
    """Child processes started by any thread of `pid` (the job table starts workers from its own thread)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def run(repeats: int = 9) -> dict:
    """The figures (seconds, MB); every process it starts is stopped, every file it writes removed."""
    import shutil
    import subprocess

    os.environ.update(HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1", GRADIO_ANALYTICS_ENABLED="False")
    from gradio_client import Client

    from repair.web.choices import FOR_TARGET
    from tests.web.conftest import App, hub_env
    from tools.bench.inputs import build_31b
    from tools.hub_server import LocalHub

    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-web-", dir="/tmp"))
    try:
        with LocalHub(work / "hub") as hub:
            hub.add_repo("alice/big", build_31b(work / "a31b"))
            shutil.rmtree(work / "a31b")
            started = time.perf_counter()
            app = App(work / "app", hub_env(hub, work / "home", hub.token))
            out: dict = {"start_s": time.perf_counter() - started, "repeats": repeats, "load_start": load()}
            try:
                time.sleep(2)
                out["idle_mb"] = rss_mb(app.proc.pid)
                client = Client(app.url, verbose=False)

                def page() -> float:
                    t = time.perf_counter()
                    answer = client.predict("alice/big", "", TARGET, 1, FOR_TARGET, api_name="/on_check")
                    assert answer[0] == "", answer[0]
                    return time.perf_counter() - t

                def cli() -> float:
                    t = time.perf_counter()
                    done = subprocess.run([*CLI, "doctor", "alice/big", "--target", TARGET], cwd=REPO, env=app.env, capture_output=True)
                    assert done.returncode in (0, 1), done.stderr
                    return time.perf_counter() - t

                times: dict[str, list[float]] = {"page": [], "cli": []}
                for round_ in range(repeats):
                    for name, fn in ((("page", page), ("cli", cli)) if round_ % 2 == 0 else (("cli", cli), ("page", page))):
                        times[name].append(fn())
                out["doctor"] = {k: {"s": statistics.median(v), "runs": [round(x, 3) for x in v]} for k, v in times.items()}
                out.update(_during_fix(app, work))
                out["load_end"] = load()
            finally:
                app.stop()
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _during_fix(app, work: Path) -> dict:
    """Peak RSS of the server and of its workers while one fix (a PR on the 31B-shape repo) runs."""
    peaks = {"server": 0.0, "worker": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peaks["server"] = max(peaks["server"], rss_mb(app.proc.pid))
            for child in children(app.proc.pid):
                peaks["worker"] = max(peaks["worker"], rss_mb(child))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    started = time.perf_counter()
    done = _fix_through_page(app)
    stop.set()
    thread.join()
    return {"fix_s": time.perf_counter() - started, "fix_ok": done, "server_peak_mb": peaks["server"], "worker_peak_mb": peaks["worker"],
            "idle_after_mb": rss_mb(app.proc.pid)}


def _fix_through_page(app) -> bool:
    """A PR opened in the browser, signed in as the machine's login (as the local page does)."""
    from playwright.sync_api import sync_playwright

    from tests.web.conftest import CHROMIUM, FLAGS
    from tests.web.web_helpers import check, fix, open_page, sign_in

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(tempfile.mkdtemp(prefix="ckpt-bench-profile-"), executable_path=CHROMIUM,
                                                       headless=True, args=FLAGS)
        try:
            page = open_page(context, app.url)
            sign_in(page)
            check(page, "alice/big", TARGET)
            fix(page, "pr")
            page.locator("#pr-link").wait_for(timeout=600_000)
            return True
        finally:
            context.close()


def section(r: dict) -> list[str]:
    d = r["doctor"]
    added = d["page"]["s"] - d["cli"]["s"]
    return [
        "## Web page (`ckpt-repair serve`)",
        "",
        f"`.venv-web/bin/python tools/benchmark.py --only web`: the broken 31B-shape assistant on the local Hub, {r['repeats']} alternated rounds "
        f"(load average {r.get('load_start', '?')} at the start, {r.get('load_end', '?')} at the end: the machine is shared).",
        "",
        "| | median s | runs |",
        "|---|---|---|",
        f"| `ckpt-repair doctor` (CLI) | {d['cli']['s']:.2f} | {d['cli']['runs']} |",
        f"| Check through the page (doctor + inspect + plan in a worker) | {d['page']['s']:.2f} | {d['page']['runs']} |",
        "",
        f"The page adds **{added:+.2f} s** to the CLI's doctor (ratio {d['page']['s'] / d['cli']['s']:.2f}); the target is at most 1 s.",
        "",
        "| server memory | MB |",
        "|---|---|",
        f"| idle, after start ({r['start_s']:.1f} s to answer) | {r['idle_mb']:.0f} |",
        f"| during a fix (a PR, {r['fix_s']:.1f} s through the browser): the server process | {r['server_peak_mb']:.0f} |",
        f"| during that fix: its largest worker process (the fix runs there) | {r['worker_peak_mb']:.0f} |",
        f"| idle after the fix | {r['idle_after_mb']:.0f} |",
    ]


def splice(text: str, lines: list[str]) -> str:
    """BENCHMARKS.md with this section replaced, or added at the end: after "## Findings", which a full run of
    tools/benchmark.py keeps as written, so that run does not drop it."""
    block = "\n".join(lines) + "\n"
    head = "## Web page (`ckpt-repair serve`)"
    if head in text:
        before, rest = text.split(head, 1)
        after = rest.split("\n## ", 1)
        return before + block + ("\n## " + after[1] if len(after) > 1 else "")
    return text.rstrip("\n") + "\n\n" + block


def main(out: Path) -> None:
    lines = section(run())
    out.write_text(splice(out.read_text() if out.exists() else "# Benchmarks\n", lines))
    print("\n".join(lines))


if __name__ == "__main__":
    import sys

    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "BENCHMARKS.md")
