"""Cases that break a parser rather than a checkpoint's structure: text that is not UTF-8 or holds lone
surrogates, nesting deep enough to exhaust Python's recursion limit, numbers past Python's int-string
limit, dimensions past int64, invalid regular expressions, and recipes (TOML and report JSON) of the
wrong shape. Each must end as one line and exit 2 like any other bad input.
"""

from __future__ import annotations

import json

from .edits import ONE, _edit_header, _edit_json, _split, _write, assistant
from .registry import Case, case

DEEP = 100_000
LONG_NUMBER = "9" * 5000  # past Python's 4300-digit int-string limit


def _rename_tensor(header: dict, old: str, new: str) -> None:
    header[new] = header.pop(old)


@case
def name_lone_surrogate(work):  # valid JSON ("\ud800" is an escape), but no UTF-8 encoding exists for it
    src = assistant(work)
    _edit_header(src / ONE, lambda h: _rename_tensor(h, "model.norm.weight", "model.norm\ud800.weight"))
    return Case(src, "model.norm\\ud800.weight: tensor name is not valid Unicode")


@case
def metadata_lone_surrogate(work):
    src = assistant(work)
    _edit_header(src / ONE, lambda h: h.update({"__metadata__": {"format": "pt\udfff"}}))
    return Case(src, "__metadata__ is not valid Unicode")


@case
def zero_size_dim_2_64(work):  # 0 elements, so the byte count fits; torch and numpy cannot hold the shape
    src = assistant(work)
    _edit_header(src / ONE, lambda h: h.update({"extra.empty": {"dtype": "F32", "shape": [0, 2**64], "data_offsets": [0, 0]}}))
    return Case(src, "extra.empty: shape [0, 18446744073709551616] is not a list of at most 64 integers")


@case
def header_nested_deep(work):
    src = assistant(work)
    _, data = _split(src / ONE)
    _write(src / ONE, b"[" * DEEP + b"]" * DEEP, data)
    return Case(src, "header is not valid JSON: JSON nested too deeply")


@case
def config_nested_deep(work):
    src = assistant(work)
    (src / "config.json").write_text("[" * DEEP + "]" * DEEP)
    return Case(src, "config.json: JSON nested too deeply to read")


@case
def config_long_number(work):
    src = assistant(work)
    text = (src / "config.json").read_text()
    (src / "config.json").write_text(text.replace('"num_centroids": 2048', f'"num_centroids": {LONG_NUMBER}', 1))
    return Case(src, "config.json: JSON value cannot be read (Exceeds the limit (4300 digits)")


@case
def ct_ignore_invalid_regex(work):  # compressed-tensors `ignore` entries are regexes when they start with re:
    src = assistant(work)
    _edit_json(src / "config.json", lambda c: c.update(quantization_config={
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head", "re:(.*\\.pre_projection"],
        "config_groups": {"group_0": {"targets": ["Linear"], "format": "nvfp4-pack-quantized"}}}))
    (src / "hf_quant_config.json").unlink()
    return Case(src, "config.json: quantization_config entry: '(.*\\\\.pre_projection' is not a valid regular expression")


def _recipe(work, name: str, content: str | bytes) -> str:
    path = work / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return str(path)


@case
def recipe_invalid_regex(work):
    recipe = _recipe(work, "bad.toml", '[[rules]]\naction = "dequantize"\nmodules = ["re:pre_projection(["]\n')
    return Case(assistant(work), "rules[0]: module pattern: 'pre_projection([' is not a valid regular expression", args=("--recipe", recipe))


@case
def recipe_rules_not_a_list(work):
    recipe = _recipe(work, "bad.toml", 'name = "x"\nrules = 5\n')
    return Case(assistant(work), "'rules' must be a list of tables ([[rules]]), found 5", args=("--recipe", recipe))


@case
def recipe_not_utf8(work):
    recipe = _recipe(work, "bad.toml", b'name = "caf\xe9"\n')
    return Case(assistant(work), "bad.toml: not UTF-8 text (byte 11)", args=("--recipe", recipe))


@case
def recipe_toml_nested_deep(work):
    recipe = _recipe(work, "bad.toml", "name = " + "[" * DEEP + "]" * DEEP + "\n")
    return Case(assistant(work), "bad.toml: TOML nested too deeply to read", args=("--recipe", recipe))


@case
def recipe_toml_long_number(work):
    recipe = _recipe(work, "bad.toml", f"name = {LONG_NUMBER}\n")
    return Case(assistant(work), "bad.toml: TOML value cannot be read (Exceeds the limit (4300 digits)", args=("--recipe", recipe))


@case
def recipe_report_nested_deep(work):
    recipe = _recipe(work, "repair_report.json", '{"recipe": ' + "[" * DEEP + "]" * DEEP + "}")
    return Case(assistant(work), "repair_report.json: JSON nested too deeply to read", args=("--recipe", recipe))


@case
def recipe_report_long_number(work):
    recipe = _recipe(work, "repair_report.json", json.dumps({"recipe": {"name": "x"}})[:-2] + f', "dtype": {LONG_NUMBER}}}}}')
    return Case(assistant(work), "repair_report.json: JSON value cannot be read (Exceeds the limit", args=("--recipe", recipe))


@case
def requantize_invalid_regex(work):
    return Case(assistant(work), "module pattern: 'post_projection)' is not a valid regular expression",
                args=("--requantize", "re:post_projection)"))
