"""Which of config.json's `architectures` vLLM builds, asked of vLLM itself (tools/vllm_registry.py: its ModelConfig,
as `vllm serve` resolves the class), against doctor's reading of the shipped profile (repair/arch/registry.py).

- The shipped profile's `registry`, `transformers_fallback`, `unsupported` and `retired` are what this venv's vLLM
  registry gives now.
- For each listed form (an unknown name before a registered one, only unknown names, a name vLLM retired, a
  transformers class vLLM does not register, two registered names, task suffixes on a registered class
  (`_normalize_arch`), under the runner the first suffixed name sets; a string, a dict, a non-string entry; an auto_map without --trust-remote-code;
  none listed: absent, null, [], and a model_type transformers maps to no base model), vLLM
  resolves the class doctor says it builds: the same listed name, its Transformers backend, or a refusal whose words
  doctor quotes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from repair import arch
from repair.targets.profiles import resolve
from tests.test_doctor_load_refused import DBRX

from .probe import REPO, VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def in_vllm(*args) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(REPO / "tools" / "vllm_registry.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=900, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def facts() -> dict:
    [found] = in_vllm()
    return found


@pytest.fixture(scope="module")
def profile(facts):
    [found] = [p for p in arch.PROFILES if p.runtime == "vllm" and p.label == f"vllm {facts['release']}"]
    return found


def test_the_shipped_registry_is_this_vllms(facts, profile):
    shipped = json.loads((REPO / "repair" / "targets" / "data" / profile.source).read_text())
    for key in ("registry", "transformers_fallback", "unsupported", "retired", "unlisted"):
        assert shipped[key] == facts[key], key


def forms(registry) -> dict[str, list[str]]:
    retired = next((n for n in sorted(registry.retired) if n not in registry.fallback), None)
    backend = next(n for n in sorted(registry.fallback) if n.endswith("ForCausalLM"))
    out = {"unknown-then-dbrx": ["NotARealForCausalLM", "DbrxForCausalLM"], "unknown-only": ["NotARealForCausalLM"],
           "transformers-class": [backend, "NotARealForCausalLM"], "dbrx-then-llama": ["DbrxForCausalLM", "LlamaForCausalLM"],
           "llama-then-dbrx": ["LlamaForCausalLM", "DbrxForCausalLM"], "wrong-case": ["dbrxforcausallm"],
           "non-string-entry": ["DbrxForCausalLM", 7], "a-string": "DbrxForCausalLM", "a-dict": {"0": "DbrxForCausalLM"},
           "classify-suffix": ["DbrxForSequenceClassification"], "model-suffix": ["DbrxModel"],
           "reward-suffix": ["DbrxForRewardModeling"], "token-class-of-a-transformers-class": ["LlamaForTokenClassification"],
           "unknown-with-a-suffix": ["NotARealForSequenceClassification"],
           # the runner and convert type come from the first suffixed name; each name is tried in order under them
           "model-suffix-then-llama": ["DbrxModel", "LlamaForCausalLM"],
           "classify-suffix-then-dbrx": ["LlamaForSequenceClassification", "DbrxForCausalLM"],
           "unknown-then-model-suffix": ["NotARealForCausalLM", "DbrxModel"],
           "unknown-then-classify-suffix": ["NotARealForCausalLM", "DbrxForSequenceClassification"],
           "suffix-on-suffix": ["DbrxForCausalLMForSequenceClassification"]}
    return out | ({"retired": [retired]} if retired else {})


def test_doctor_names_the_class_vllm_builds(profile, tmp_path):
    target = resolve(f"vllm=={'.'.join(map(str, profile.release))}")
    cases = forms(profile.registry)
    configs = {name: dict(DBRX, architectures=listed) for name, listed in cases.items()}
    configs["remote-code"] = dict(DBRX, architectures=["MyRemoteForCausalLM"], auto_map={"AutoModelForCausalLM": "x.M"})
    # none listed: the class named from model_type (transformers' base model, built as a pooling model), or refused
    configs |= {"absent": {k: v for k, v in DBRX.items() if k != "architectures"}, "null": dict(DBRX, architectures=None),
                "empty": dict(DBRX, architectures=[]), "unmapped-model-type": {k: v for k, v in DBRX.items() if k !=
                "architectures"} | {"model_type": "emu3_text_model"}}  # transformers has the config (0.28-0.32), no base model
    for name, config in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    answers = in_vllm(*(tmp_path / name for name in configs))
    for (name, config), answer in zip(configs.items(), answers):
        built = target.built(config)
        if built.backend == "remote code":  # the tool serves without --trust-remote-code: refused, in these words
            assert "architecture" not in answer and built.error.removeprefix("ValueError: ") in answer["error"], (name, answer)
        elif built.malformed:  # refused by its config validation: where and why, in its words
            where, said = built.error.removeprefix("ValidationError: ").split(" (got ")[0].split(": ")
            assert "architecture" not in answer and f"{where}\n  {said} [" in answer["error"], (name, answer)
        elif built.error is not None:  # refused: vLLM's own words, as doctor quotes them
            assert "architecture" not in answer and built.error.removeprefix("ValueError: ") in answer["error"], (name, answer)
        elif built.backend:
            assert answer.get("architecture", "").startswith("Transformers"), (name, answer)
        else:  # vLLM reports the listed name; a task-suffixed one is built as the registered class it normalizes to
            said = answer.get("architecture")
            assert said == built.name or (said and profile.registry.normalized(said) == built.name), (name, answer, built)
            assert built.derived is None or (said == built.derived and answer["runner"] == built.runner), (name, answer, built)
