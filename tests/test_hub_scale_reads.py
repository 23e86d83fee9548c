"""#27.2: the Hub path costs what the local path costs. doctor of a Hub repo makes a few ranged GETs per shard
(its first read, which holds the header and, as safetensors lays a shard out, the float32 scalars), whatever the
block scales weigh; the mirror holds those bytes only; `--deep` streams every block scale with bounded requests
and stores none; a plan reads the block scales of the modules it changes. The LocalHub request log is the evidence."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from repair.doctor.diagnose import diagnose
from repair.hub.source import FIRST_READ, open_source
from repair.io.checkpoint import open_checkpoint
from repair.targets.profiles import resolve
from tests.hub_workflow_helpers import SRC, full_gets, hub, hub_env, ranged, run  # noqa: F401 - fixtures

SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
BAD = "model.layers.1.mlp.down_proj"


def nvfp4_repo(folder: Path, width: int) -> Path:
    """Two shards of four NVFP4 linears [1024, width] each, written by safetensors' own writer; healthy scales."""
    folder.mkdir()
    codes = (bytes(range(0x30, 0x7F)) * (1024 * width // 16 // 79 + 1))[: 1024 * width // 16]
    scales = torch.frombuffer(bytearray(codes), dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(1024, width // 16)
    weight_map = {}
    for i, shard in enumerate(SHARDS):
        tensors = {}
        for proj in ("gate_proj", "up_proj", "down_proj", "o_proj"):
            p = f"model.layers.{i}.mlp.{proj}"
            tensors |= {f"{p}.weight": torch.zeros((1024, width // 2), dtype=torch.uint8), f"{p}.weight_scale": scales.clone(),
                        f"{p}.weight_scale_2": torch.tensor(0.001), f"{p}.input_scale": torch.tensor(0.02)}
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        weight_map |= {name: shard for name in tensors}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (folder / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.37.0"},
                                                             "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                                              "exclude_modules": ["lm_head"]}}))
    return folder


def plant_nan(folder: Path, at: int) -> None:
    shard, info = open_checkpoint(folder).locate()[BAD + ".weight_scale"]
    with open(shard.path, "r+b") as fh:
        os.pwrite(fh.fileno(), b"\x7f", info.start + at)


def shard_requests(hub) -> dict[str, int]:
    return {n: sum(1 for r in hub.requests if r.method == "GET" and r.path.endswith("/" + n)) for n in SHARDS}


def test_hub_doctor_costs_grow_with_shards_not_with_block_scales(hub, tmp_path, capsys):
    cost = {}
    for width in (4096, 16384):  # block scales of 256 KB and 1 MB per module
        repo = f"alice/w{width}"
        hub.add_repo(repo, nvfp4_repo(tmp_path / f"w{width}", width))
        hub.clear_log()
        code, out, _ = run(capsys, "doctor", repo, "--json")
        assert code == 0, out
        assert not [n for n in full_gets(hub, repo) if n.endswith(".safetensors")]
        read = sum(e - s for n in SHARDS for s, e in ranged(hub, n))
        cost[width] = (shard_requests(hub), read, json.loads(out)["scale_checks"])
    (small_requests, small_read, _), (big_requests, big_read, checks) = cost[4096], cost[16384]
    assert small_requests == big_requests and max(big_requests.values()) <= 4  # <= 8 where a redirect doubles each
    assert big_read == small_read <= len(SHARDS) * FIRST_READ  # the block scales grew 4x: the bytes did not
    assert checks["block_scales"] == "not read" and checks["scalars"] == 2 * 8 and checks["source"] == "the Hub"


def test_hub_deep_streams_every_block_scale_and_stores_none(hub, tmp_path):
    folder = nvfp4_repo(tmp_path / "src", 16384)
    plant_nan(folder, 600_000)  # far inside one tensor, past the mirror's first read
    hub.add_repo(SRC, folder)
    work = tmp_path / "work"
    ckpt = open_source(SRC, work=work)
    held = sum(p.stat().st_blocks * 512 for p in work.rglob("*") if p.is_file())
    assert not diagnose(ckpt, resolve(None)).findings
    hub.clear_log()
    found = diagnose(ckpt, resolve(None), deep=True)
    assert [f.subject for f in found.findings] == [BAD + ".weight_scale"] and "1 NaN" in found.findings[0].message
    scan = found.scales
    total = sum(i.nbytes for i in ckpt.infos().values() if i.dtype == "F8_E4M3")
    assert (scan.block_scales, scan.read_whole, scan.total_bytes) == ("scanned", 8, total)
    assert scan.requests == sum(shard_requests(hub).values()) <= 2 * len(SHARDS)  # one coalesced range per shard (+ a resume)
    assert total - len(SHARDS) * FIRST_READ <= sum(e - s for n in SHARDS for s, e in ranged(hub, n)) <= total
    assert sum(p.stat().st_blocks * 512 for p in work.rglob("*") if p.is_file()) == held, "deep stored what it read"


def test_a_plan_on_a_hub_repo_reads_the_block_scales_of_what_it_changes(hub, tmp_path, capsys):
    """The plan-time check of a dequantized module's block scales sees the real bytes, as locally (the mirror holds
    only headers and scalars until a plan asks)."""
    folder = nvfp4_repo(tmp_path / "src", 16384)
    plant_nan(folder, 600_000)
    hub.add_repo(SRC, folder)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "one"\n[[rules]]\naction = "dequantize"\nmodules = ["{BAD}"]\n')
    local = run(capsys, "fix", folder, "-o", tmp_path / "out", "--dry-run", "--recipe", recipe)
    remote = run(capsys, "fix", SRC, "-o", tmp_path / "out", "--dry-run", "--recipe", recipe)
    assert local[0] == remote[0] == 2 and "1 NaN and 0 negative block scales" in remote[2]
    fetched = [r for r in ranged(hub, SHARDS[1]) if r[1] > FIRST_READ]
    assert fetched and all(e - s <= 1024 * 16384 // 16 for s, e in fetched)  # that module's block scales, no more


def test_a_range_whose_connection_breaks_is_resumed_where_it_stopped(monkeypatch):
    """A reset mid-range (huggingface_hub's backoff retries only a request that fails to start) is asked again from
    the first byte not yet received: the bytes arrive once each, in order."""
    import contextlib

    import huggingface_hub.utils as hf_utils
    from huggingface_hub.utils import _http

    from repair.hub.ranges import RangeClient

    data = bytes(range(256)) * 40
    asked = []

    class Answer:
        history, status_code = [], 206

        def __init__(self, start: int, end: int):
            self.start, self.end, self.headers = start, end, {"Content-Range": f"bytes {start}-{end}/{len(data)}"}

        def iter_bytes(self, _size):
            yield data[self.start:self.start + 1000]
            if len(asked) == 1:
                raise _http._DEFAULT_RETRY_ON_EXCEPTIONS[0]("reset")
            yield data[self.start + 1000:self.end + 1]

    @contextlib.contextmanager
    def answer(method, url, headers):
        start, end = (int(x) for x in headers["Range"].removeprefix("bytes=").split("-"))
        asked.append((start, end))
        yield Answer(start, end)

    monkeypatch.setattr(hf_utils, "http_stream_backoff", answer)
    monkeypatch.setattr(hf_utils, "hf_raise_for_status", lambda response: None)
    got = RangeClient("alice/x", "0" * 40, "alice/x@0").read("model.safetensors", 100, 5000)
    assert got == data[100:5000] and asked == [(100, 4999), (1100, 4999)]
