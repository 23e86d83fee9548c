"""Many exclusion entries against many module names in one pass (#27: doctor's unused-exclusion scan tried every entry
on every module, 64 s for ModelOpt 0.23's 489 names on DeepSeek-R1): results equal vLLM's ModelOpt rule and
compressed-tensors' `re.match` entry by entry, and the work is one RE2 pass per name, however long the list."""

from __future__ import annotations

import dataclasses
import fnmatch
import re

from hypothesis import HealthCheck, given, settings, strategies as st

from repair.formats.compressed_tensors import ct_rule
from repair.formats.modelopt_nvfp4 import modelopt_rule
from repair.io.patterns import FULLMATCH, MATCH, RegexSet
from repair.io.regex_index import used_patterns
from tests.test_patterns import SUBJECTS, patterns


def vllm_modelopt_excludes(prefix: str, entry: str) -> bool:
    """vLLM's ModelOpt is_layer_excluded for one entry, as written there: exact, substring, then fnmatch (an entry `X*`
    is split into `X` and `X.*` before, where the class has a mapper: targets/entry_mappers.py, not this rule)."""
    return prefix == entry or entry in prefix or fnmatch.fnmatch(prefix, entry)


GLOB = st.text(alphabet="ab.1*?[]!-^\\\né\u212aK_", max_size=8)
NAME = st.text(alphabet="ab.1*?[]!-_\né\u212aK", max_size=10)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(entries=st.lists(GLOB, min_size=1, max_size=6), names=st.lists(NAME, min_size=1, max_size=8))
def test_modelopt_entries_used_and_excludes_equal_vllms_rule_entry_by_entry(entries, names):
    rule = modelopt_rule(entries)
    assert rule.used_entries(names) == {e for e in entries if any(vllm_modelopt_excludes(n, e) for n in names)}
    for name in names:
        assert rule.excludes(name) == any(vllm_modelopt_excludes(name, e) for e in entries), name


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(pattern_list=st.lists(patterns(), min_size=1, max_size=4), names=st.lists(SUBJECTS, min_size=1, max_size=8),
       mode=st.sampled_from([MATCH, FULLMATCH]))
def test_used_patterns_equal_python_re_pattern_by_pattern(pattern_list, names, mode):
    try:
        compiled = RegexSet.compile(pattern_list, mode, "fuzz")
    except Exception:  # refused (invalid, or would backtrack): test_patterns.py covers the refusal
        return
    run = {p: getattr(re.compile(p), mode) for p in pattern_list}
    assert used_patterns(compiled, names) == {p for p in pattern_list if any(run[p](n) for n in names)}


def test_literal_and_regex_ignore_entries_count_as_used_where_they_match():
    rule = ct_rule(["lm_head", "re:.*pre_projection$", r"re:model\.layers\.0\.", "re:x(?=y)", "mtp", "re:é"])
    names = ["lm_head", "model.layers.0.mlp.down_proj", "draft_model.pre_projection", "xy", "é.1"]
    assert rule.used_entries(names) == {"lm_head", "re:.*pre_projection$", r"re:model\.layers\.0\.", "re:x(?=y)", "re:é"}
    targeted = ct_rule(["lm_head", "mtp"], ["re:.*mlp.*"])  # a layer no target names: any list excludes it
    assert targeted.used_entries(["model.layers.0.self_attn.q_proj"]) == {"lm_head", "mtp"}
    assert targeted.used_entries(["model.layers.0.mlp.down_proj"]) == frozenset()


class CountingSet:
    """An RE2 set that counts the passes made over names, and the bytes they cover."""

    def __init__(self, inner):
        self.inner, self.passes, self.bytes = inner, 0, 0

    def Match(self, text: bytes):
        self.passes += 1
        self.bytes += len(text)
        return self.inner.Match(text)


def counted(rule):
    sets = tuple((CountingSet(s), owners) for s, owners in rule.index.sets)
    return dataclasses.replace(rule, index=dataclasses.replace(rule.index, sets=sets)), sets


def test_the_unused_exclusion_scan_is_one_pass_over_the_names_whatever_the_list_length():
    """ModelOpt 0.23 style: one exact name per excluded layer, plus wildcards. The work, counted in passes of an RE2
    automaton over a name and in the bytes passed over, is the same for 10 entries and for 2,000: names x 1, not
    names x entries. vLLM asks a routed expert's layer (`...mlp.experts`), so the names passed over are the 40 layers;
    a per-expert entry is used when it contains its layer (is_layer_skipped's experts branch), found without a pass."""
    names = [f"model.layers.{i}.mlp.experts.{e}.{p}" for i in range(40) for e in range(50) for p in ("gate_proj", "down_proj")]
    layers = {f"model.layers.{i}.mlp.experts" for i in range(40)}
    work = {}
    for count in (10, 2000):
        entries = [f"model.layers.{i % 40}.mlp.experts.{i}.up_proj" for i in range(count - 2)] + ["model.layers.3*", "lm_head"]
        rule, sets = counted(modelopt_rule(entries))
        used = rule.used_entries(names)
        assert used == set(entries) - {"lm_head"}
        assert not rule.index.python and not rule.index._tests  # no entry went to Python's re, no name needed it
        work[count] = (sum(s.passes for s, _ in sets), sum(s.bytes for s, _ in sets))
    # two automata (the entries' substrings, searched; the wildcard's fnmatch, anchored), each one pass per layer
    assert work[10] == work[2000] == (2 * len(layers), 2 * sum(len(n) for n in layers))


def test_an_entry_too_long_for_re2_is_decided_by_python_alike():
    """A megabyte-long entry would take RE2 minutes to compile: past LONGEST it is Python's test alone."""
    long_name = "model." + "x" * 3000 + ".mlp"
    entries = ["x" * 2000, "model.*" + "x" * 2000 + "*", "y" * 5000, "*" + "?" * 4000 + "*"]
    rule = modelopt_rule(entries)
    assert {rule.index.alternatives[i].owner for i in rule.index.python} == {0, 1, 2, 3}
    names = [long_name, "lm_head"]
    assert rule.used_entries(names) == {e for e in entries if any(vllm_modelopt_excludes(n, e) for n in names)} == {entries[0], entries[1]}
    assert rule.excludes(long_name) and not rule.excludes("lm_head")
