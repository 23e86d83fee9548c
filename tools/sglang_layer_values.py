#!/usr/bin/env python
"""The `layer_values_refused` block of repair/targets/data/sglang-<release>.json, learned from SGLang's own build.

    python -m tools.sglang_layer_values [SGLANG_VENV]   (default /work/venvs/sglang; rewrites the installed release's file)

SGLang 0.5.23 refuses a DeepSeek-V4 config.json whose `compress_ratios` holds a value it does not build (a number
outside those, a string) or is shorter than the decoder: its attention reads its layer's entry and asserts it is one
it builds (models/deepseek_v4.py:1044-1057), or, for model_type `deepseek_v4`, the config class refuses it first. Learned as SGLang does it: its model built by its own constructor (tools/sglang_runtime.py,
meta device) from the tiny published DeepSeek-V4 config (tools/sglang_layer_drops.py write_plain) with every layer's
entry set to each probe value, with one more entry (a refused value) past the decoder, and with the list cut one
short: the values it builds are `accepts`; the refused values' error, the value standing as `{value}` (as `str` or
`repr` shows it: `shown`), is `refused` if every refused probe raises those words from one line (`where`, the
innermost frame of SGLang or of the transformers it pins); `past_depth`: an entry past the decoder is refused too;
the short list's error (its numbers as `{length}` and `{depth}`) is `short`. The tiny V4 config (model_type
`deepseek_v4`) and the tiny V4.1 one (`deepseek_v41`, tools/dsv41_fixture.py) are read by different config classes:
transformers' DeepseekV4Config maps every entry to a layer type while SGLang reads the config (KeyError for any but
0, 4, 128: configuration_deepseek_v4.py:255), SGLang's DeepseekV41Config takes the list as it is and its attention
asserts (models/deepseek_v4.py:1049). Each model_type's facts are recorded. doctor/layer_values.py reads them.
Run in SGLang's venv as `sglang_layer_values.py --probe PLAIN_DIR [PLAIN_DIR ...]` it prints one row each.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARCH, FIELD = "DeepseekV4ForCausalLM", "compress_ratios"
RUNTIME = re.compile(r"site-packages/((?:sglang|transformers)/.+)")
PROBES = (*range(9), 16, 64, 127, 128, 129, 256, -1, -128, 1 << 40, "4", "x")  # ints both sides of each it builds


def _outcome(rebuild, config: dict, ratios: list) -> dict | None:
    """None where SGLang builds the model with these ratios; else {"error", "where"}: the refusal and the line that
    raised it (the innermost frame of SGLang's or of the transformers it pins, as site-packages names it)."""
    from tools.raised_by import reraise_ours

    try:
        rebuild(dict(config, **{FIELD: ratios}))
    except Exception as exc:  # noqa: BLE001 - SGLang's own refusal is the answer
        reraise_ours(exc)
        frame = [f for f in traceback.extract_tb(exc.__traceback__) if RUNTIME.search(f.filename)][-1]
        return {"error": f"{type(exc).__name__}: {exc}", "where": f"{RUNTIME.search(frame.filename)[1]}:{frame.lineno}"}
    return None


def _template(refused: dict) -> dict:
    """The one {"error" with `{value}`, "where", "shown": "str" | "repr"} every refused probe's outcome is."""
    for shown, show in (("str", str), ("repr", repr)):
        found = set()
        for value, said in refused.items():
            head, sep, tail = said["error"].rpartition(show(value))
            found.add((head + "{value}" + tail if sep else said["error"], said["where"]))
        if len(found) == 1 and "{value}" in next(iter(found))[0]:
            (error, where), = found
            return {"error": error, "where": where, "shown": shown}
    raise SystemExit(f"the refusals are not one error of one line: {sorted(map(str, refused.values()))}")


def probe(plain: str) -> dict:
    """(In SGLang's venv) one model_type's facts: {"accepts", "refused", "past_depth", "short"} (see the docstring)."""
    from tools.sglang_layer_drops import _builder

    _, rebuild = _builder(plain)
    config = json.loads((Path(plain) / "config.json").read_text())
    depth, own = config["num_hidden_layers"], config[FIELD]
    said = {json.dumps(v): _outcome(rebuild, config, [v] * depth) for v in PROBES}
    refused = {v: said[json.dumps(v)] for v in PROBES if said[json.dumps(v)] is not None}
    template = _template(refused)
    past = _outcome(rebuild, config, own + [next(iter(refused))])  # an entry for no decoder layer
    short = _outcome(rebuild, config, own[: depth - 1])
    if short is not None:  # the lengths it quotes, as `{length}` and `{depth}`
        for number, name in ((depth - 1, "{length}"), (depth, "{depth}")):
            head, sep, tail = short["error"].rpartition(f"({number})")
            short["error"] = f"{head}({name}){tail}" if sep else short["error"]
    return {"accepts": [v for v in PROBES if v not in refused], "refused": template,
            "past_depth": past is not None and past["where"] == template["where"], **({"short": short} if short else {})}


def generate(venv: Path) -> dict[str, dict]:
    from tools.sglang_layer_drops import in_sglang, write_plain

    with tempfile.TemporaryDirectory() as tmp:
        folders = [write_plain(Path(tmp) / "plain")[0], write_plain(Path(tmp) / "plain41", v41=True)[0]]
        rows = in_sglang(venv, "--probe", *map(str, folders), tool=Path(__file__))
        types = [json.loads((f / "config.json").read_text())["model_type"] for f in folders]
    return {ARCH: {"field": FIELD, "by_model_type": dict(zip(types, rows))}}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"]:
        from tools.sglang_dsv4_layers import cpu_rope

        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        cpu_rope()
        out.writelines(json.dumps(probe(folder)) + "\n" for folder in argv[1:])
        return 0
    if argv[:1] == ["--refusal"]:  # each checkpoint folder built as it is: SGLang's refusal or null (the SGLang tier)
        from tools import sglang_runtime as runtime
        from tools.sglang_dsv4_layers import cpu_rope

        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        cpu_rope()
        out.writelines(json.dumps(_outcome(lambda _: runtime.build(folder), {}, [])) + "\n" for folder in argv[1:])
        return 0
    from tools.sglang_built_layers import write_generated

    return write_generated([argv[0] if argv else "/work/venvs/sglang"], "layer_values_refused", generate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
