"""`fix` as a careless user runs it: on one rank folder of an earlier `fix --tp` output instead of on the standard
checkpoint. Its tensors are slices and its config the whole model's: splitting them again (`--tp`), or repairing them
as they are (`--target bf16` dequantizes the slices under the whole model's config), writes a layout no runtime loads.
Refused in one line (exit 2) that says to unshard first, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_captured, run_cli


@pytest.fixture(scope="module")
def tp_out(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("tp-attack")
    src = write_assistant(base / "src", TINY)
    assert run_cli("fix", src, "-o", base / "tp", "--tp", "2", "--quiet") == 0
    return base / "tp"


@pytest.mark.parametrize("args", [("--tp", "2"), ("--tp", "1"), ("--target", "bf16"), ("--target", "bf16", "--tp", "2")],
                         ids=["tp2", "tp1", "bf16", "bf16-tp2"])
@pytest.mark.parametrize("rank", [0, 1])
def test_fix_on_a_rank_folder_is_refused_in_one_line(rank, args, tp_out, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", tp_out / f"rank-{rank}", "-o", out, *args, "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"rank {rank} of 2" in err and "unshard" in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [("fix", "--quiet"), ("fix", "--tp", "2", "--quiet"), ("doctor",), ("inspect",)])
def test_a_command_on_the_tp_output_folder_says_to_unshard_it(command, tp_out, tmp_path, capsys):
    """The folder holding tp_manifest.json and the rank folders has no shard of its own: the one line says what it is."""
    out = ("-o", tmp_path / "out") if command[0] == "fix" else ()
    code, _, err = run_captured(capsys, command[0], tp_out, *out, *command[1:])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "fix --tp" in err and "unshard" in err, err
    assert list(tmp_path.iterdir()) == []
