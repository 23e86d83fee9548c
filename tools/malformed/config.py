"""Cases that break the config files: config.json and hf_quant_config.json as JSON, and their
quantization settings (quant_algo, ignore).
"""

from __future__ import annotations

from .edits import _edit_json, assistant
from .registry import Case, case


@case
def config_invalid_json(work):
    src = assistant(work)
    (src / "config.json").write_text((src / "config.json").read_text()[:200])
    return Case(src, "config.json: invalid JSON at line")


@case
def config_not_an_object(work):
    src = assistant(work)
    (src / "config.json").write_text("[]")
    return Case(src, "config.json: expected a JSON object, found list")


@case
def hf_quant_invalid_json(work):
    src = assistant(work)
    (src / "hf_quant_config.json").write_bytes(b"\xef\xbb\xbf{\x00")
    return Case(src, "hf_quant_config.json: ")


@case
def hf_quant_missing_quantization(work):
    src = assistant(work)
    _edit_json(src / "hf_quant_config.json", lambda c: c.pop("quantization"))
    return Case(src, "hf_quant_config.json: missing the 'quantization' object")


@case
def missing_quant_algo(work):
    src = assistant(work)
    _edit_json(src / "config.json", lambda c: c["quantization_config"].pop("quant_algo"))
    _edit_json(src / "hf_quant_config.json", lambda c: c["quantization"].pop("quant_algo"))
    return Case(src, "config.json: quantization_config has no quant_algo")


@case
def unknown_quant_algo(work):
    src = assistant(work)
    _edit_json(src / "config.json", lambda c: c["quantization_config"].update(quant_algo="W4A8_AWQ"))
    _edit_json(src / "hf_quant_config.json", lambda c: c["quantization"].update(quant_algo="W4A8_AWQ"))
    return Case(src, "config.json: quant_algo 'W4A8_AWQ' is not supported")


@case
def quant_algos_disagree(work):
    src = assistant(work)
    _edit_json(src / "hf_quant_config.json", lambda c: c["quantization"].update(quant_algo="FP8"))
    return Case(src, "hf_quant_config.json declare different quant_algo (NVFP4 and FP8)")  # FP8 is read since #19


@case
def ignore_not_a_list(work):
    src = assistant(work)
    _edit_json(src / "config.json", lambda c: c["quantization_config"].update(ignore="lm_head"))
    return Case(src, "quantization_config.ignore must be a list of module names")
