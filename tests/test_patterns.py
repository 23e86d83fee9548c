"""`re:` patterns from checkpoints, recipes, reports and flags (#25.5): matched in bounded time, with exactly
Python re's results (`re.match` for compressed-tensors entries, `re.fullmatch` for recipe patterns), and a pattern
whose backtracking would blow up is refused in one line naming it, where it came from, and that Python's re hangs too.

The bound stated here (and in docs/failure_modes.md): a list of P patterns is compiled once, in O(P) (about 0.3 ms a
pattern, 10^5 in under 90 s on 2 shared cores); a name of n characters then costs linear-time RE2 passes over the
groups its own literal text selects, or Python's re on a pattern the static check proved at most quadratic (n^2).
"""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from repair.errors import BadInput, UsageError
from repair.io.patterns import FULLMATCH, MATCH, RegexSet

CATASTROPHIC = ["(.+)+X", "(a+)+$", "(a|a)*$", "(a|aa)+$", r"(?:.*\.)*X", r"(\w+\s?)+$", ".*.*.*X", "(x+x+)+y",
                r"(a*)*\1", r"(?=(a+)+$)b", "(a{1,3})*$", r"((ab)*|a)*c", r"(\d+|\d+\.)+x"]
SAFE = [r"model\.layers\.\d+\.mlp\..*", r"(.*\.)?pre_projection$", r"(?:\.\d+)*", "(a|b)*c", ".*lm_head", ".*layers.*mlp",
        r"(.*\.)?model\.layers\.0\.mlp\.(gate_up_proj|gate_proj|up_proj)$", r"(\w+)\.\1", r"(?!.*gate).*proj", r"\d{1,3}\.\d{1,3}",
        "[a-z_]+(?:[.][a-z_0-9]+)*", r"(?i)MODEL\..*", r"\bmlp\b.*", r"lm_head\Z", "a{2000}"]
NAMES = ["", "a", "aa" * 20 + "b", "model.layers.0.mlp.down_proj", "model.layers.12.self_attn.q_proj", "lm_head", "pre_projection",
         "draft_model.pre_projection", "model.layers.0.mlp.gate_up_proj", "a.a", "x\n", "lm_head\n", "é.1", "١٢.٣", "\u212a", "k",
         "MODEL.x", "mlp.gate", "a\u00a0b", "abc" * 50]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_catastrophic_pattern_is_refused_in_one_line(pattern):
    start = time.perf_counter()
    with pytest.raises(UsageError) as err:
        RegexSet.compile([pattern], FULLMATCH, "recipe.toml: rules[0]: module pattern", UsageError)
    message = str(err.value)
    assert "\n" not in message and repr(pattern) in message and message.startswith("recipe.toml: rules[0]")
    assert "backtrack" in message and "Python's re" in message and "hang" in message
    assert time.perf_counter() - start < 1


@pytest.mark.parametrize("pattern", SAFE)
@pytest.mark.parametrize("mode", [MATCH, FULLMATCH])
def test_a_safe_pattern_gives_python_re_results(pattern, mode):
    compiled = RegexSet.compile([pattern], mode, "test")
    python = re.compile(pattern)
    for name in NAMES:
        want = (python.match if mode == MATCH else python.fullmatch)(name) is not None
        assert compiled.matches(name) == want, (pattern, name)


def test_an_invalid_pattern_is_refused_as_python_refuses_it():
    for pattern in ["(", "a{2,1}", "[z-a]", r"\p{L}", "(?<n>a)", r"\Qa\E", "a**"]:
        with pytest.raises(BadInput, match="not a valid regular expression"):
            RegexSet.compile([pattern], MATCH, "config.json: quantization_config entry")


ATOMS = ["a", "b", ".", r"\.", "[ab]", "[^a]", r"\d", r"\w", r"\s", r"\W", "[a-c.]", "é", "^", "$", r"\Z", r"\A", r"\b", r"\B"]
QUANTIFIERS = ["", "", "*", "+", "?", "*?", "{2}", "{1,3}", "{0,}", "+?"]


