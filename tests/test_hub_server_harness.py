"""What tools.hub_server.LocalHub offers tests beyond the Hub API, used through the real huggingface_hub
client (127.0.0.1 only, no network): hostile file names ("../escape.txt", absolute paths) stored
verbatim for the tool's refusal tests, the immutable request log, and repos persisting on disk across
a stop and restart."""

# First: importing the helpers sets the client's environment variables before huggingface_hub is imported.
from tests.hub_server_helpers import REPO, _client_env, _raw, api, hub, src_folder  # noqa: F401 - fixtures

import base64
import json

import httpx2  # the installed client's HTTP library
import pytest
from huggingface_hub import HfApi, hf_hub_download

from tools.hub_server import LocalHub, RequestRecord


# --------------------------------------------------------------------- odd paths
def test_raw_paths_are_stored_verbatim(hub, api, src_folder, tmp_path):
    hub.add_repo(REPO, src_folder)
    hub.add_raw_file(REPO, "../escape.txt", b"evil")
    sha = hub.add_raw_file(REPO, "/abs/path.bin", b"\x00evil", lfs=True)
    assert {"../escape.txt", "/abs/path.bin"} <= set(api.list_repo_files(REPO))
    assert {"../escape.txt", "/abs/path.bin"} <= {s.rfilename for s in api.model_info(REPO).siblings}
    assert hub.repo_files(REPO, sha)["/abs/path.bin"] == b"\x00evil"
    with pytest.raises(ValueError):  # the client refuses to materialise it; the tool must not rely on that alone
        hf_hub_download(REPO, "../escape.txt", endpoint=hub.endpoint, token=False, cache_dir=tmp_path / "c")
    line = json.dumps({"key": "file", "value": {"path": "../../etc/x", "encoding": "base64",
                                                "content": base64.b64encode(b"raw").decode()}})
    header = json.dumps({"key": "header", "value": {"summary": "raw commit"}})
    status, _, body = _raw(hub, "POST", f"/api/models/{REPO}/commit/main", body=f"{header}\n{line}\n".encode(),
                           headers={"Content-Type": "application/x-ndjson"})
    assert status == 200 and hub.repo_files(REPO)["../../etc/x"] == b"raw"
    assert json.loads(body)["commitOid"] == hub.head(REPO)


# ------------------------------------------------------------------ log & restart
def test_request_log_and_persistence(tmp_path, src_folder):
    with LocalHub(tmp_path / "hub", token="hf_other", user="bob") as hub:
        assert hub.endpoint.startswith("http://127.0.0.1:")
        sha = hub.add_repo("bob/m", src_folder)
        api = HfApi(endpoint=hub.endpoint, token="hf_other")
        api.model_info("bob/m")
        rec = hub.requests[-1]
        assert isinstance(rec, RequestRecord) and (rec.method, rec.path, rec.status) == ("GET", "/api/models/bob/m", 200)
        with pytest.raises(AttributeError):
            rec.status = 1
        hub.clear_log()
        assert hub.requests == []
        assert api.whoami()["name"] == "bob"
    with pytest.raises(RuntimeError):
        hub.endpoint
    with pytest.raises(httpx2.TransportError):  # stopped: kept-alive client connections are closed too
        api.model_info("bob/m")
    with LocalHub(tmp_path / "hub") as again:  # state lives on disk
        assert again.head("bob/m") == sha
        assert HfApi(endpoint=again.endpoint, token=False).model_info("bob/m").sha == sha
