"""tools/sglang_linear_schemes.py: each SGLang wheel's `_get_scheme_from_parts` (its own predicates, asked in order on
compressed-tensors' NVFP4A16 preset) read into `linear_scheme_refused`; it stops on what it cannot run, never guesses."""

from __future__ import annotations

import ast
import glob
from pathlib import Path

import pytest

from repair.targets.runtime_rules import shipped_rules
from tools.sglang_linear_schemes import refusal

UTILS = ast.parse("def is_activation_quantization_format(format):\n"
                  "    f = [CompressionFormat.float_quantized.value, CompressionFormat.nvfp4_pack_quantized.value]\n"
                  "    return format in f\n")
PRED = ("    def _is_w(self, weight_quant, input_quant):\n        return weight_quant.num_bits == 4\n"
        "    def _is_a(self, weight_quant, input_quant):\n        return input_quant.num_bits == 8\n")


def source(body: str, preds: str = PRED) -> ast.Module:
    return ast.parse(f"class CompressedTensorsConfig:\n{preds}"
                     f"    def _get_scheme_from_parts(self, weight_quant, input_quant):\n{body}")


def test_the_first_predicate_raising_or_the_final_raise_is_the_refusal_and_one_holding_builds():
    raising = source("        if is_activation_quantization_format(self.quant_format):\n"
                     "            if self._is_a(weight_quant, input_quant):\n                return 1\n"
                     "        raise NotImplementedError('none')\n")
    fact = refusal(raising, UTILS, "NVFP4A16", "nvfp4-pack-quantized")
    assert fact["error"].startswith("AttributeError") and "asks _is_a" in fact["where"], fact
    assert refusal(raising, UTILS, "NVFP4A16", "pack-quantized")["error"] == "NotImplementedError: none"  # gate shut
    built = source("        if self._is_w(weight_quant, input_quant):\n            return 1\n"
                   "        if self._is_a(weight_quant, input_quant):\n            return 2\n        raise ValueError('x')\n")
    assert refusal(built, UTILS, "NVFP4A16", "nvfp4-pack-quantized") is None


@pytest.mark.parametrize("body, preds, said", [
    ("        x = open('/etc/passwd')\n        raise ValueError('x')\n", PRED, "before it answers"),
    ("        if self._is_s(weight_quant, input_quant):\n            return 1\n        raise ValueError('x')\n",
     "    def _is_s(self, weight_quant, input_quant):\n        return self.quant_format == 'x'\n", "self.quant_format"),
    ("        if self._is_w(weight_quant, input_quant):\n            pass\n        raise ValueError('x')\n", PRED, "returns no"),
])
def test_what_it_cannot_run_as_written_stops_it(body, preds, said):
    with pytest.raises(SystemExit, match=said):
        refusal(source(body, preds), UTILS, "NVFP4A16", "nvfp4-pack-quantized")


def test_the_shipped_block_is_what_the_tool_reads_from_each_wheel():
    """Where the wheels are at hand (pip download --no-deps sglang==X): a release's own file holds its block; one falling
    back to 0.5.12's file is in that fact's built_by exactly when it builds the layer (0.5.22)."""
    from tools.sglang_linear_schemes import read_wheel

    wheels = {Path(p).name.split("-")[1]: Path(p) for p in glob.glob("/tmp/sgl*/*/sglang-*.whl")}
    if not wheels:
        pytest.skip("no SGLang wheel downloaded")
    facts = {r.release: r.linear_scheme_refused for r in shipped_rules() if r.runtime == "sglang"}
    for release, wheel in wheels.items():
        version = tuple(map(int, release.split(".")))
        block = read_wheel(wheel)[2]
        below = facts[max(v for v in facts if v <= version)]
        for method, algos in below.items():
            for algo, fact in algos.items():
                if version in facts:
                    assert block[method][algo] == {k: v for k, v in fact.items() if k != "built_by"}, release
                else:
                    assert (algo not in block.get(method, {})) == (release in fact.get("built_by", ())), release
        assert version not in facts or all(a in below.get(m, {}) for m, algos in block.items() for a in algos), release


def _mapped(gate_arg: str, body: str) -> ast.Module:
    return ast.parse(f"class CompressedTensorsConfig:\n{PRED}"
                     f"    def _quantization_scheme_map_from_config(cls, config):\n"
                     f"        if is_activation_quantization_format({gate_arg}):\n            pass\n"
                     f"    def _get_scheme_from_parts(self, weight_quant, input_quant, format=None):\n{body}")


def test_a_group_in_a_mixed_precision_config_is_asked_with_the_format_the_releases_scheme_map_reads():
    """0.5.9-0.5.16's map gates on the config's format (`mixed-precision`: not admitted, the input args dropped, the
    method's gate shut); 0.5.17+'s on the group's own, and the method then picks that format too."""
    gated = ("        if is_activation_quantization_format(self.quant_format):\n"
             "            if self._is_w(weight_quant, input_quant):\n                return 1\n"
             "        raise NotImplementedError('none')\n")
    assert refusal(_mapped("quant_format", gated), UTILS, "NVFP4", "nvfp4-pack-quantized") is None  # its own format
    fact = refusal(_mapped("quant_format", gated), UTILS, "NVFP4", "nvfp4-pack-quantized", "mixed-precision")
    assert fact["error"] == "NotImplementedError: none", fact
    chosen = "        quant_format = format if format is not None else self.quant_format\n" + gated.replace("self.quant_format", "quant_format")
    group = "group_format if group_format is not None else quant_format"
    assert refusal(_mapped(group, chosen), UTILS, "NVFP4", "nvfp4-pack-quantized", "mixed-precision") is None
    with pytest.raises(SystemExit, match="read it anew"):  # the map reads the group's format, the method does not
        refusal(_mapped(group, gated), UTILS, "NVFP4", "nvfp4-pack-quantized", "mixed-precision")
    with pytest.raises(SystemExit, match="not one format this tool reads"):
        refusal(_mapped("config['format']", gated), UTILS, "NVFP4", "nvfp4-pack-quantized", "mixed-precision")


def test_a_flag_of_the_args_then_raise_is_read_and_anything_more_stops_it():
    """0.5.22's `is_non_nvfp4_fp4a4 = weight_quant is not None and ... ; if is_non_nvfp4_fp4a4: raise ...`."""
    flag = ("        f = weight_quant is not None and weight_quant.num_bits == 8\n"
            "        if f:\n            raise NotImplementedError('eight')\n")
    assert refusal(source(flag + "        raise ValueError('x')\n"), UTILS, "FP8", "float-quantized")["error"] == \
        "NotImplementedError: eight"
    assert refusal(source(flag + "        raise ValueError('x')\n"), UTILS, "NVFP4", "nvfp4-pack-quantized")["error"] == "ValueError: x"
    with pytest.raises(SystemExit, match="before it answers"):  # a flag that calls something is not read
        refusal(source("        f = len(str(weight_quant))\n        raise ValueError('x')\n"), UTILS, "FP8", "float-quantized")
