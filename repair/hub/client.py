"""huggingface_hub access: every Hub call goes through the real client, configured at call time.

The endpoint (HF_ENDPOINT) and cache (HF_HUB_CACHE / HF_HOME) are read from the environment when a
call is made and passed explicitly, because huggingface_hub reads its constants once at import. The
token is never handled here: huggingface_hub finds it (HF_TOKEN, then the saved login) by itself.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
WORKERS = 8


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def api():
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint())


def cache_dir() -> Path:
    """Where `fix` keeps whole downloads: huggingface_hub's cache, as the environment says now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def download(repo: str, sha: str, name: str, *, local_dir: Path | None = None) -> Path:
    """One file at the pinned commit: into `local_dir` (a work folder), else into the cache."""
    from huggingface_hub import hf_hub_download

    if local_dir is not None:
        return Path(hf_hub_download(repo, name, revision=sha, endpoint=endpoint(), local_dir=local_dir))
    return Path(hf_hub_download(repo, name, revision=sha, endpoint=endpoint(), cache_dir=cache_dir()))


def map_threads(fn, items: list) -> list:
    """fn over items on a few threads (Hub round trips dominate), results in order, first error raised."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(items))) as pool:
        return list(pool.map(fn, items))


def quiet_progress(quiet: bool) -> None:
    """huggingface_hub's own progress bars only on a terminal, and never with --quiet."""
    from huggingface_hub.utils import disable_progress_bars

    if quiet or not sys.stderr.isatty():
        disable_progress_bars()
