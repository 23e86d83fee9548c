"""The README's examples run as written: the shell commands, the recipe file and the Python block."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from repair.planning.recipe import recipe_from_dict

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), re.S)


def test_shell_examples_run_with_the_documented_exit_codes(tmp_path):
    (commands,) = blocks("sh")
    cli = shutil.which("ckpt-repair", path=str(Path(sys.executable).parent)) or "ckpt-repair"
    ran = 0
    for line in commands.strip().splitlines():
        command, _, comment = line.partition("#")
        args = command.split()
        assert args[0] == "ckpt-repair", line
        expected = 1 if "exits 1" in comment else 0
        done = subprocess.run([cli, *args[1:]], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
        assert done.returncode == expected, f"{line}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr
        ran += 1
    assert ran >= 8
    again, first = tmp_path / "work/fixed-again", tmp_path / "work/fixed-025"
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in first.iterdir())
    assert all((again / p.name).read_bytes() == p.read_bytes() for p in first.iterdir())


def test_recipe_example_is_a_valid_recipe():
    (text,) = blocks("toml")
    recipe = recipe_from_dict(tomllib.loads(text))
    assert recipe.target == "vllm==0.25.0" and "pre_projection" in recipe.dequantize


def test_python_example_runs(tmp_path, monkeypatch, capsys):
    (code,) = blocks("python")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "pre_projection dequantize" in out and (tmp_path / "work-py/fixed/repair_report.json").exists()
