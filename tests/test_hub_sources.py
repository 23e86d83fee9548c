"""A Hub repo id where the commands take a folder, against tools.hub_server.LocalHub with the real
huggingface_hub client: `inspect` and `doctor` on `owner/name[@rev]` read the shard headers (and
doctor the scales) by ranged GETs and never a whole shard, `fix SRC -o OUT` downloads the pinned
revision into huggingface_hub's cache and writes what a local fix writes, and `--original` given as a
Hub repo is downloaded and verified like a local one. The request log is the evidence."""

from __future__ import annotations

import json
from pathlib import Path

from repair.io.safetensors import read_header

from tests.hub_workflow_helpers import (  # noqa: F401 - fixtures
    SHARDS, SRC, folder_files, full_gets, hub, hub_env, ranged, run,
)


def shard_header_ends(folder: Path) -> dict[str, int]:
    return {n: read_header(folder / n).data_start for n in SHARDS}


# ----------------------------------------------------------------------------- inspect / doctor
def test_inspect_and_doctor_on_a_hub_repo_read_headers_not_shards(hub, broken, capsys, monkeypatch):
    import repair.hub.source as source

    monkeypatch.setattr(source, "FIRST_READ", 16)  # these shards are smaller than a first read: make it a prefix
    sha = hub.add_repo(SRC, broken)
    hub.clear_log()
    code, out, _ = run(capsys, "inspect", f"{SRC}@main")
    assert code == 0
    local = run(capsys, "inspect", broken)[1]
    assert out.splitlines()[0] == f"{SRC}@{sha}: " + local.splitlines()[0].split(": ", 1)[1]
    assert out.splitlines()[1:] == local.splitlines()[1:]
    assert not [n for n in full_gets(hub) if n.endswith(".safetensors")], "inspect downloaded a shard"
    ends = shard_header_ends(broken)
    for name in SHARDS:  # exactly the first read and the rest of the header, nothing else
        assert sorted(ranged(hub, name)) == [(0, 16), (16, ends[name])]
    assert set(full_gets(hub)) == {"config.json", "hf_quant_config.json", "model.safetensors.index.json"}
    assert all(r.method in ("GET", "HEAD") for r in hub.requests)
    assert json.loads(run(capsys, "inspect", SRC, "--json")[1])["source"] == f"{SRC}@{sha}"

    hub.clear_log()
    code, out, _ = run(capsys, "doctor", SRC, "--target", "vllm==0.24.0")
    local_code, local_out = run(capsys, "doctor", broken, "--target", "vllm==0.24.0")[:2]
    verdict = lambda text: [line.replace(str(broken), "SRC").replace(SRC, "SRC")  # noqa: E731  (the suggested command names its SRC)
                            for line in text.splitlines() if not line.startswith("block scales")]
    assert (code, verdict(out)) == (local_code, verdict(local_out)) and code == 1
    assert "block scales were not scanned (on the Hub each sample would cost a request); run with --deep to scan all 5.8 KB" in out
    assert not [n for n in full_gets(hub) if n.endswith(".safetensors")], "doctor downloaded a shard"
    read = sum(e - s for n in SHARDS for s, e in ranged(hub, n))
    total = sum((broken / n).stat().st_size for n in SHARDS)
    assert read < total * 0.2, f"doctor read {read} of {total} shard bytes (headers and scales only)"



# ----------------------------------------------------------------------------- fix SRC -o OUT
def test_fix_to_a_local_folder_from_a_hub_repo(hub, broken, local_fix, tmp_path, capsys):
    hub.add_repo(SRC, broken)
    hub.clear_log()
    code, out, _ = run(capsys, "fix", SRC, "-o", tmp_path / "out", "--dry-run")
    assert code == 0 and "dry run" in out and not [n for n in full_gets(hub) if n.endswith(".safetensors")]
    code, out, err = run(capsys, "fix", SRC, "-o", tmp_path / "out", "--quiet")
    assert code == 0, err
    got, want = folder_files(tmp_path / "out"), folder_files(local_fix)
    assert set(got) == set(want) and {n for n in got if got[n] != want[n]} == {"repair_report.json"}
    report = json.loads(got["repair_report.json"])
    assert Path(report["source"]["path"]).is_relative_to(tmp_path / "hf-home" / "hub")  # huggingface_hub's cache


# ----------------------------------------------------------------------------- --original as a Hub repo
def test_original_given_as_a_hub_repo(hub, broken_export, original_model, tmp_path, capsys):
    """--original alice/orig (a Hub id): it is downloaded whole (huggingface_hub's cache) and verified like `fix` does."""
    sha = hub.add_repo(SRC, broken_export)
    hub.add_repo("alice/orig", original_model)
    local = tmp_path / "local"
    assert run(capsys, "fix", broken_export, "-o", local, "--original", original_model, "--quiet")[0] == 0
    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fo", "--original", "alice/orig", "--json")
    assert code == 0, err
    got, want = hub.repo_files("alice/fo"), folder_files(local)
    assert {n for n in want if want[n] != got.get(n)} <= {"README.md", "repair_report.json"}
    theirs, ours = json.loads(got["repair_report.json"]), json.loads(want["repair_report.json"])
    assert theirs["original"]["verified"] == ours["original"]["verified"] == ours["original"]["checked"] > 0
    assert Path(theirs["original"]["path"]).is_relative_to(tmp_path / "hf-home" / "hub")  # the cached download
    assert [c["action"] for c in theirs["changes"]] == [c["action"] for c in ours["changes"]]
    for report in (theirs, ours):  # the source / original path fields are the only differences
        report["source"]["path"] = report["original"]["path"] = None
        report["outputs"] = [o for o in report["outputs"] if o["name"] != "README.md"]
    assert theirs == ours and theirs["source"]["files"] and "alice/orig@" in got["README.md"].decode()
    assert sha in got["README.md"].decode()


def test_a_refusal_names_the_repo_file_not_the_temp_mirror(hub, broken, tmp_path, capsys):
    """A plan-time refusal of a Hub SRC names `owner/name@sha/file`, as `hub fix` does: the mirror it was
    read from is a temp folder removed when the run ends, so its path would name nothing the user has."""
    import struct
    import shutil

    src = tmp_path / "nan"
    shutil.copytree(broken, src)
    shard = src / SHARDS[-1]
    header = read_header(shard)
    scale = next(t for t in header.tensors if t.name == "post_projection.weight_scale_2")
    with open(shard, "r+b") as fh:
        fh.seek(scale.start)
        fh.write(struct.pack("<f", float("nan")))
    sha = hub.add_repo(SRC, src)
    for dry in ((), ("--dry-run",)):
        code, _, err = run(capsys, "fix", SRC, "-o", tmp_path / "out", "--quiet", *dry)
        assert code == 2 and err.startswith(f"error: {SRC}@{sha}/{SHARDS[-1]}: post_projection.weight_scale_2: global scale is NaN"), err
