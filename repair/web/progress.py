"""A fix's progress for the page: the phase, from the lines `hub fix` says, and bytes by phase, measured
on the job's own disk (downloads in flight) against the bytes the plan said it would move."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Callable

_PHASES = (  # (what a progress line starts with, the phase it begins)
    ("source:", "checking the source and the destination"),
    ("token:", "checking the token's rights"),
    ("fork: ", "creating the fork"),
    ("download ", "downloading"),
    ("upload ", "uploading"),
    ("committed ", "committed"),
    ("pull request: http", "pull request opened"),
)
_DOWNLOAD = re.compile(r"download (\S+) \(([\d,]+) bytes\)")
_UPLOAD = re.compile(r"upload (\S+) -> ")


def phase_of(line: str, current: str) -> str:
    for start, phase in _PHASES:
        if line.startswith(start):
            return phase
    return current


class Meter:
    """Bytes done per phase: downloads as they land in the job's work folder, uploads file by file."""

    def __init__(self, folder: Path, planned: dict, publish: Callable[[dict], None]):
        self.folder, self.publish = folder, publish
        self.done_files: dict[str, int] = {}  # downloads complete -> bytes
        self.current: str | None = None  # the download in flight
        self.sizes: dict[str, int] = {}
        self.uploaded: dict[str, int] = {}  # rewritten file -> its size, once its upload began
        self.totals = {"download": int(planned.get("download") or 0), "upload": int(planned.get("upload") or 0)}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def line(self, text: str) -> None:
        """One progress line of `hub fix`: a download starts (the one before is complete), or a file is uploaded."""
        download, upload = _DOWNLOAD.match(text), _UPLOAD.match(text)
        if download or upload:
            self._finish_download()
        if download:
            self.current = download[1]
            self.sizes[download[1]] = int(download[2].replace(",", ""))
        elif upload and upload[1] not in self.uploaded:
            self.uploaded[upload[1]] = _size_of(self.folder, upload[1])
        self.sample()

    def _finish_download(self) -> None:
        if self.current is not None:
            self.done_files[self.current] = self.sizes.get(self.current, 0)
            self.current = None

    def sample(self) -> None:
        in_flight = _bytes_under(self.folder, "dl") if self.current else 0
        down = sum(self.done_files.values()) + in_flight
        up = sum(self.uploaded.values())
        self.publish({"download": [down, max(self.totals["download"], down)], "upload": [up, max(self.totals["upload"], up)]})

    def _loop(self) -> None:
        while not self.stop.wait(0.5):
            self.sample()

    def __enter__(self) -> "Meter":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=2)


def _bytes_under(folder: Path, name: str) -> int:
    """Bytes of the files below every `<work>/<name>/` folder of this job (huggingface_hub's .incomplete too)."""
    total = 0
    for sub in folder.glob(f"*/{name}"):
        for path in sub.rglob("*"):
            try:
                total += path.stat().st_size if path.is_file() else 0
            except OSError:
                continue
    return total



def _size_of(folder: Path, name: str) -> int:
    """The size of a rewritten file about to be uploaded (in `<work>/out/`)."""
    for path in folder.glob("*/out"):
        try:
            return (path / name).stat().st_size
        except OSError:
            continue
    return 0
