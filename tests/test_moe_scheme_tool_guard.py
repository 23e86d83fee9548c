"""tools/sglang_moe_schemes.py runs a wheel's `_is_*` predicates compiled from its source: only those predicates as
the tool's contract says (compressed-tensors' enums and the args, nothing else). A predicate that reaches for anything
else (a builtin such as open, a decorator or default evaluated at definition, an attribute of the config instance the
tool does not build) must stop the tool ("read it anew"), never run, and never be recorded as the release's refusal."""

from __future__ import annotations

import ast

import pytest

pytest.importorskip("compressed_tensors")

from tools.sglang_moe_schemes import refusal  # noqa: E402

CHAIN = """
    def get_moe_scheme(self, layer, layer_name=None):
        if self._is_wNa16_group_channel(weight_quant, input_quant):
            return A()
        else:
            raise RuntimeError(f"Unsupported FusedMoe scheme: {weight_quant}, {input_quant}")
"""


def tree(predicate: str) -> ast.Module:
    return ast.parse(f"class CompressedTensorsConfig:\n{predicate}\n{CHAIN}")


@pytest.mark.parametrize("predicate", [
    "    def _is_wNa16_group_channel(self, weight_quant, input_quant):\n        return open({path!r}, 'w') is None",
    "    @(lambda f: open({path!r}, 'w') and f)\n    def _is_wNa16_group_channel(self, weight_quant, input_quant):\n"
    "        return False",
    "    def _is_wNa16_group_channel(self, weight_quant, input_quant, x=open({path!r}, 'w')):\n        return False",
])
def test_a_predicate_reaching_past_the_enums_stops_the_tool_and_does_not_run(tmp_path, predicate):
    path = tmp_path / "written"
    with pytest.raises(SystemExit, match="read it anew"):
        refusal(tree(predicate.format(path=str(path))), "NVFP4A16")
    assert not path.exists()


def test_a_predicate_reading_the_config_instance_is_not_recorded_as_a_refusal():
    predicate = "    def _is_wNa16_group_channel(self, weight_quant, input_quant):\n        return self.quant_format == 'x'"
    with pytest.raises(SystemExit, match="read it anew"):
        refusal(tree(predicate), "NVFP4A16")
