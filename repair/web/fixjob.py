"""One fix job, inside its worker process: `hub fix` (repair.hub.workflow) with the page's choices, its
progress lines and bytes published to the job's status, and the committed repair_report.json fetched
back for the page to offer. The work folder lives in the job's folder, marked as `hub fix` marks it,
so a killed worker's folder is removed by the server (repair.io.staging.remove_stale)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from repair.execute.report import REPORT_NAME
from repair.hub import client
from repair.hub.errors import hub_call
from repair.hub.source import work_folder
from repair.hub.workflow import HubFix, hub_fix
from repair.web.choices import recipe_for
from repair.web.progress import Meter


def run_fix(request: dict, folder: Path, status) -> dict:
    """Run the fix the request describes; returns hub fix's summary plus the report's file name, if any."""
    pr = request.get("mode") == "pr"
    options = HubFix(request["source"], None if pr else request.get("fork"), pr, bool(request.get("private")),
                     recipe=recipe_for(request.get("recipe"), request.get("target")), workdir=folder, quiet=True)
    with Meter(folder, request.get("bytes") or {}, lambda p: status.update(progress=p)) as meter:
        def say(line: str) -> None:
            status.say(line)
            meter.line(line)

        result = hub_fix(options, say)
        meter.sample()
    result["report_file"] = fetch_report(result, folder)
    return result


def fetch_report(result: dict, folder: Path) -> str | None:
    """The repair_report.json that was committed (the fork's commit, else the pull request's), copied into
    the job's folder for the page's download button."""
    fork, pr = result.get("fork") or {}, result.get("pr") or {}
    where = (fork.get("repo"), fork.get("commit")) if fork.get("commit") else (result["source"]["repo"], pr.get("commit"))
    if not where[1]:
        return None
    work = work_folder(folder)
    try:
        with hub_call(f"{where[0]}@{where[1]}/{REPORT_NAME}"):
            got = client.download(where[0], where[1], REPORT_NAME, local_dir=work)
        os.replace(got, folder / REPORT_NAME)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return REPORT_NAME
