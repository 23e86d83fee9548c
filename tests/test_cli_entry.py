"""The installed `ckpt-repair` script (it ends with os._exit) and the lazily loaded CLI.

Through the real script: exit codes 0 / 1 / 2 and output identical to an in-process run, a
written OUT that is complete, and the ordinary exit kept when a worker thread still runs.
In-process: header-only commands on a local folder import neither the Hub code nor other commands.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repair.cli import cli, main
from repair.demo.examples import TINY, write_assistant
from repair.execute.report import REPORT_NAME
from tests.conftest import run_captured, tree_hashes

SCRIPT = shutil.which("ckpt-repair", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    return write_assistant(tmp_path_factory.mktemp("entry") / "broken", TINY)


def script(*args) -> subprocess.CompletedProcess:
    assert SCRIPT, "the ckpt-repair console script is not installed next to this Python"
    return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, code", [
    (("inspect", "--json"), 0), (("doctor", "--json"), 0), (("doctor", "--strict", "--json"), 1), (("doctor", "--target", "vllm==0.22.1", "--tp", "2"), 1),
])
def test_script_exit_code_and_output_match_an_in_process_run(broken, capsys, args, code):
    command, *flags = args
    done = script(command, broken, *flags)
    assert done.returncode == code, done.stderr
    assert (done.returncode, done.stdout) == run_captured(capsys, command, broken, *flags)[:2]
    if "--json" in flags:
        json.loads(done.stdout)  # complete: it parses


def test_script_bad_input_exits_2_with_one_line(tmp_path):
    done = script("inspect", tmp_path / "missing")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "not a folder" in done.stderr and "Traceback" not in done.stderr


def test_script_fix_leaves_a_complete_output(broken, tmp_path):
    out = tmp_path / "out"
    done = script("fix", broken, "-o", out, "--quiet", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "written" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folder left
    report = json.loads((out / "repair_report.json").read_text())
    assert report == result["report"]
    assert {f["name"]: f["sha256"] for f in report["outputs"]} == {k: v for k, v in tree_hashes(out).items() if k != "repair_report.json"}


@pytest.mark.parametrize("worker", [False, True])
def test_fast_exit_runs_atexit_handlers_flushes_and_waits_for_worker_threads(tmp_path, worker):
    code = (
        "import atexit, sys, threading, time\n"
        "from pathlib import Path\n"
        "from repair.cli.console import leave\n"
        "folder = Path(sys.argv[1])\n"
        "atexit.register(lambda: (folder / 'atexit').write_text('ran'))\n"
        "if sys.argv[2] == 'worker':\n"
        "    threading.Thread(target=lambda: (time.sleep(0.3), (folder / 'worker').write_text('done'))).start()\n"
        "print('x' * 100_000, end='')\n"  # more than one buffer: the rest goes out at the flush
        "leave(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), "worker" if worker else "-"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (3, "x" * 100_000), done.stderr
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "worker").exists() == worker and (not worker or (tmp_path / "worker").read_text() == "done")


def test_a_ctrl_c_while_the_exit_waits_for_a_worker_is_one_line_and_exit_130(tmp_path):
    """The command has finished and printed; the exit waits for a worker thread. A Ctrl-C then (seen at load ~12: it
    landed in threading's own code) ends the wait with one line and exit 130, the printed output kept, no traceback."""
    code = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from repair.cli.console import leave\n"
        "threading.Thread(target=time.sleep, args=(30,)).start()\n"
        "print('summary')\n"
        "print('buffered', end='')\n"
        "Path(sys.argv[1]).write_text('leaving')\n"
        "leave(0)\n"
    )
    marker = tmp_path / "leaving"
    process = subprocess.Popen([sys.executable, "-c", code, str(marker)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=20)
    assert (process.returncode, out) == (130, "summary\nbuffered"), err
    assert "Traceback" not in err and err.strip().splitlines() == ["interrupted; the command had already finished"], err


def test_in_process_main_raises_system_exit(broken, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(["doctor", str(broken), "--strict"])
    assert stop.value.code == 1
    with pytest.raises(SystemExit) as stop:
        main(["inspect", str(tmp_path / "missing")])
    assert stop.value.code == 2


def test_help_lists_every_command_with_its_short_help(capsys):
    code, out, _ = run_captured(capsys, "--help")
    assert code == 0
    listed = dict(line.split(None, 1) for line in out.split("Commands:\n", 1)[1].strip().splitlines())
    commands = {name: cli.get_command(None, name) for name in cli.list_commands(None)}
    assert set(listed) == {"demo", "doctor", "fix", "hub", "inspect", "recipes", "serve", "unshard"} == set(commands)
    for name, command in commands.items():  # click shortens a long help to fit, ending it with "..."
        assert command.get_short_help_str(limit=1000).startswith(listed[name].strip().removesuffix("...")), name


def test_header_commands_on_a_local_folder_import_no_hub_code_or_other_commands(broken):
    code = (
        "import sys; from repair.cli import main\n"
        "for cmd in (['inspect', sys.argv[1], '--json'], ['doctor', sys.argv[1]]):\n"
        "    try: main(cmd)\n"
        "    except SystemExit: pass\n"
        "unwanted = ('huggingface_hub', 'repair.hub.source', 'repair.hub.client', 'torch', 'repair.cli.fix_cmd', 'repair.cli.hub_cmd')\n"
        "assert not [m for m in unwanted if m in sys.modules], [m for m in unwanted if m in sys.modules]\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(broken)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_fix_without_a_progress_bar_imports_no_progress_bar_library(broken, tmp_path):
    """`fix --quiet` (or stderr not a terminal) shows no bar: tqdm's import (~12 ms, its version lookup reads package
    metadata) is the start-up every fix would pay for nothing (BENCHMARKS, #27.3 fifth pass)."""
    code = (
        "import sys; from repair.cli import main\n"
        "try: main(['fix', sys.argv[1], '-o', sys.argv[2], '--quiet'])\n"
        "except SystemExit as exit: assert exit.code in (0, None), exit.code\n"
        "assert 'tqdm' not in sys.modules, 'tqdm was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(broken), str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / REPORT_NAME).is_file()


@pytest.mark.parametrize("export", ["broken_export", "ct_export"])
def test_fix_to_bf16_dequantizes_without_importing_torch(request, tmp_path, export):
    """All of `--target bf16` is dequantizing, which runs on numpy tables: no ~1-1.5 s torch import."""
    code = (
        "import sys; from repair.cli import main\n"
        "try: main(['fix', sys.argv[1], '-o', sys.argv[2], '--target', 'bf16', '--quiet'])\n"
        "except SystemExit as exit: assert exit.code in (0, None), exit.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    src, out = request.getfixturevalue(export), tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", code, str(src), str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (out / REPORT_NAME).is_file()
