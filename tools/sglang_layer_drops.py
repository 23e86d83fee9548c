#!/usr/bin/env python
"""The `dropped_in_layers` block of repair/targets/data/sglang-<release>.json, learned from SGLang's own build.

    python -m tools.sglang_layer_drops [SGLANG_VENV]   (default /work/venvs/sglang; rewrites the installed release's file)

SGLang's DeepseekV4ForCausalLM builds a module in some decoder layers only, as config.json's per-layer
`compress_ratios` says (0.5.23 models/deepseek_v4.py:1449-1476: `compressor` where the ratio is 4 or 128, `indexer`
where it is 4). The rule is learned as vLLM's is (tools/vllm_layer_facts.py where_rules, the same function): the
published checkpoint's names (tools/dsv4_fp8_fixture.py, nvidia's layout: each layer stores what its ratio builds)
give each module's layers without it; SGLang's model, built by its own constructor on the meta device from the tiny
published config (tools/sglang_dsv4_layers.py's setup), must lack a module in exactly those layers, and again, built
with the list rotated by one, in the layers the rotation moves the values to. Names are never mapped: the layer sets
must agree.

DeepSeek-V4.1 (SGLang's config class `deepseek_v41`, built by the same class) adds ratios 1 and 2, at which the
attention builds its compressor only in the layers `kv_source_layer_ids` lists and its indexer only in those
`index_source_layer_ids` lists (deepseek_v4.py:1481-1497; the indexer's own keys `wk`/`k_norm` where both do,
dsv41_sparse.py:203,232). `listed_rules` learns that from SGLang's model built from a tiny V4.1 config
(tools/dsv41_fixture.py, whose names store what each layer's ratio and lists build): where a ratio value is built in
some layers and not others, the lists of layer numbers (one, else two) whose common layers are exactly the built ones
are the rule's `unless_listed`, confirmed by building the model again with an unbuilt layer (the one fewest lists
name) added to those lists (the module must appear there, and nowhere else change); a list alone that fits but is
refuted so is not the rule. A checkpoint module is compared with the parameter SGLang's own rename
(`remap_weight_name_to_dpsk_hf_format`) puts it in. The V4
and V4.1 rules of a module are one list of rules. Run in SGLang's venv as `sglang_layer_drops.py --build PLAIN_DIR
NAMES.json PLAIN41_DIR NAMES41.json` it prints the two rows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
ARCH = "DeepseekV4ForCausalLM"
WHERE = "compress_ratios"


def _builder(plain: str):
    """(SGLang's model built from `plain`, a function building it again from a changed config)."""
    from tools import sglang_runtime as runtime

    def rebuild(changed: dict):
        with tempfile.TemporaryDirectory() as folder:
            shutil.copy(Path(plain) / "model.safetensors", folder)
            (Path(folder) / "config.json").write_text(json.dumps(changed))
            return runtime.build(folder)[0]

    return runtime.build(plain)[0], rebuild


def learn(plain: str, names_file: str) -> dict:
    """(In SGLang's venv) checkpoint module pattern -> {"where", "in"} for the model SGLang builds from `plain`."""
    from tools.vllm_layer_facts import where_rules

    model, rebuild = _builder(plain)
    config = json.loads((Path(plain) / "config.json").read_text())
    return where_rules(model, dict.fromkeys(json.loads(Path(names_file).read_text())), config, rebuild)


def listed_rules(plain: str, names_file: str) -> dict[str, dict]:
    """(In SGLang's venv) checkpoint module pattern -> {"in": values built in no layer, "listed": {"in": values built in
    some layers, "unless_listed": the lists of layer numbers whose common layers are those}} (see the docstring)."""
    from tools.raised_by import reraise_ours
    from tools.vllm_layer_facts import _absent, built_absent

    model, rebuild = _builder(plain)
    config = json.loads((Path(plain) / "config.json").read_text())
    depth, ratios = config["num_hidden_layers"], config[WHERE]
    lists = {f: v for f, v in config.items() if f != WHERE and isinstance(v, list) and v
             and all(type(x) is int and 0 <= x < depth for x in v)}
    names = json.loads(Path(names_file).read_text())
    spelled = _spelled(names)
    built, rebuilt = built_absent(model, depth), {}
    out = {}
    for module, absent in sorted(_absent(names, depth).items()):
        built_as = spelled.get(module)
        if built.get(built_as) != absent:
            continue  # SGLang's model lacks it elsewhere: no rule of the names
        without = {ratios[i] for i in absent}
        mixed = without & {ratios[i] for i in range(depth) if i not in absent}
        rule: dict = {"in": sorted(without - mixed)}
        if mixed:
            layers = {i for i in range(depth) if ratios[i] in mixed}
            added = min(layers & absent, key=lambda i: (sum(i in v for v in lists.values()), i))  # the least listed
            for size in (1, 2):
                fits = [c for c in combinations(sorted(lists), size)
                        if layers.intersection(*(lists[f] for f in c)) == layers - absent]
                confirmed = []
                for fields in fits:
                    if fields not in rebuilt:
                        changed = config | {f: sorted({*config[f], added}) for f in fields}
                        try:
                            rebuilt[fields] = built_absent(rebuild(changed), depth)
                        except Exception as e:  # noqa: BLE001 - SGLang refuses the changed lists: not confirmed
                            reraise_ours(e)
                            rebuilt[fields] = {}
                    if rebuilt[fields].get(built_as) == absent - {added}:
                        confirmed.append(fields)
                if confirmed:
                    break
            if len(confirmed) != 1:
                continue  # no list, or two alike, explain it: not recorded
            rule["listed"] = {"in": sorted(mixed), "unless_listed": list(confirmed[0])}
        out[module] = rule
    return out


def _spelled(names: list[str]) -> dict[str, str]:
    """(In SGLang's venv) checkpoint module pattern -> the pattern of SGLang's parameter its rename
    (`remap_weight_name_to_dpsk_hf_format`) puts it in."""
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM

    from tools.vllm_layer_facts import LAYER

    out = {}
    for name in names:
        ours, theirs = LAYER.fullmatch(name), LAYER.fullmatch(DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format(name))
        if ours and theirs:
            out[f"{ours[1]}.*.{ours[3].rpartition('.')[0]}"] = f"{theirs[1]}.*.{theirs[3].rpartition('.')[0]}"
    return out


def unbuilt(plain: str, names_file: str) -> dict[str, list[int]]:
    """(In SGLang's venv) checkpoint module pattern -> the layers SGLang's model built from `plain` has no parameter
    of it in (the SGLang tier holds doctor's rules to it)."""
    from tools.vllm_layer_facts import built_absent

    config = json.loads((Path(plain) / "config.json").read_text())
    built = built_absent(_builder(plain)[0], config["num_hidden_layers"])
    spelled = _spelled(json.loads(Path(names_file).read_text()))
    return {module: sorted(built.get(theirs, ())) for module, theirs in sorted(spelled.items())}


def merged(v4: dict[str, dict], v41: dict[str, dict]) -> dict[str, dict | list]:
    """One module's V4 rule ({"where", "in"}) and V4.1 rule (listed_rules) as one rule, or a list of rules."""
    out: dict[str, dict | list] = {}
    for module in sorted(v4.keys() | v41.keys()):
        values = set(v4.get(module, {}).get("in", ())) | set(v41.get(module, {}).get("in", ()))
        rules = [{"where": WHERE, "in": sorted(values)}] if values else []
        if "listed" in v41.get(module, {}):
            rules.append({"where": WHERE, **v41[module]["listed"]})
        out[module] = rules[0] if len(rules) == 1 else rules
    return out


def write_plain(folder: Path, v41: bool = False, layout: dict | None = None) -> tuple[Path, Path]:
    """(the tiny published config without quantization, SGLang's input; the published tensor names of that config);
    `v41`: the tiny DeepSeek-V4.1 layout instead (tools/dsv41_fixture.py; `layout`: another)."""
    import torch
    from safetensors.torch import save_file

    from tools import dsv41_fixture, dsv4_fp8_fixture

    fixture = dsv41_fixture if v41 else dsv4_fp8_fixture
    config = {k: v for k, v in (fixture.config(layout) if v41 else fixture.config()).items()
              if v is not None and k != "quantization_config"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"embed.weight": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    names = folder.parent / f"{folder.name}.names.json"
    names.write_text(json.dumps(sorted(fixture.tensors(config))))
    return folder, names


def in_sglang(venv: Path, *args: str, tool: Path = Path(__file__)) -> list:
    """`tool` (this one) run in SGLang's venv with `args`: the JSON rows it prints."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SGLANG_USE_CPU_ENGINE")}
    proc = subprocess.run([str(venv / "bin" / "python"), str(tool), *args],
                          capture_output=True, text=True, timeout=1800, env=env, cwd="/")
    if proc.returncode != 0:
        raise SystemExit(f"SGLang's build failed:\n{proc.stderr[-4000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines()]


def generate(venv: Path) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        folders = [*write_plain(Path(tmp) / "plain"), *write_plain(Path(tmp) / "plain41", v41=True)]
        v4, v41 = in_sglang(venv, "--build", *map(str, folders))
    return {ARCH: merged(v4, v41)}


def main(argv: list[str]) -> int:
    if argv[:1] in (["--build"], ["--unbuilt"]):
        from tools.sglang_dsv4_layers import cpu_rope

        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        cpu_rope()
        rows = [unbuilt(argv[1], argv[2])] if argv[0] == "--unbuilt" else [learn(argv[1], argv[2]), listed_rules(argv[3], argv[4])]
        out.writelines(json.dumps(row) + "\n" for row in rows)
        return 0
    from tools.sglang_built_layers import write_generated

    return write_generated([argv[0] if argv else "/work/venvs/sglang"], "dropped_in_layers", generate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
