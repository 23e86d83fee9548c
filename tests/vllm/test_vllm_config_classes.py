"""Architectures whose config class vLLM ships itself (no class in transformers) are profiled from vLLM's own code.

tools/vllm_profile_configs.py `vllm_config_class` learns the architecture -> config class mapping from vLLM 0.32:
a class of its config registry (vllm/transformers_utils/config.py `_CONFIG_REGISTRY`) that the model module
imports or annotates (chatglm.py: ChatGLMConfig; step3p5.py: Step3p5Config under TYPE_CHECKING), or whose
`architectures` names it (Step3TextConfig). Asked of vLLM itself here: reading a config.json of the profiled
model_type, vLLM's `get_config` gives the class the shipped row names, the class vLLM's registry resolves for the
architecture is built from that module, and its source names the class.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .probe import REPO, VLLM_PY, requires_vllm
from .test_profiles_vs_vllm import SHIPPED

pytestmark = [pytest.mark.vllm, requires_vllm]

ROWS = json.loads(SHIPPED.read_text())["architectures"]
# rows from a config class vLLM ships (not Mistral Large 3's: vLLM's reader of params.json makes transformers' DeepseekV3Config)
OWN = {a: r["config"] for a, r in sorted(ROWS.items()) if r["config"]["source"].startswith("vLLM's own (")}
ASK = """
import inspect, json, sys, tempfile, os
from vllm.transformers_utils.config import get_config
from vllm import ModelRegistry
out = {}
for arch, model_type in json.loads(sys.argv[1]).items():
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump({"architectures": [arch], "model_type": model_type}, f)
        config = get_config(folder, trust_remote_code=False)
    model_class = ModelRegistry._try_load_model_cls(arch)
    source = inspect.getsource(inspect.getmodule(model_class))
    out[arch] = {"class": type(config).__name__, "module": type(config).__module__,
                 "named_in_model_source": type(config).__name__ in source}
print(json.dumps(out))
"""


def test_vllm_config_rows_are_shipped():
    """ChatGLM's two architectures are profiled from vLLM's own config class and names, and Step3p5 from its published
    names (its mapper's `.share_expert.` rename read back, tools/vllm_mapper_inverse.py); Step3Text, whose config class
    only vLLM ships too, is not: its vLLM names hold fused experts, no checkpoint layout to learn from
    (tools/vllm_profile.py own_names_layout). Its reason is reached only after vllm_config_class found the class."""
    assert {"ChatGLMModel", "ChatGLMForConditionalGeneration", "Step3p5ForCausalLM"} <= set(OWN)
    unprofiled = json.loads(SHIPPED.read_text())["unprofiled"]
    arch = "Step3TextForCausalLM"
    assert arch not in ROWS and unprofiled[arch].startswith("no checkpoint layout to learn"), (arch, unprofiled.get(arch))


def test_vllm_reads_each_profiled_config_into_the_class_the_row_names():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", ASK, json.dumps({a: c["model_type"] for a, c in OWN.items()})],
                          capture_output=True, text=True, timeout=900, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    read = json.loads(proc.stdout.strip().splitlines()[-1])
    for arch, config in OWN.items():
        got = read[arch]
        assert got["module"].startswith("vllm.transformers_utils.configs"), (arch, got)
        assert f"({got['module']}) {got['class']}," in config["source"], (arch, got, config["source"])
        assert got["named_in_model_source"], (arch, got)


HOSTILE = """
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
import vllm
from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS
from vllm_profile_configs import vllm_config_class
folder = tempfile.mkdtemp()
vllm.__path__.append(folder)  # this process only: vllm.hostile_N is one of the sources below
out = {}
for i, source in enumerate(json.loads(sys.argv[2])):
    with open(os.path.join(folder, f"hostile_{i}.py"), "w") as f:
        f.write(source)
    _TEXT_GENERATION_MODELS[f"Hostile{i}ForCausalLM"] = (f"vllm.hostile_{i}", "X")
    found = vllm_config_class(f"Hostile{i}ForCausalLM")[0]
    out[source] = found and f"{found.__module__}.{found.__name__}"
print(json.dumps(out))
"""
CHATGLM = "vllm.transformers_utils.configs.chatglm.ChatGLMConfig"


def test_vllm_config_class_reads_only_imports_of_the_class_itself():
    """A module source names vLLM's config class only by importing it from vLLM's config package or the class's own
    module: a look-alike package (`configs_extra`), another module's class of the same name, or a docstring is no
    claim; a relative import of the package is one."""
    expected = {
        "from vllm.transformers_utils.configs import ChatGLMConfig\n": CHATGLM,
        "from vllm.transformers_utils.configs.chatglm import ChatGLMConfig\n": CHATGLM,
        "from .transformers_utils.configs import ChatGLMConfig\n": CHATGLM,  # vllm.hostile_N's package: vllm
        "from vllm.transformers_utils.configs_extra import ChatGLMConfig\n": None,
        "from vllm.transformers_utils.configs.step3p5 import ChatGLMConfig\n": None,
        '"""ChatGLMConfig"""\n': None,
        "from ....transformers_utils.configs import ChatGLMConfig\n": None,  # past the top-level package
    }
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", HOSTILE, str(REPO / "tools"), json.dumps(list(expected))],
                          capture_output=True, text=True, timeout=900, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected
