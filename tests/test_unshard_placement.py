"""`unshard` writes tensors at their place in the output in the rank files' order, not the manifest's: whatever
order a (hand-edited, still valid) manifest lists tensors and shards in, the rebuilt files hold the manifest's layout,
every tensor's bytes, and the report's sha256 of each file is the sha256 of its bytes."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from repair.io.safetensors import read_header
from tests.conftest import run_cli
from tests.test_unshard_reads_once import SOME, reference, tp_out  # noqa: F401 (fixtures)


def _check_rebuilt(tp: Path, out: Path, before: Path) -> None:
    from safetensors.torch import load_file
    manifest = json.loads((tp / "tp_manifest.json").read_text())
    report = json.loads((out / "repair_report.json").read_text())
    for entry in report["outputs"]:
        assert hashlib.sha256((out / entry["name"]).read_bytes()).hexdigest() == entry["sha256"], entry["name"]
    for shard in manifest["standard"]["shards"]:
        assert list(read_header(out / shard["name"]).by_name()) == shard["tensors"]
        rebuilt = load_file(out / shard["name"])
        for name in shard["tensors"]:
            original = next(load_file(p)[name] for p in before.glob("*.safetensors") if name in read_header(p).by_name())
            assert rebuilt[name].equal(original), name


@given(data=st.data())
@SOME
def test_any_manifest_order_rebuilds_the_manifests_layout_and_the_report_hashes_its_bytes(tp_out, data):
    root = Path(tempfile.mkdtemp(prefix="unshard-order-", dir="/tmp"))
    try:
        tp = root / "tp"
        shutil.copytree(tp_out, tp)
        manifest = json.loads((tp / "tp_manifest.json").read_text())
        shards = manifest["standard"]["shards"]
        names = [n for s in shards for n in s["tensors"]]
        if data.draw(st.booleans(), label="tensors moved between shards"):
            for shard in shards:
                shard["tensors"] = []
            for name in data.draw(st.permutations(names)):
                shards[data.draw(st.integers(0, len(shards) - 1))]["tensors"].append(name)
            index = manifest["standard"].get("index")
            if index:
                text = json.loads(index["text"])
                text["weight_map"] = {n: s["name"] for s in shards for n in s["tensors"]}
                index["text"] = json.dumps(text)
        for shard in shards:
            shard.pop("header", None)
            shard["tensors"] = data.draw(st.permutations(shard["tensors"]))
        manifest["standard"]["shards"] = data.draw(st.permutations(shards))
        (tp / "tp_manifest.json").write_text(json.dumps(manifest))
        assert run_cli("unshard", tp, "-o", root / "out") == 0
        _check_rebuilt(tp, root / "out", tp_out.parent / "back")
    finally:
        shutil.rmtree(root, ignore_errors=True)
