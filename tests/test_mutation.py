"""#25's mutation property: SRC changed at a random moment while `fix`, `fix --tp 2` or `unshard` reads it.

The moment is the k-th read of file bytes (os.pread / preadv / copy_file_range), drawn from a seeded
generator, so a failure names (kind, file, k) and repeats.
Every run must end one of two ways:
- exit 0, its files bitwise equal to a clean run on the SRC it planned from (a change made before the
  file was pinned is what was planned from), and every output hash in its report equal to its file's;
- exit 2, with nothing published (no OUT, no temp folder left beside it).
CKPT_MUTATION_SEED=N explores another schedule.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_captured, run_cli, tree_hashes
from tests.test_pins import SHARDS, sha, swapped, tensor_ranges

SEED = int(os.environ.get("CKPT_MUTATION_SEED", "25"))
KINDS = ("replace", "rewrite", "truncate", "swap", "config")
RUNS_PER_KIND = 2


def mutate(kind: str, path: Path) -> None:
    """Change one input file the way another process might."""
    if kind == "replace":  # a new file, renamed over the old one (a download tool, `cp` to a temp name)
        new = path.parent.parent / f"{path.name}.new"
        new.write_bytes(swapped(path))
        os.replace(new, path)
    elif kind == "rewrite":  # same inode, same size, one tensor's bytes flipped
        a0, a1 = tensor_ranges(path)[0]
        with open(path, "r+b") as fh:
            fh.seek(a0)
            data = fh.read(a1 - a0)
            fh.seek(a0)
            fh.write(bytes(b ^ 0xFF for b in data))
    elif kind == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    elif kind == "swap":  # two same-size tensors exchanged in place
        data = swapped(path)
        with open(path, "r+b") as fh:
            fh.write(data)
    else:  # config: rewritten in place, one value changed
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, "torch_dtype": "float32"}, indent=1))


class Trigger:
    """Counts reads of file bytes (os.pread, os.preadv, os.copy_file_range: every way the tool reads an input's
    data); runs `action` just before the k-th one (k=0: never). Generic: it needs no hook in the tool."""

    CALLS = ("pread", "preadv", "copy_file_range")

    def __init__(self, k: int, action):
        self.k, self.action, self.count, self.fired = k, action, 0, False

    def install(self, monkeypatch) -> None:
        for name in self.CALLS:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, real):
        def counted(*args, **kwargs):
            self.count += 1
            if self.count == self.k and not self.fired:
                self.fired = True
                self.action()
            return real(*args, **kwargs)
        return counted


def outputs(folder: Path) -> dict[str, object]:
    """What must be bitwise equal: every file but the report; the manifest without the SRC path it records."""
    files = {n: h for n, h in tree_hashes(folder).items() if n not in ("repair_report.json", "tp_manifest.json")}
    if (folder / "tp_manifest.json").exists():
        files["tp_manifest.json"] = {k: v for k, v in json.loads((folder / "tp_manifest.json").read_text()).items() if k != "source"}
    return files


def run(monkeypatch, capsys, args: list, k: int = 0, action=None) -> tuple[int, str, Trigger]:
    trigger = Trigger(k, action)
    trigger.install(monkeypatch)
    try:
        code, _, err = run_captured(capsys, *args)
    finally:
        monkeypatch.undo()
    return code, err, trigger


COMMANDS = {
    "fix": (["--quiet"], ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"],
            "config.json"),
    "fix --tp 2": (["--tp", "2", "--quiet"], ["model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"], "config.json"),
    "unshard": ([], ["rank-0/model.safetensors", "rank-1/model.safetensors"], "rank-0/config.json"),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("mutation")
    src = write_assistant(base / "src", TINY, shards=SHARDS)
    assert run_cli("fix", src, "-o", base / "tp", "--tp", "2", "--quiet") == 0
    return {"fix": src, "fix --tp 2": src, "unshard": base / "tp"}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_src_changed_at_a_random_moment(command, pristine, tmp_path, monkeypatch, capsys):
    flags, shards, config = COMMANDS[command]
    verb = "unshard" if command == "unshard" else "fix"
    clean_src = tmp_path / "clean-src"
    shutil.copytree(pristine[command], clean_src)
    code, err, counted = run(monkeypatch, capsys, [verb, clean_src, "-o", tmp_path / "clean", *flags])
    assert code == 0, err
    reference, reads = outputs(tmp_path / "clean"), counted.count
    assert reads > 10
    rng = random.Random(f"{SEED}/{command}")
    outcomes = []
    for i, kind in enumerate(k for k in KINDS for _ in range(RUNS_PER_KIND)):
        name = config if kind == "config" else rng.choice(shards)
        k = rng.randint(1, reads)
        case = f"{command}: {kind} {name} at read {k} of {reads} (seed {SEED})"
        src, out = tmp_path / f"src-{i}", tmp_path / f"out-{i}"
        shutil.copytree(pristine[command], src)
        code, err, trigger = run(monkeypatch, capsys, [verb, src, "-o", out, *flags], k, lambda: mutate(kind, src / name))
        outcomes.append(code)
        assert_one_of_two_ends(capsys, (code, err, trigger), out, reference, [verb, src, "-o", tmp_path / f"again-{i}", *flags], case)
    assert 2 in outcomes, "no run saw its input change: the schedule is not testing anything"


def assert_one_of_two_ends(capsys, ran: tuple[int, str, Trigger], out: Path, reference: dict, rerun: list, case: str) -> None:
    """#25's property for one mutated run: exit 2 with nothing published and one line, or exit 0 with every report hash
    the file's and the output a clean run's (`reference`; where the change came before the input was pinned, the
    output of `rerun`, a clean run on the changed input, whose output folder is removed after)."""
    code, err, trigger = ran
    if code == 2:
        assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.partial")], case
        assert err.count("\n") <= 1 and err.strip(), case
        return
    assert code == 0, f"{case}: exit {code}: {err}"
    report = json.loads((out / "repair_report.json").read_text())
    assert all(sha(out / o["name"]) == o["sha256"] for o in report["outputs"]), case
    if trigger.fired:  # changed before it was pinned: the output is a clean run's on the changed input
        again = Path(rerun[rerun.index("-o") + 1])
        assert run_captured(capsys, *rerun)[0] == 0, case
        assert outputs(out) == outputs(again), case
        shutil.rmtree(again)
    else:
        assert outputs(out) == reference, case


def assert_changed_at_every_read(monkeypatch, capsys, tmp_path: Path, pristine: Path, args, kind: str, label: str) -> None:
    """#25's property with the input folder `pristine` (a copy of it per run) changed by `kind` at each read in turn:
    `args(folder, out)` is the command reading `folder`; at least one run must see the change (exit 2)."""
    clean = tmp_path / "clean-in"
    shutil.copytree(pristine, clean)
    code, err, counted = run(monkeypatch, capsys, args(clean, tmp_path / "clean"))
    assert code == 0, err
    reference, reads = outputs(tmp_path / "clean"), counted.count
    outcomes = []
    for k in range(1, reads + 1):
        folder, out = tmp_path / f"in-{k}", tmp_path / f"out-{k}"
        shutil.copytree(pristine, folder)
        ran = run(monkeypatch, capsys, args(folder, out), k, lambda: mutate(kind, folder / "model.safetensors"))
        outcomes.append(ran[0])
        rerun = args(folder, tmp_path / f"again-{k}")
        assert_one_of_two_ends(capsys, ran, out, reference, rerun, f"{label}: {kind} at read {k} of {reads}")
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(folder)
    assert 2 in outcomes, "no run saw its input change"
