"""The acceptance run of `hub fix` at the real Gemma 4 31B assistant's shapes, against
tools.hub_server.LocalHub with the real huggingface_hub client: of a 512 MB embedding shard, a layers
shard and a small shard that changes, only the changed shard is downloaded whole (the others: their
headers and NVFP4 scales by ranged GETs), one LFS upload and one commit, disk use bounded by the
changed shard, and a fork equal to a local `fix`. docs/hub.md cites this request log."""

from __future__ import annotations

import hashlib
import json

import torch
from huggingface_hub import HfApi

from repair.arch import gemma4_assistant
from repair.demo.examples import GEMMA4_31B, assistant_config, write_assistant
from repair.hub.source import FIRST_READ
from repair.io.safetensors import read_header

from tests.hub_workflow_helpers import (  # noqa: F401 - fixtures
    CARD, SHARDS, SRC, assert_equals_local_fix, commits, full_gets, hub, hub_env, ranged, run, uploads,
)


# ----------------------------------------------------------------------------- the 31B-shape acceptance run
def _weights_31b(config: dict) -> dict[str, torch.Tensor]:
    """Real 31B-assistant shapes, cheaply: a random block tiled over each matrix, norms near 1."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for spec in gemma4_assistant.expected_modules(config).values():
        name = spec.name if spec.role in ("scalar", "buffer") else f"{spec.name}.weight"
        if len(spec.shape) == 2:
            rows, cols = spec.shape
            block = 0.05 * torch.randn((64, cols), generator=gen)
            out[name] = block.to(torch.bfloat16).repeat((rows + 63) // 64, 1)[:rows].contiguous()
        else:
            out[name] = (1 + 0.1 * torch.randn(spec.shape, generator=gen)).to(torch.bfloat16)
    return out


def test_31b_shape_fork_and_fix_downloads_only_the_changed_shard(hub, tmp_path, capsys):
    """The broken 31B-shape assistant (vocab 262144: a 512 MB embedding, in its own shard that is never downloaded)."""
    src = write_assistant(tmp_path / "big", GEMMA4_31B, shards=[["model.layers"], ["pre_projection", "post_projection"]],
                          weights=_weights_31b(assistant_config(GEMMA4_31B)))
    assert (src / SHARDS[0]).stat().st_size > 512 << 20
    (src / "README.md").write_text(CARD)
    sha = hub.add_repo(SRC, src)
    local = tmp_path / "local"
    assert run(capsys, "fix", src, "-o", local, "--quiet")[0] == 0
    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed-31b", "--workdir", tmp_path, "--json")
    assert code == 0, err
    result = json.loads(out)

    assert [n for n in full_gets(hub) if n.endswith(".safetensors")] == [SHARDS[2]]  # only the changed shard
    assert set(full_gets(hub)) == {SHARDS[2], "config.json", "hf_quant_config.json", "model.safetensors.index.json",
                                   "generation_config.json", "README.md"}
    assert read_header(src / SHARDS[0]).data_start <= FIRST_READ
    assert sorted(ranged(hub, SHARDS[0])) == [(0, FIRST_READ)]  # the 512 MB shard: one first read (its header), nothing else
    layers = read_header(src / SHARDS[1])  # unchanged too: its header and per-tensor scalars; no block scale (doctor samples
    reads = ranged(hub, SHARDS[1])  # none on the Hub, and the plan does not change these modules)
    blocks = [t for t in layers.tensors if t.name.endswith(".weight_scale") and t.dtype == "F8_E4M3"]
    assert len(reads) == 1  # as safetensors lays a shard out, float32 scalars first: they came with the header
    assert not [t for t in blocks if t.start >= FIRST_READ and any(s < t.end and t.start < e for s, e in reads)]
    assert len(uploads(hub)) == 1 and len(commits(hub, "alice/fixed-31b")) == 1
    changed = (local / SHARDS[2]).stat().st_size
    assert result["peak_work_bytes"] < 2 * changed + (8 << 20), "disk use is not bounded by the changed shard"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-repair-hub-")] == []

    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    tree = {e.path: e for e in api.list_repo_tree("alice/fixed-31b", recursive=True)}
    mine = {p.name: p for p in local.iterdir()}
    assert set(tree) == set(mine)
    for name, path in mine.items():  # LFS files by the Hub's sha256; small files byte for byte
        if tree[name].lfs is not None:
            assert tree[name].lfs.sha256 == hashlib.sha256(path.read_bytes()).hexdigest(), name
    small = {n: b for n, b in hub.repo_files("alice/fixed-31b").items() if tree[n].lfs is None}
    assert_equals_local_fix(small | {n: (local / n).read_bytes() for n in mine if tree[n].lfs is not None},
                            local, f"{SRC}@{sha}", card_replaced=True)
    info = api.model_info("alice/fixed-31b")
    assert info.card_data.base_model == SRC and {"ckpt-repair", "nvfp4"} <= set(info.tags)
    readme = small["README.md"].decode()
    assert sha in readme and "### What was wrong" in readme and "### After" in readme and result["fix_id"] in readme
