"""How vLLM 0.32's rows are learned where no transformers class writes the checkpoint, and why the others are not:
tools/vllm_mapper_inverse.py reads a class's weight mapper back (in the release's own map order), and
tools/vllm_remote_configs.py answers the config fields vLLM's own model code reads, or records, with the line that
reads it, why it cannot (split from tests/test_remote_config_rows.py, which holds the rows' checks on exports)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from repair import arch
from tools import profile_report

VLLM = arch.newest("vllm")


@pytest.mark.parametrize(("name", "said"), [
    ("TeleChat2ForCausalLM", "TeleChat2Model.load_weights (telechat2.py:102) passes self._split_key_value(weights)"),
    ("IQuestLoopCoderForCausalLM", "model.gate_projections.0.gate_proj placed nowhere"),
])
def test_renamed_in_code_is_unprofiled_with_the_reason(name, said):
    """TeleChat2 publishes `key_value`, which its load_weights splits into `key` / `value` in code before the mapper sees
    them; IQuestLoopCoder's load_weights stacks gate/up (learned) but renames `gate_projections.N.weight` in code."""
    reason = VLLM.unprofiled[name]
    assert reason.startswith("no checkpoint layout to learn") and said in reason, reason


def test_mapper_inverse_is_the_forward_map_read_back(monkeypatch):
    """The regex inverse puts each group back into the pattern's own text; a pattern holding more than literals,
    anchors and groups, or a group its template drops, has none; a substring map is undone at each place."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "tools"))
    inverse = importlib.import_module("vllm_mapper_inverse")
    wo = re.compile(r"\Alayers\.(\d+)\.attention\.wo\.(\w+)\Z")
    assert inverse.regex_inverses(wo, r"model.layers.\1.self_attn.o_proj.\2", "model.layers.3.self_attn.o_proj.weight") \
        == {"layers.3.attention.wo.weight"}
    assert inverse.regex_inverses(wo, r"model.layers.\1.self_attn.o_proj.\2", "model.layers.3.mlp.weight") == set()
    assert inverse.regex_inverses(re.compile(r"\Alayers\.\d+\.wo\.(\w+)\Z"), r"model.wo.\1", "model.wo.weight") == set()
    assert inverse.regex_inverses(wo, r"model.layers.\1.self_attn.o_proj", "model.layers.3.self_attn.o_proj") == set()
    assert inverse.substr_inverses("a.layers.b.layers.c", ".h.", ".layers.") == {"a.h.b.layers.c", "a.layers.b.h.c"}


def test_a_recorded_refusal_is_the_same_text_whatever_order_its_set_printed_in(monkeypatch):
    """vLLM's "no module or parameter named" error lists the class's parameters as a set, whose order follows Python's
    hash seed: recorded whole (cut at 160 characters) it made the shipped row differ from a regeneration by chance (the
    Mistral Large 3 row's `output`). The set is left out; the rest is kept."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "tools"))
    facts = importlib.import_module("vllm_load_facts")
    head = "There is no module or parameter named 'output' in M. The available parameters belonging to  (M) are: "
    one, two = (facts.stable_text(ValueError(head + text)) for text in ("{'a.weight', 'b.weight'}", "{'b.weight', 'a.weight'}"))
    assert one == two == f"ValueError: {head}{{...}}"
    assert facts.stable_text(KeyError("x" * 500)) == "KeyError: '" + "x" * 159


UNPROFILED = VLLM.unprofiled


def test_a_default_vllms_own_code_refuses_to_build_is_answered():
    """sarvam.py:406 builds SarvamMLAMoE only where the config has num_experts (hasattr, then not None), and :609 refuses
    a model with none: the default's branch is one vLLM's own code refuses, so the learner answers num_experts (GENERIC's
    size) and says so in the row's config.source; its MLA fields are read with no default (qk_nope_head_dim, ...)."""
    source = VLLM.entries["SarvamMLAForCausalLM"]["config"]["source"]
    assert "num_experts (its default's build refused: RuntimeError: No SarvamMLAMoE layer found" in source, source
    assert "kv_lora_rank" in source, source


@pytest.mark.parametrize("name", ["PanguUltraMoEForCausalLM", "PanguProMoEV2ForCausalLM"])
def test_layers_chosen_by_whether_a_field_exists_are_not_guessed(name):
    """openpangu.py:884 builds no MoE layer without n_routed_experts (refused at :1191), and :791-794 build MLA only
    where the config has qk_nope_head_dim, qk_rope_head_dim, v_head_dim and kv_lora_rank (hasattr): which attention a
    published config selects is no value vLLM's code gives, and no published config is stored here. Unprofiled, saying
    so, rather than a row of the plain attention a published Pangu MoE may not have."""
    assert name not in VLLM.entries
    reason = UNPROFILED[name]
    assert "chooses the layers it builds by whether the config has" in reason, reason
    assert "qk_nope_head_dim" in reason and "openpangu.py:79" in reason, reason


def test_every_unanswered_field_is_named_with_the_line_of_vllm_that_reads_it():
    """A field no generic value answers is named with where vLLM's model code reads it (file:line and the line), so
    the reason says what a published config would have to give."""
    unanswered = {a: r for a, r in UNPROFILED.items() if "no generic value answers" in r}
    assert len(unanswered) >= 8, unanswered
    for name, reason in unanswered.items():
        assert re.search(r"no generic value answers: \w+ \([\w/]+\.py:\d+: `.+`\)", reason), (name, reason)
    assert "nemotron_nas.py:133: `block_config = config.block_configs[layer_idx]`" in UNPROFILED["DeciLMForCausalLM"]


@pytest.mark.parametrize("name", ["Rnj1ForCausalLM", "Step1ForCausalLM"])
def test_attention_this_hosts_backend_refuses_is_a_host_limit(name):
    """rnj1.py passes chunk_lookback, step1.py use_alibi_sqrt to every Attention they build, whatever the config: the CPU
    attention backend here refuses both, a GPU's builds them; docs/runtime_profiles.md lists them with GPU-only builds."""
    assert profile_report.category(UNPROFILED[name]) == "needs a GPU-only kernel or backend to build", UNPROFILED[name]


def test_k_exaones_listed_name_gets_the_row_of_the_class_vllm_builds_for_it():
    """K-EXAONE's config.json lists ExaoneMoEForCausalLM, which vLLM 0.32 registers under its ExaoneMoeForCausalLM class
    (registry.py: ("exaone_moe", "ExaoneMoeForCausalLM")); vLLM's own test registry loads its example
    LGAI-EXAONE/K-EXAONE-236B-A23B without trust_remote_code (transformers >= 5.1.0), so its config class is
    transformers' ExaoneMoeConfig and transformers' ExaoneMoeForCausalLM writes its names: the same row as that class's."""
    listed = VLLM.entries["ExaoneMoEForCausalLM"]
    assert listed == VLLM.entries["ExaoneMoeForCausalLM"]
    assert "ExaoneMoEForCausalLM" not in UNPROFILED


def test_mapper_inverse_reads_the_releases_own_map_order(monkeypatch):
    """vLLM 0.28/0.30's WeightsMapper names its one-name map `_map_name` (public `map_name` since 0.32) and applies its
    maps in 0.32's order (utils.py _map_name_with_shard: renaming, regex, substr, stacked, prefix, suffix): Mistral
    Large 3's row is learned there too (the 0.28 profile had recorded the tool's own AttributeError as vLLM's failure to
    build it). A mapper applying its maps in another order is not inverted by candidates(): the tool stops and says so."""
    import dataclasses

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "tools"))
    inverse = importlib.import_module("vllm_mapper_inverse")

    @dataclasses.dataclass
    class Older:  # 0.28's shape: only _map_name, the maps in 0.32's order
        orig_to_new_renaming: list = dataclasses.field(default_factory=list)
        orig_to_new_regex: dict = dataclasses.field(default_factory=dict)
        orig_to_new_substr: dict = dataclasses.field(default_factory=dict)
        orig_to_new_stacked: dict = dataclasses.field(default_factory=dict)
        orig_to_new_prefix: dict = dataclasses.field(default_factory=dict)
        orig_to_new_suffix: dict = dataclasses.field(default_factory=dict)

        def _map_name(self, key):
            return self._map_name_with_shard(key)[0]

        def _map_name_with_shard(self, key):
            for _ in self.orig_to_new_renaming, self.orig_to_new_regex, self.orig_to_new_substr:
                pass
            for _ in self.orig_to_new_stacked, self.orig_to_new_prefix:
                pass
            for old, new in self.orig_to_new_suffix.items():
                key = key[: -len(old)] + new if key.endswith(old) else key
            return key, None

    class Reordered(Older):  # suffixes before prefixes: candidates() would invert in the wrong order
        def _map_name_with_shard(self, key):
            for _ in self.orig_to_new_renaming, self.orig_to_new_regex, self.orig_to_new_substr:
                pass
            for _ in self.orig_to_new_stacked, self.orig_to_new_suffix, self.orig_to_new_prefix:
                pass
            return key, None

    class Model:
        hf_to_vllm_mapper = Older(orig_to_new_suffix={".wo": ".o_proj"})

        def modules(self):
            return [self]

    assert inverse.published_names(Model(), ["layers.0.o_proj"]) == {"layers.0.o_proj": "layers.0.wo"}
    Model.hf_to_vllm_mapper = Reordered(orig_to_new_suffix={".wo": ".o_proj"})
    with pytest.raises(SystemExit, match="orig_to_new_suffix.*orig_to_new_prefix"):
        inverse.published_names(Model(), ["layers.0.o_proj"])
