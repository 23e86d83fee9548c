"""Re-fixing an earlier output, config files that disagree on input, and click's usage errors."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_cli, tree_hashes


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_refixing_an_earlier_output_records_true_hashes(tmp_path):
    """The input's repair_report.json describes the earlier run: it is not copied, so the new report never lists
    itself (with the old report's sha256, as it did); every sha256 it records is the file's."""
    src = write_assistant(tmp_path / "src", TINY)
    first, second = tmp_path / "first", tmp_path / "second"
    assert run_cli("fix", src, "-o", first, "--quiet") == 0
    before = tree_hashes(first)
    assert run_cli("fix", first, "-o", second, "--target", "bf16", "--quiet") == 0
    report = json.loads((second / "repair_report.json").read_text())
    outputs = {o["name"]: o["sha256"] for o in report["outputs"]}
    assert "repair_report.json" not in outputs
    assert outputs == {name: sha256(second / name) for name in outputs}
    assert sorted(p.name for p in second.iterdir()) == sorted([*outputs, "repair_report.json"])
    assert tree_hashes(first) == before


def test_fix_for_a_target_writes_config_files_that_agree(tmp_path, capsys):
    src = write_assistant(tmp_path / "src", TINY)
    hf_path = src / "hf_quant_config.json"
    hf = json.loads(hf_path.read_text())
    hf["quantization"]["exclude_modules"] = []  # config.json's ignore has lm_head: the files disagree
    hf_path.write_text(json.dumps(hf, indent=2))
    out = tmp_path / "fixed"
    assert run_cli("fix", src, "-o", out, "--target", "vllm==0.25.0") == 0
    assert "hf_quant_config.json exclude_modules made equal to config.json ignore" in capsys.readouterr().out
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    exclude = json.loads((out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert ignore == exclude and "lm_head" in ignore and "pre_projection" in ignore
    assert run_cli("doctor", out, "--target", "vllm==0.25.0", "--strict", "--json") == 0
    assert "configs-disagree" not in capsys.readouterr().out


def test_a_usage_error_is_one_line_and_exit_2(tmp_path):
    for args, says in ((["fix"], "error: Missing argument 'SRC'; see `ckpt-repair fix --help`"),
                       (["fix", str(tmp_path), "-o", str(tmp_path / "o"), "--tp", "0"], "error: Invalid value for '--tp'"),
                       (["no-such-command"], "error: No such command 'no-such-command'; see `ckpt-repair --help`")):
        done = subprocess.run([sys.executable, "-m", "repair", *args], capture_output=True, text=True)
        assert done.returncode == 2 and done.stdout == ""
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(says), done.stderr