@st.composite
def patterns(draw, depth=0):
    """A pattern built from nested groups, alternations, quantifiers, lookarounds and backreferences."""
    parts, groups = [], 0
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["atom"] * 4 + (["group", "alt", "look"] if depth < 2 else []) + (["ref"] if groups else [])))
        if kind == "atom":
            piece = draw(st.sampled_from(ATOMS))
        elif kind == "group":
            piece, groups = f"({draw(patterns(depth + 1))})", groups + 1
        elif kind == "alt":
            piece = f"(?:{draw(patterns(depth + 1))}|{draw(patterns(depth + 1))})"
        elif kind == "look":
            piece = f"({draw(st.sampled_from(['?=', '?!', '?<=', '?<!']))}{draw(st.sampled_from(ATOMS[:8]))})"
        else:
            piece = f"\\{draw(st.integers(1, groups))}"
        quantifier = draw(st.sampled_from(QUANTIFIERS)) if kind not in ("look",) and piece not in ("^", "$", r"\Z", r"\A", r"\b", r"\B") else ""
        parts.append(piece + quantifier)
    flags = draw(st.sampled_from(["", "", "(?s)", "(?m)", "(?i)", "(?a)"]))
    return flags + "".join(parts)


SUBJECTS = st.text(alphabet="ab.1 _\né\u212aK", max_size=10)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(pattern=patterns(), names=st.lists(SUBJECTS, min_size=1, max_size=8), mode=st.sampled_from([MATCH, FULLMATCH]))
def test_fuzz_every_accepted_pattern_equals_python_re_and_finishes_in_bounded_time(pattern, names, mode):
    try:
        python = re.compile(pattern)
    except re.error:
        with pytest.raises(BadInput):
            RegexSet.compile([pattern], mode, "fuzz")
        return
    try:
        compiled = RegexSet.compile([pattern], mode, "fuzz")
    except BadInput as err:
        assert "backtrack" in str(err), str(err)
        return
    run = python.match if mode == MATCH else python.fullmatch
    for name in names:
        assert compiled.matches(name) == (run(name) is not None), (pattern, name)
    start = time.perf_counter()
    for long in ("ab." * 300, "a" * 900 + "b", "1 " * 450):
        compiled.matches(long)
    assert time.perf_counter() - start < 2, pattern


def test_a_list_matches_when_any_pattern_does():
    compiled = RegexSet.compile([r"model\.layers\.1\..*", "lm_head", r"(a)\1"], FULLMATCH, "test")
    assert [compiled.matches(n) for n in ["model.layers.1.mlp", "lm_head", "aa", "model.layers.2.mlp", "a"]] == [True, True, True, False, False]
    assert RegexSet.compile([], MATCH, "test").matches("x") is False


def test_1e5_distinct_patterns_cost_linear_time():
    """10^5 patterns (nested quantifiers, alternations, a backreference in every 1,000th: i % 1000 == 2, of the
    third shape, i % 4 == 2) against 2,000 names."""
    patterns = []
    for i in range(100_000):
        shape = i % 4
        patterns.append([rf"model\.layers\.{i}\.mlp\.(gate|up)_proj", rf"(?:.*\.)?expert_{i}(?:\.\d+)*", rf"layer{i}\.(\w+)\.\1" if i % 1000 == 2
                         else rf"layer{i}\.[a-z]+", rf"(?:blk|layer)_{i}\.(?:q|k|v)_proj"][shape])
    names = [f"model.layers.{i * 37}.mlp.{'gate' if i % 2 else 'down'}_proj" for i in range(2000)]
    start = time.perf_counter()
    compiled = RegexSet.compile(patterns, FULLMATCH, "report.json: recipe")
    hits = sum(compiled.matches(n) for n in names)
    elapsed = time.perf_counter() - start
    for name in names[:20] + ["layer1002.x.x", "layer1002.x.y", "layer1006.x.y", "a.expert_5.1.2", "blk_7.q_proj"]:
        # Python's re on every pattern that can match: pattern i holds str(i) as literal text outside any alternative,
        # so one whose number is not in the name cannot (compiling all 10^5 in Python's re took a quarter of the test)
        assert compiled.matches(name) == any(re.fullmatch(p, name) for i, p in enumerate(patterns) if str(i) in name), name
    assert hits == sum(1 for i in range(2000) if i % 2 and (i * 37) % 4 == 0)
    assert compiled.matches("layer1002.x.x") and not compiled.matches("layer1002.x.y")  # the backreference decides
    assert elapsed < 90, f"{elapsed:.1f} s"  # measured 28 s here (2 shared cores): compiling is ~0.3 ms a pattern
