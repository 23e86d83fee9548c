"""Fix jobs that outlive the browser: each runs in its own worker process (repair.web.worker) under an
unguessable id, and the page polls the job's status. One job per user at a time; a bounded queue whose
page says how many jobs are ahead; a user sees only their own jobs.

The token goes to the worker on its stdin and is kept in memory only until the worker starts. Each job
has a folder under the server's state folder: status.json (written by the worker), the fetched
repair_report.json, and while it runs the worker's `ckpt-repair-hub-<pid>-*` work folder, which a
worker that was killed leaves behind and `reap` removes (repair.io.staging's marker and pid rule).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from repair.errors import UsageError
from repair.hub.source import WORK_PREFIX
from repair.io import staging
from repair.web.worker import STATUS

ACTIVE = ("queued", "running")
KEEP_FINISHED_S = 24 * 3600  # a finished job's page (and report) stays this long, then its folder goes


@dataclass
class Job:
    id: str
    owner: str
    folder: Path
    request: dict  # never holds the token
    token: str | None = field(default=None, repr=False)
    state: str = "queued"
    proc: subprocess.Popen | None = field(default=None, repr=False)
    created: float = field(default_factory=time.time)
    ended: str | None = None  # how the server saw the worker end, when the worker could not say
    finished: float | None = None


class JobTable:
    """The server's jobs; `tick` (called by a background thread) starts queued jobs and reaps ended ones."""

    def __init__(self, state: Path, *, workers: int = 1, max_queued: int = 8, env: dict | None = None):
        self.state, self.workers, self.max_queued = Path(state), workers, max_queued
        self.env = env if env is not None else worker_env()
        self.jobs: dict[str, Job] = {}
        self.lock = threading.RLock()
        (self.state / "jobs").mkdir(parents=True, exist_ok=True)
        (self.state / "cwd").mkdir(exist_ok=True)  # workers run here: an empty folder, so no repo id is read as a local path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ckpt-repair-jobs", daemon=True)

    def start(self) -> "JobTable":
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop scheduling; end running workers (SIGTERM: hub fix removes its work folder) and reap them."""
        self._stop.set()
        with self.lock:
            for job in self.jobs.values():
                if job.proc is not None and job.proc.poll() is None:
                    job.proc.send_signal(signal.SIGTERM)
            for job in self.jobs.values():
                if job.proc is not None:
                    try:
                        job.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        job.proc.kill()
                        job.proc.wait()
                    self._reap(job)

    def submit(self, owner: str, request: dict, token: str | None) -> Job:
        with self.lock:
            mine = [j for j in self.jobs.values() if j.owner == owner and j.state in ACTIVE]
            if mine:
                raise UsageError(f"you already have a job {mine[0].state} ({mine[0].id}); wait for it to finish, then start another")
            if sum(1 for j in self.jobs.values() if j.state == "queued") >= self.max_queued:
                raise UsageError(f"the queue is full ({self.max_queued} jobs waiting); try again in a few minutes")
            job_id = secrets.token_hex(8)
            folder = self.state / "jobs" / job_id
            folder.mkdir()
            job = Job(job_id, owner, folder, dict(request), token)
            self.jobs[job_id] = job
        self.tick()
        return job

    def view(self, job_id: str, owner: str | None) -> dict | None:
        """The job's status as its owner may see it (None for anyone else, as for an unknown id)."""
        with self.lock:
            job = self.jobs.get(job_id or "")
            if job is None or owner is None or job.owner != owner:
                return None
            ahead = sum(1 for j in self.jobs.values() if j.state == "queued" and j.created < job.created)
            status = read_status(job.folder)
            said = status.get("state")  # the worker's last word is news before the server has reaped it
            state = said if job.state == "running" and said in ("done", "failed") else job.state
            status.update(id=job.id, state=state, ahead=ahead if state == "queued" else 0, request=job.request)
            if job.ended:
                status["error"] = job.ended
            return status

    def tick(self) -> None:
        with self.lock:
            for job in self.jobs.values():
                if job.state == "running" and job.proc is not None and job.proc.poll() is not None:
                    self._reap(job)
            for job in [j for j in self.jobs.values() if j.finished and time.time() - j.finished > KEEP_FINISHED_S]:
                shutil.rmtree(job.folder, ignore_errors=True)
                del self.jobs[job.id]
            running = sum(1 for j in self.jobs.values() if j.state == "running")
            for job in sorted((j for j in self.jobs.values() if j.state == "queued"), key=lambda j: j.created):
                if running >= self.workers:
                    break
                self._start(job)
                running += 1

    def _start(self, job: Job) -> None:
        try:
            job.proc = subprocess.Popen([sys.executable, "-m", "repair.web.worker", "fix", str(job.folder)], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.state / "cwd", env=self.env)
        except OSError as exc:  # no memory or no process slot: this job fails in one line, the others go on
            job.state, job.token, job.finished = "failed", None, time.time()
            job.ended = f"the worker process could not start ({exc.strerror or exc}); nothing was done; start the fix again later"
            return
        job.state = "running"
        payload, job.token = json.dumps({**job.request, "token": job.token}), None
        try:
            job.proc.stdin.write(payload.encode())
            job.proc.stdin.close()
        except OSError:  # the worker died at once: reaped as killed
            pass

    def _reap(self, job: Job) -> None:
        """The worker has ended: its own last word, else what the server saw; then nothing temporary is left."""
        code = job.proc.wait()
        status = read_status(job.folder)
        if status.get("state") in ("done", "failed"):
            job.state = status["state"]
        else:
            job.state = "killed"
            job.ended = killed_line(code, status)
        job.finished = time.time()
        for leftover in job.folder.glob(f".{STATUS}.*"):
            leftover.unlink(missing_ok=True)
        staging.remove_stale(job.folder, WORK_PREFIX)

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the scheduler must outlive one bad tick (a full disk...); the next tries again
                continue


def killed_line(code: int, status: dict) -> str:
    how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exited with status {code}"
    phase = status.get("phase") or "starting"
    done = [line for line in status.get("lines", []) if line.startswith(("committed ", "pull request: http"))]
    said = f"; this was already done: {done[-1]}" if done else "; nothing was committed"
    return f"the worker process {how} while {phase}{said}; its temporary files were removed; start the fix again"


def read_status(folder: Path) -> dict:
    try:
        value = json.loads((folder / STATUS).read_text())
    except (OSError, ValueError):
        return {"state": "queued", "phase": "waiting for a worker", "lines": [], "progress": {}}
    return value if isinstance(value, dict) else {}


def worker_env() -> dict:
    """The workers' environment: the server's without its own token (each worker gets its user's on stdin)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
    return env
