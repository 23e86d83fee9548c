"""A doctor worker started before anyone asks: its interpreter is up and its imports are done (about 1 s on
two cores), and it waits for its request on stdin. Each Check takes the spare and starts the next one."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

COMMAND = [sys.executable, "-m", "repair.web.worker", "doctor"]


class Spares:
    """`tmp`: the workers' temp folder (their TMPDIR), where each makes its Hub work folder; the server's own, so a
    worker killed at its timeout has its folder removed there at once (handlers.run_doctor)."""

    def __init__(self, cwd: Path, env: dict, tmp: Path):
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.cwd, self.env = cwd, {**env, "TMPDIR": str(self.tmp)}
        self.lock = threading.Lock()
        self.spare: subprocess.Popen | None = None
        self.closed = False
        self._refill()

    def take(self) -> subprocess.Popen:
        """A started doctor worker (the spare, or a new one if it died), and a new spare on the way."""
        with self.lock:
            proc, self.spare = self.spare, None
        if proc is None or proc.poll() is not None:
            proc = self._start()
        threading.Thread(target=self._refill, daemon=True).start()
        return proc

    def close(self) -> None:
        with self.lock:
            self.closed = True
            proc, self.spare = self.spare, None
        if proc is not None:
            proc.kill()
            proc.wait()

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen(COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                cwd=self.cwd, env=self.env)

    def _refill(self) -> None:
        proc = self._start()
        with self.lock:
            if self.spare is None and not self.closed:
                self.spare, proc = proc, None
        if proc is not None:  # one is already waiting, or the server is closing
            proc.kill()
            proc.wait()
