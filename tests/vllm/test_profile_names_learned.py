"""The vLLM profile generator learns a row's checkpoint names from transformers' own class, or leaves it unprofiled.

A row's layout facts (renames, prefixes, nvfp4_load_refused, dropped, ...) come from the tensor names transformers'
class writes for the small config (tools/vllm_profile.py `saved_tensors`). Where that class could not be built on the
shrunk config (Glm4, HYV4, OlmoHybrid, Phi3 on vLLM 0.32: their default pad_token_id lies past SMALL's vocabulary),
the row used to learn no names and read as healthy. Here, in the vLLM 0.32 venv:
- every profiled architecture transformers has a class for builds and saves it from the row's small config;
- a class that cannot be built raises NoConfig with UNBUILT (unprofiled, and why), never an empty name list.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .probe import REPO, VLLM_PY, requires_vllm
from .test_profiles_vs_vllm import SHIPPED

pytestmark = [pytest.mark.vllm, requires_vllm]

SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import transformers
from vllm_profile import UNBUILT, saved_tensors, transformers_model
from vllm_runtime import emit
from vllm_profile_configs import PUBLISHED, NoConfig, model_types, small_config, written_as
names, out = model_types(), {}
for arch in json.loads(sys.argv[2]):
    if not hasattr(transformers, written_as(arch)):
        continue
    config = small_config(arch, names)[0]
    try:
        out[arch] = len(saved_tensors(arch, dict(config, **PUBLISHED.get(arch, {}))))
    except NoConfig as e:
        out[arch] = str(e)
try:  # a class default past the vocabulary, as the shrinking used to leave it
    transformers_model("Phi3ForCausalLM", dict(small_config("Phi3ForCausalLM", names)[0], pad_token_id=10**6), "meta")
    out["_unbuildable"] = "built"
except NoConfig as e:
    out["_unbuildable"] = [str(e), UNBUILT]
emit(out)
"""


def in_vllm_venv(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", SCRIPT, str(REPO / "tools"), *args], capture_output=True, text=True,
                          timeout=1800, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def learned() -> dict:
    return in_vllm_venv(json.dumps(sorted(json.loads(SHIPPED.read_text())["architectures"])))


def test_every_profiled_row_with_a_transformers_class_learned_its_names(learned):
    unlearned = {a: n for a, n in learned.items() if not a.startswith("_") and not (isinstance(n, int) and n > 0)}
    assert not unlearned, f"profiled rows whose transformers class writes no names at the small size: {unlearned}"
    assert {"Glm4ForCausalLM", "HYV4ForCausalLM", "OlmoHybridForCausalLM", "Phi3ForCausalLM"} <= set(learned)


def test_a_class_that_cannot_be_built_is_unprofiled_with_the_reason(learned):
    said = learned["_unbuildable"]
    assert said != "built", "transformers built Phi3 with a pad id past its vocabulary: the probe no longer probes"
    reason, unbuilt = said
    assert reason.startswith(unbuilt) and "Padding_idx" in reason, reason
