"""A local, stdlib-only, Hugging Face Hub-compatible HTTP server for offline tests of the real client.

    from tools.hub_server import LocalHub

    with LocalHub(tmp_path / "hub") as hub:
        sha = hub.add_repo("alice/src", fixture_dir)
        api = HfApi(endpoint=hub.endpoint, token=hub.token)

See ``server.LocalHub`` for the helpers and ``routes_*`` modules for the endpoints. Model repos only.
"""

from .httpbase import RequestRecord
from .server import LocalHub

__all__ = ["LocalHub", "RequestRecord"]
