"""The profile's `exclusion_mappers` against vLLM's own rewrite, for every row of the venv's release
(VLLM_VENV=/work/venvs/vllm-0.28 or -0.30 judges those releases' files): vLLM's ModelOpt NVFP4 and compressed-tensors
configs, handed the class's mapper by vLLM's own configure_quant_config / SupportsQuant (tools/
vllm_entry_mapper_probe.py), rewrite a list of the row's checkpoint names, its vLLM names, each with a trailing `*`,
and `re:` entries; repair's `rewritten` over the recorded mapper gives the same list; a ModelOpt MIXED_PRECISION
config's quantized_layers of those names (both spellings) is mapped as repair's `mapped_layers` maps it. A class with a mapper records
it; one whose build also hands over an inner module's mapper (Gemma3n) or only that (ChatGLM) is not compared here.
"""

from __future__ import annotations

import json

import pytest

from repair.formats.algorithms import LayerAlgorithms
from repair.targets.entry_mappers import NameMapper, mapped_layers, rewritten
from repair.targets.profiles import release_at_or_below
from repair.arch.profiled import release_of

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def probe_entries(entry: dict) -> list[str]:
    names = sorted({p.replace("*", "0") for p in [*entry["modules"], *entry.get("renames", {}), *(
        v for v in entry.get("renames", {}).values() if v)]})
    return names + [n + "*" for n in names] + [n.rpartition(".")[0] + ".*" for n in names] + ["re:.*self_attn.*", "lm_head"]


def probe_keys(entry: dict) -> dict[str, str]:
    """A MIXED_PRECISION map of the row's names in both spellings, algorithms alternating, so keys vLLM maps alike show
    whose algorithm it keeps (apply_dict: the last one's, at the first one's place)."""
    names = [n for n in probe_entries(entry) if not n.startswith("re:")]
    return {n: ("NVFP4", "FP8")[i % 2] for i, n in enumerate(names)}


def test_recorded_mappers_rewrite_lists_as_vllm_does(tmp_path, release):
    profile = release_at_or_below("vllm", release_of(release))
    assert profile is not None and profile.release == release_of(release)
    request = {name: {"modelopt": probe_entries(e), "compressed-tensors": probe_entries(e), "mixed": probe_keys(e)}
               for name, e in profile.entries.items()}
    (tmp_path / "request.json").write_text(json.dumps(request))
    lines = {line["arch"]: line for line in in_vllm("vllm_entry_mapper_probe.py", tmp_path / "request.json")}
    assert set(lines) == set(request)
    compared = 0
    for name, entry in profile.entries.items():
        recorded = entry.get("exclusion_mappers") or []
        said = lines[name]
        assert said["mapper"] <= bool(recorded), name  # a class with a mapper hands it over while it is built
        if not said["mapper"] or len(recorded) > 1:
            continue  # an inner SupportsQuant module's mapper too (ChatGLM's ChatGLMModel): the build's record stands
        mappers = tuple(NameMapper.read(d) for d in recorded)
        for kind, how in (("modelopt", "modelopt"), ("compressed-tensors", "paths")):
            ours = list(rewritten(request[name][kind], mappers, how))
            assert ours == list(dict.fromkeys(said[kind])), (name, kind)
        written = LayerAlgorithms(tuple(request[name]["mixed"].items()))
        assert [list(e) for e in mapped_layers(written, mappers).entries] == said["mixed"], (name, "mixed")
        compared += 1
    assert compared >= 50, compared
