"""The vLLM profile generator stops, traceback whole, on a bug of our own; it never records one as vLLM's reason.

tools/vllm_profile.py ran in VLLM_VENV with one of our own functions broken (a KeyError raised in tools/): the row
building step (`modules_of`) and the load-facts step (tools/vllm_declared.py `placements`, which placed_weights used to
swallow into "nothing placed"). Before tools/raised_by.py the first became `unprofiled: vLLM cannot build it from the
small config: KeyError: ...` and the second a Llama row with no load facts, both exit 0. Now the run fails with our
frame in the traceback and writes nothing. tests/test_generators_honest.py holds the rule itself."""

from __future__ import annotations

import os
import subprocess

import pytest

from .probe import REPO, VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

BROKEN = """
import sys
import vllm_declared, vllm_load_facts, vllm_profile

def broken(*args, **kwargs):
    return {}["a name our own tool computed wrong"]

module, name = sys.argv[2].split(".")
setattr({"vllm_profile": vllm_profile, "vllm_declared": vllm_declared}[module], name, broken)
sys.exit(vllm_profile.main([sys.argv[1], "--only", "LlamaForCausalLM"]))
"""


@pytest.mark.parametrize("where", ["vllm_profile.modules_of", "vllm_declared.placements"])
def test_our_own_bug_stops_the_generator(tmp_path, where):
    script, out = tmp_path / "broken_profile.py", tmp_path / "profile.json"
    script.write_text(BROKEN)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(script), str(out), where], capture_output=True, text=True, timeout=900,
                          cwd="/", env={**env, "PYTHONPATH": str(REPO / "tools")})
    assert proc.returncode != 0 and not out.exists(), proc.stderr[-3000:]
    tail = proc.stderr[proc.stderr.rfind("Traceback"):]
    assert "in broken" in tail and "KeyError: 'a name our own tool computed wrong'" in tail, tail[-3000:]


BUFFER = """
import sys, torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.activation import XIELU
from vllm.model_executor.models.utils import AutoWeightsLoader
from vllm_declared import placements

class Mlp(torch.nn.Module):  # Apertus's MLP: its xIELU's beta/eps are persistent buffers transformers saves
    def __init__(self):
        super().__init__()
        self.act_fn = XIELU(dtype=torch.bfloat16)

    def load_weights(self, weights):
        return AutoWeightsLoader(self).load_weights(weights)

with set_current_vllm_config(VllmConfig()):
    mlp = Mlp()  # on the CPU, as the profile builds Apertus (xIELU reads its buffers with .item(): no meta build)
loaded = set()
placements(mlp, {"act_fn": ("act_fn.beta", [], "bfloat16")}, loaded)
open(sys.argv[1], "w").write(repr(sorted(loaded)))  # (stdout: the tools send it to stderr)
"""


def test_a_persistent_buffer_is_fed_without_copying_the_harness_meta_tensor(tmp_path):
    """Failed before: vllm_declared.placements stood a recorder in for every parameter's weight loader but for no buffer,
    so AutoWeightsLoader (utils.py `_add_loadable_non_param_tensors`) handed a CPU-built model's buffer and our meta
    tensor to vLLM's default_weight_loader: "Cannot copy out of meta tensor", which tools/raised_by.py counted vLLM's
    and dropped_tensors swallowed into no facts for Apertus. Now the buffer takes vLLM's own checks on a meta copy."""
    script, out = tmp_path / "buffer.py", tmp_path / "loaded.txt"
    script.write_text(BUFFER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(script), str(out)], capture_output=True, text=True, timeout=600, cwd="/",
                          env={**env, "PYTHONPATH": str(REPO / "tools")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text() == "['act_fn.beta']", proc.stderr[-3000:]
