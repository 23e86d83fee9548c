"""#25.8: no tracebacks from lone surrogates, non-UTF-8 file names or an early Ctrl-C, and memory linear in the
size of the config (a MIXED_PRECISION map with long layer names)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from repair.demo.examples import TINY, write_assistant
from repair.formats.algorithms import LayerAlgorithms
from tests.conftest import read_json, run_captured


@pytest.fixture()
def broken(tmp_path) -> Path:
    return write_assistant(tmp_path / "broken", TINY)


def _cli(*args, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repair", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, errors="backslashreplace")


def test_a_recipe_name_with_a_lone_surrogate_is_written_not_a_traceback(broken, tmp_path):
    report = tmp_path / "repair_report.json"
    report.write_text(json.dumps({"recipe": {"name": "x\udc80", "rules": [{"action": "dequantize", "modules": ["pre_projection", "post_projection"]}]}}))
    done = _cli("fix", broken, "-o", tmp_path / "out", "--recipe", report, "--quiet")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    written = json.loads((tmp_path / "out" / "repair_report.json").read_bytes().decode("utf-8"))
    assert written["recipe"]["name"] == "x\udc80"


def test_a_file_name_that_is_not_utf8_is_copied_and_reported_not_a_traceback(broken, tmp_path):
    (broken / os.fsdecode(b"notes-\xff.txt")).write_text("x")
    done = _cli("fix", broken, "-o", tmp_path / "out")
    assert done.returncode in (0, 2) and "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:
        assert (tmp_path / "out" / os.fsdecode(b"notes-\xff.txt")).read_text() == "x"
        json.loads((tmp_path / "out" / "repair_report.json").read_bytes().decode("utf-8"))
    else:
        assert done.stderr.count("\n") == 1


def test_ctrl_c_while_the_cli_is_still_importing_is_an_interrupt_not_a_traceback(broken):
    """Deterministic: the hook sends SIGINT from inside the CLI's imports, the window main()'s try did not cover."""
    done = _cli("inspect", broken, env={"CKPT_REPAIR_INTERRUPT_AT_IMPORT": "1"})
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == ["interrupted; nothing was written"]


@pytest.mark.parametrize("command", [["inspect", "{broken}"], ["doctor", "{broken}", "--target", "vllm==0.32.0"]])
def test_ctrl_c_inside_a_class_body_is_an_interrupt_not_a_traceback(broken, command):
    """Python 3.11 wraps a Ctrl-C that arrives while a class is created (a dataclass field's __set_name__, as CI saw at
    0.15 s) in a RuntimeError whose cause it is: still an interrupt, one line, exit 130. The hook raises it so from
    inside the CLI's imports, and (`later`) from a command's own imports, after main()'s try began."""
    for when in ("wrapped", "wrapped-later"):
        done = _cli(*[c.format(broken=broken) for c in command], env={"CKPT_REPAIR_INTERRUPT_AT_IMPORT": when})
        assert done.returncode == 130 and "Traceback" not in done.stderr, (when, done.stderr)
        assert done.stderr.strip().splitlines() == ["interrupted; nothing was written"], (when, done.stderr)


def test_ctrl_c_at_any_early_moment_never_prints_a_traceback(broken):
    """From the first line of ours on. Before it, the interpreter's own start (importing `site`, or runpy still
    looking up the package: a traceback with no frame of ours, seen on a loaded machine at 0.05 s) reports a Ctrl-C
    its own way; no program can catch that, so such a run is not counted, and most runs must count."""
    counted = 0
    for delay in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5):
        process = subprocess.Popen([sys.executable, "-m", "repair", "doctor", str(broken)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        frames = re.findall(r'File "([^"]+)"', err)
        if "init_import_site" in err or (frames and all(f.startswith("<frozen ") for f in frames)):
            continue
        counted += 1
        assert "Traceback" not in err and process.returncode in (0, 130), (delay, process.returncode, err)
    assert counted >= 5, counted


def test_layer_algorithms_memory_is_linear_in_the_config_size():
    """3,000 keys of ~1,000 characters (~3 MB of JSON): vLLM's parent-prefix lookup must not store every prefix."""
    entries = tuple((".".join(f"m{i}x{j}" for j in range(160)) + f".k{i}", "NVFP4" if i % 2 else "FP8") for i in range(3000))
    size = sum(len(k) for k, _ in entries)
    tracemalloc.start()
    algos = LayerAlgorithms(entries)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 10 * size, f"{peak / 1e6:.0f} MB for {size / 1e6:.1f} MB of names"
    key = entries[7][0]
    parent = key.rsplit(".", 1)[0]
    assert algos.lookup(parent) == ("NVFP4", None) and algos.lookup(key) == ("NVFP4", None)
    assert algos.lookup(parent.rsplit(".", 3)[0]) == ("NVFP4", None) and algos.lookup("m7x0.nothing") == (None, None)


def test_the_parent_lookup_takes_the_first_key_in_file_order():
    algos = LayerAlgorithms((("a.b.z", "FP8"), ("a.b.c", "NVFP4"), ("a.c", "W4A16_NVFP4"), (".x.y", "NVFP4"), ("a..q", "FP8")))
    assert algos.lookup("a.b") == ("FP8", None) and algos.lookup("a") == ("FP8", None)
    assert algos.lookup("") == ("NVFP4", None) and algos.lookup(".x") == ("NVFP4", None) and algos.lookup("a.") == ("FP8", None)
    assert algos.lookup("a.b.c.d") == (None, None) and algos.lookup("b") == (None, None)


@pytest.mark.parametrize("exc", [ValueError("a stored value we never expected"), AttributeError("'X' has no 'y'"),
                                 RuntimeError("not an interrupt")])
def test_a_bug_of_ours_is_one_line_and_exit_3_with_the_traceback_saved(broken, capsys, monkeypatch, tmp_path, exc):
    """An exception no check raised (the merge of two streams once left doctor with an AttributeError on DeepSeek-V4's
    published form) is a bug in ckpt-repair: one line naming it, exit 3, nothing written, and the traceback in a file
    the line names, never on the user's terminal."""
    import repair.doctor.inspection as inspection

    def broken_inspect(*args, **kwargs):
        raise exc
    monkeypatch.setattr(inspection, "inspect_checkpoint", broken_inspect)
    monkeypatch.delenv("CKPT_REPAIR_TRACEBACK")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    code, out, err = run_captured(capsys, "inspect", broken)
    assert code == 3 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: internal error: {type(exc).__name__}: {exc}; this is a bug in ckpt-repair"), err
    assert "nothing was written" in err
    saved = Path(err.strip().rsplit(" ", 1)[1])
    assert saved.parent == tmp_path and "Traceback" in saved.read_text() and "broken_inspect" in saved.read_text()


def test_with_ckpt_repair_traceback_set_a_bug_is_raised_as_it_is(broken, monkeypatch):
    import repair.doctor.inspection as inspection

    def broken_inspect(*args, **kwargs):
        raise ValueError("seen whole")
    monkeypatch.setattr(inspection, "inspect_checkpoint", broken_inspect)
    monkeypatch.setenv("CKPT_REPAIR_TRACEBACK", "1")
    from repair.cli import main

    with pytest.raises(ValueError, match="seen whole"):
        main(["inspect", str(broken)])
