"""`ckpt-repair serve`: the web front door (needs the `web` extra: pip install 'ckpt-repair[web]')."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import click


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=7860, show_default=True, help="The port (0: any free one).")
@click.option("--root", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
              help="Offer the checkpoint folders under ROOT (and nothing outside it) as sources.")
@click.option("--expose-root", is_flag=True, help="Offer --root even when listening beyond 127.0.0.1 (anyone who reaches the page reads it).")
@click.option("--expose-login", is_flag=True, help="Serve beyond 127.0.0.1 off a Space, where the page signs everyone in as this machine's Hub account.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Fix jobs run at the same time.")
@click.option("--queue", "max_queued", type=click.IntRange(min=1), default=8, show_default=True, help="Fix jobs that may wait.")
@click.option("--state", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where jobs keep their status and work folders (default: the system temp folder).")
def serve(host: str, port: int, root: Path | None, expose_root: bool, expose_login: bool, workers: int, max_queued: int, state: Path | None) -> None:
    """Serve the web page: paste a repo id, see the verdict, open a pull request or create a fixed fork."""
    from repair.errors import UsageError
    from repair.web.session import on_space

    if root is not None and not _loopback(host) and not expose_root:
        raise UsageError(f"--root with --host {host}: local folders are offered only on 127.0.0.1; add --expose-root to offer them anyway")
    if not _loopback(host) and not expose_login and not on_space():
        raise UsageError(f"--host {host}: off a Space the page signs everyone who reaches it in as this machine's Hugging Face "
                         "account (its private repos, publishing as it), so only on 127.0.0.1; add --expose-login to serve it anyway")
    try:
        from repair.web.app import make_server, run_until_stopped
    except ImportError as err:
        raise UsageError(f"`serve` needs the web extra ({err.name} is missing): pip install 'ckpt-repair[web]'") from None
    server = make_server(root, state, workers=workers, max_queued=max_queued)
    run_until_stopped(server, host, port or None, lambda url: click.echo(
        f"ckpt-repair: serving on {url} (Ctrl-C stops it; running jobs are stopped and cleaned up)", err=True))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
