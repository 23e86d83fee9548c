"""`--jobs N` (issue #27.4): computed tensors are made on N threads, with memory bounded by N tensors,
and the output's bytes are the same for every N."""

from __future__ import annotations

import threading
import time

import pytest

from repair.demo.examples import TINY, write_assistant
from repair.execute.parallel import default_jobs, in_order, runs
from tests.conftest import run_cli, tree_hashes


def _outputs(src, tmp_path, *flags: str, jobs=(1, 2, 3)) -> list[dict[str, str]]:
    trees = []
    for n in jobs:
        out = tmp_path / f"out-j{n}"
        assert run_cli("fix", src, "-o", out, "--quiet", "--jobs", n, *flags) == 0
        trees.append(tree_hashes(out))
    return trees


def _same(trees: list[dict[str, str]]) -> None:
    assert len(trees[0]) > 2 and all(tree == trees[0] for tree in trees[1:])


@pytest.mark.parametrize("fixture", ["broken_export", "ct_export", "mixed_export"])
def test_target_bf16_writes_the_same_bytes_for_every_jobs(request, fixture, tmp_path):
    """ModelOpt NVFP4, compressed-tensors and ModelOpt MIXED_PRECISION (NVFP4, FP8, AWQ...): every module
    dequantized, on 1, 2 and 3 threads; every file, the report included, is byte-identical."""
    _same(_outputs(request.getfixturevalue(fixture), tmp_path, "--target", "bf16"))


def test_requantize_writes_the_same_bytes_for_every_jobs(broken_export, original_model, tmp_path):
    """Requantized modules (three outputs from one computation, fused groups sharing a global scale)."""
    modules = "pre_projection,post_projection,model.layers.0.mlp.gate_proj,model.layers.0.mlp.up_proj,model.layers.0.self_attn.o_proj"
    _same(_outputs(broken_export, tmp_path, "--original", original_model, "--requantize", modules))


@pytest.mark.parametrize("target", ["bf16", "vllm==0.25.0"])
def test_tp2_writes_the_same_bytes_for_every_jobs(tmp_path, target):
    src = write_assistant(tmp_path / "src", TINY)
    _same(_outputs(src, tmp_path, "--target", target, "--tp", "2"))


def test_jobs_is_refused_below_one(broken_export, tmp_path, capsys):
    assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--jobs", "0") == 2
    assert "--jobs" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_in_order_keeps_order_bounds_results_in_flight_and_uses_threads():
    """Results come back in the order given, copies (not computed) pass through in place, at most `jobs`
    results exist at once (made and not yet handed back and released), and more than one thread computes."""
    alive, peak, threads, lock = [0], [0], set(), threading.Lock()

    def make(n: int) -> int:
        with lock:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
            threads.add(threading.current_thread().name)
        time.sleep(0.002 * (n % 3))  # finish out of order
        return n * n

    units = list(range(40))
    got = []
    for n, made in in_order(units, make, lambda n: n % 5 != 0, jobs=3):
        got.append((n, made))
        if made is not None:
            with lock:
                alive[0] -= 1  # the caller has written it and lets it go
    assert got == [(n, None if n % 5 == 0 else n * n) for n in units]
    assert peak[0] <= 3 and len(threads) > 1


def test_in_order_with_one_job_runs_on_the_callers_thread():
    names = [made for _, made in in_order(range(5), lambda n: threading.current_thread().name, lambda n: True, jobs=1)]
    assert set(names) == {threading.current_thread().name}


def test_an_error_in_a_unit_reaches_the_caller_in_order_and_stops_the_rest():
    started = []

    def make(n: int) -> int:
        started.append(n)
        if n == 4:
            raise ValueError("unit 4")
        time.sleep(0.001)
        return n

    seen = []
    with pytest.raises(ValueError, match="unit 4"):
        for n, _ in in_order(range(1000), make, lambda n: True, jobs=2):
            seen.append(n)
    assert seen == [0, 1, 2, 3] and max(started) < 10  # nothing far ahead was started


def test_runs_groups_consecutive_equal_keys_only():
    items = ["a1", "a2", "b1", "x", "y", "a3"]
    key = lambda s: s[0] if s[0] in "ab" else None  # noqa: E731
    assert runs(items, key) == [("a1", "a2"), ("b1",), ("x",), ("y",), ("a3",)]


def test_default_jobs_is_the_cores_this_process_may_use():
    import os

    assert default_jobs() == len(os.sched_getaffinity(0))


def test_a_failed_write_stops_the_compute_threads_before_the_error_is_reported(broken_export, tmp_path, monkeypatch):
    from repair.errors import BadInput
    from repair.execute import writer

    def fail(self, name, data):
        raise BadInput(f"{name}: no space left")

    monkeypatch.setattr(writer.ShardWriter, "write", fail)
    assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--quiet", "--jobs", "3", "--target", "bf16") == 2
    assert not [t for t in threading.enumerate() if t.name.startswith("ckpt-repair-compute")]
    assert not (tmp_path / "out").exists()


def test_a_huge_jobs_is_refused_with_one_line(broken_export, tmp_path, capsys):
    """A careless `--jobs 1000000` would start a thread per computed tensor and hold every result
    (memory bounded by the checkpoint, not by the tensors in flight): refused, exit 2, nothing written."""
    assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--jobs", "1000000") == 2
    err = capsys.readouterr().err
    assert "--jobs" in err and "Traceback" not in err and not (tmp_path / "out").exists()


def test_in_order_holds_at_most_max_jobs_results_whatever_jobs_it_is_given():
    from repair.execute.parallel import MAX_JOBS

    held, peak, threads = [0], [0], set()
    for _ in in_order(range(MAX_JOBS * 3), lambda n: (held.append(n), threads.add(threading.current_thread().name)),
                      lambda n: True, jobs=10**6):
        peak[0] = max(peak[0], len(held) - 1 - _[0])  # made minus handed back
    assert peak[0] <= MAX_JOBS and len(threads) <= MAX_JOBS


def test_in_order_is_linear_in_the_copies_between_computed_units():
    """A shard of 30k tensors with two computed ones: the window fills with copies; counting what it holds
    must not rescan them on every step (it did: 30k units took about 12 s, 180k would take minutes)."""
    start = time.perf_counter()
    got = list(in_order(range(30_000), lambda n: -n, lambda n: n in (0, 29_999), jobs=2))
    assert time.perf_counter() - start < 3.0
    assert got == [(n, -n if n in (0, 29_999) else None) for n in range(30_000)]


def test_workers_write_their_own_results_into_the_file(monkeypatch, tmp_path):
    """With `--jobs 2` each computed tensor is written into the output by the worker that made it (at its offset,
    fixed by the header), not by the one thread that writes in order: that thread copying every result into the
    page cache set the pace (BENCHMARKS.md §9). The writer still hashes them in order: bytes as with one job."""
    from repair.io.hashing import HashedOutput

    writers, place = [], HashedOutput.place

    def recorded(self, data, at):
        writers.append(threading.current_thread().name)
        return place(self, data, at)
    monkeypatch.setattr(HashedOutput, "place", recorded)
    src = write_assistant(tmp_path / "src", TINY)
    trees = _outputs(src, tmp_path, "--target", "bf16", jobs=(2,))
    assert len(writers) >= 8 and all(name.startswith("ckpt-repair-compute") for name in writers)
    writers.clear()
    assert _outputs(src, tmp_path, "--target", "bf16", jobs=(1,)) == trees and writers and "MainThread" in set(writers)
