import json
from pathlib import Path
from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_captured


def test_the_load_is_simulated_in_vllms_shard_order(tmp_path, capsys):
    """vLLM reads shard files in natural order (weight_utils.py _natural_sort_key: model-2 before model-10), so the
    first module a rank stops on is the one in model-9, not the one a plain text sort reads first (model-10)."""
    folder = write_assistant(tmp_path / "a", TINY, shards=[["pre_projection"], ["post_projection"]])
    names = {"model-00001-of-00003.safetensors": "model-20.safetensors",  # the layers: read last either way
             "model-00002-of-00003.safetensors": "model-10.safetensors",  # pre_projection
             "model-00003-of-00003.safetensors": "model-9.safetensors"}  # post_projection: first in vLLM's order
    for old, new in names.items():
        (folder / old).rename(folder / new)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: names[v] for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    code, out, err = run_captured(capsys, "doctor", folder, "--json", "--target", "vllm==0.22.1")
    stops = json.loads(out)["runtime_stops_at"]
    assert code == 1 and stops and {s["tensor"].rpartition(".")[0] for s in stops} == {"post_projection"}, stops
