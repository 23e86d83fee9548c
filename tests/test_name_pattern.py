"""Name patterns (repair/doctor/name_pattern.py): compact forms that expand back to exactly the names given."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from repair.doctor.name_pattern import MAX_FIELDS, compact, expand, natural_key, natural_sorted


def _back(patterns: list[str]) -> list[str]:
    return [name for p in patterns for name in expand(p)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("a.{}\\,0123456789_-x\u0661"), max_size=24), max_size=40))
def test_compact_form_expands_back_to_exactly_the_names_given(names):
    back = _back(compact(names))
    assert sorted(back) == sorted(set(names)) and len(back) == len(set(names))


@settings(max_examples=200, deadline=None)
@given(st.sets(st.tuples(st.integers(0, 12), st.integers(0, 40), st.sampled_from(["gate_proj", "up_proj", "down_proj"])), max_size=300))
def test_layer_and_expert_grids_round_trip(cells):
    names = [f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight_scale_2" for layer, e, proj in cells]
    assert sorted(_back(compact(names))) == sorted(names)


def test_routers_of_89_layers_are_one_pattern():
    names = [f"model.layers.{i}.mlp.gate" for i in range(3, 92)]
    assert compact(reversed(names)) == ["model.layers.{3..91}.mlp.gate"]


def test_a_full_expert_grid_is_one_pattern_per_projection():
    names = [f"model.layers.{layer}.mlp.experts.{e}.{p}" for layer in range(3, 61) for e in range(256) for p in ("gate_proj", "up_proj")]
    assert compact(names) == ["model.layers.{3..60}.mlp.experts.{0..255}.gate_proj", "model.layers.{3..60}.mlp.experts.{0..255}.up_proj"]


def test_runs_gaps_and_single_values():
    names = [f"l.{i}.w" for i in (0, 1, 2, 3, 7, 9, 10)]
    assert compact(names) == ["l.{0..3,7,9,10}.w"] and compact(["l.5.w"]) == ["l.5.w"]


def test_natural_order():
    assert natural_sorted(["layers.10", "layers.3", "layers.2.x", "a"]) == ["a", "layers.2.x", "layers.3", "layers.10"]
    assert compact(["b.10", "b.3", "a.20"]) == ["a.20", "b.{3,10}"]
    assert natural_key("w007") == ("w007",)  # a leading zero keeps the digits text: 007 never turns into 7


def test_hostile_names_come_back_exactly():
    names = ["a{1..3}", "x\\{", "}", "9" * 40, "q.\u0661\u0662", "n" + ".1" * (MAX_FIELDS + 5), "w007", "w7"]
    patterns = compact(names)
    assert sorted(_back(patterns)) == sorted(names)
    assert "a\\{1..3\\}" in patterns  # braces of a name are escaped, never a range


def test_scale():
    """44,849 R1-sized module names compact quickly into a handful of patterns."""
    import time

    names = [f"model.layers.{layer}.mlp.experts.{e}.{p}" for layer in range(3, 61) for e in range(256) for p in ("gate_proj", "up_proj", "down_proj")]
    start = time.perf_counter()
    patterns = compact(names)
    assert len(patterns) == 3 and time.perf_counter() - start < 5


def test_backslashes_of_re_patterns_stay_single():
    names = [f"re:(.*\\.)?model\\.layers\\.{i}\\.mlp\\.gate$" for i in range(3, 92)]
    assert compact(names) == ["re:(.*\\.)?model\\.layers\\.{3..91}\\.mlp\\.gate$"]
    assert sorted(_back(compact(["a\\", "b\\{", "c\\\\", "d\\x"]))) == ["a\\", "b\\{", "c\\\\", "d\\x"]
