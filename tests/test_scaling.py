"""doctor, inspect and planning grow like n log n in the tensor count, not n².

Each is timed in process on the same assistant at 64 and at 256 layers (1.7k and 6.7k tensors):
4x the tensors must cost well under 16x the time. A per-tensor lookup that rebuilds a name map (the
sort key doctor once had) made this ratio ~50 (0.7 s -> 33 s); linear code stays near 4-6. The time is
the process's CPU time, best of three runs of each size: wall time measured the other jobs on a loaded
machine (11x and 12.8x were seen there against a 10x limit, for code whose CPU ratio is ~4). The 180k-tensor figures
are in BENCHMARKS.md (tools/benchmark.py --only many-tensors).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from pathlib import Path

import pytest

from repair.doctor.diagnose import diagnose
from repair.doctor.inspection import inspect_checkpoint
from repair.io.checkpoint import open_checkpoint
from repair.planning.build import make_plan
from repair.planning.recipe import Recipe
from repair.targets.profiles import resolve

SMALL, LARGE = 64, 256
LIMIT = 10.0  # linear: ~4-6; quadratic: ~16 and more


@pytest.fixture(scope="module")
def sizes(tmp_path_factory) -> dict[int, Path]:
    from repair.demo.examples import TINY, write_assistant

    root = tmp_path_factory.mktemp("scaling")
    return {layers: write_assistant(root / str(layers), dataclasses.replace(TINY, layers=layers)) for layers in (SMALL, LARGE)}


def best_of_three(fn) -> float:
    """Best CPU time (every thread of this process) of three runs, the cyclic GC paused: its pauses depend on everything else the test
    process holds (torch, hypothesis), not on the code measured."""
    times = []
    for _ in range(3):
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
        finally:
            gc.enable()
    return min(times)


EVERY_LINEAR = Recipe(name="all", dequantize=("*",))  # one change per packed module: planning's per-change work

OPERATIONS = {
    "open + inspect": lambda src: inspect_checkpoint(open_checkpoint(src)),
    "open + doctor": lambda src: diagnose(open_checkpoint(src), resolve("vllm==0.25.0")),
    "open + plan every module": lambda src: make_plan(open_checkpoint(src), EVERY_LINEAR),
}


@pytest.mark.parametrize("operation", OPERATIONS)
def test_four_times_the_tensors_is_not_sixteen_times_the_time(sizes, operation):
    run = OPERATIONS[operation]
    small, large = (best_of_three(lambda: run(sizes[n])) for n in (SMALL, LARGE))
    assert large / small < LIMIT, f"{operation}: {SMALL} layers {small:.3f} s, {LARGE} layers {large:.3f} s ({large / small:.1f}x)"
