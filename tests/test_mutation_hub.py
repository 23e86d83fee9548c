"""#25's mutation property for a Hub SRC: what "SRC" means there changes at a seeded moment of `hub fix`
(to a fork, through the local Hub) and of `fix owner/name -o OUT`.

SRC there is the pinned commit, read through local copies: the shards and configs downloaded into the run's
work folder (`hub fix`) or into huggingface_hub's cache (`fix -o OUT`). Those copies are replaced, rewritten
in place, truncated, get two same-size tensors swapped, or the config edited; or a new commit is pushed to
the repo on the server. The moment is the k-th read of file bytes (tests/test_mutation.py's Trigger), or of a whole file's download.
Every run must end one of two ways:
- exit 0, its files bitwise equal to a clean run's at the pinned sha, and every hash in its report (outputs
  and source files) equal to the file's;
- exit 2 in one line naming the file, with nothing published: no fork, no new commit, no OUT.
CKPT_MUTATION_SEED=N explores another schedule.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from repair.hub import client

from tests.conftest import run_captured, tree_hashes
from tests.hub_workflow_helpers import SHARDS, SRC, hub, hub_env  # noqa: F401 - fixtures
from tests.test_mutation import SEED, Trigger, mutate

KINDS = ("replace", "rewrite", "truncate", "swap", "config", "remote")
RUNS_PER_KIND = 1  # 6 runs of each command: a handful, about 12 s in all


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class HubTrigger(Trigger):
    """Also counts each download of a whole file as a moment: a copy changed while the next one downloads."""

    def install(self, monkeypatch) -> None:
        super().install(monkeypatch)
        monkeypatch.setattr(client, "download", self._wrap(client.download))


class Window(HubTrigger):
    """Counts moments like HubTrigger and records those at which `name`'s copy in the mirror is the whole download
    (not the stand-in holding its header, not yet let go): a hub fix's rewrite reads it then."""

    def __init__(self, name: str, places):
        super().__init__(0, None)
        self.name, self.places, self.whole, self.stand_in = name, places, [], None

    def _wrap(self, real):
        counted = super()._wrap(real)

        def probing(*args, **kwargs):
            found = self.places(self.name)
            inode = found[0].stat().st_ino if found else None
            self.stand_in = self.stand_in or inode
            if inode and inode != self.stand_in:  # the download has replaced the header-only stand-in
                self.whole.append(self.count + 1)
            return counted(*args, **kwargs)
        return probing


def run(capsys, args: list, k: int = 0, action=None, trigger: Trigger | None = None) -> tuple[int, str, Trigger]:
    trigger = trigger or HubTrigger(k, action)
    with pytest.MonkeyPatch.context() as mp:  # undone at once: the fixtures' environment (HF_ENDPOINT) stays
        trigger.install(mp)
        code, _, err = run_captured(capsys, *args)
    return code, err, trigger


def push_new_commit(hub) -> None:
    """Another writer commits to SRC while the run is going: a new config and a shard's tensors swapped."""
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    files = hub.repo_files(SRC)
    config = json.loads(files["config.json"])
    api.upload_file(path_or_fileobj=json.dumps({**config, "torch_dtype": "float32"}).encode(), path_in_repo="config.json",
                    repo_id=SRC, commit_message="someone else's change")


class Mutation:
    """One seeded change: `kind` applied to the copy of `name` wherever the run keeps it when the trigger fires
    (no copy there yet, or no longer: nothing changes, and the run must equal the clean one)."""

    def __init__(self, hub, kind: str, name: str, places):
        self.hub, self.kind, self.name, self.places = hub, kind, name, places

    def __call__(self) -> None:
        if self.kind == "remote":
            push_new_commit(self.hub)
            return
        for path in self.places(self.name):
            if path.is_file() and path.stat().st_size:
                mutate(self.kind, path)


def check(case: str, code: int, err: str, published, source: dict[str, bytes], reference: dict[str, bytes]) -> int:
    if code == 2:
        assert published() is None, f"{case}: exit 2 but something was published"
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, f"{case}: {err}"
        return code
    assert code == 0, f"{case}: exit {code}: {err}"
    files = published()
    report = json.loads(files["repair_report.json"])
    assert all(sha(files[o["name"]]) == o["sha256"] for o in report["outputs"]), f"{case}: an output hash is not its file's"
    assert all(sha(source[s["name"]]) == s["sha256"] for s in report["source"]["files"]), f"{case}: a source hash is not its file's"
    same = {n: sha(d) for n, d in files.items() if n != "repair_report.json"}
    assert same == {n: sha(d) for n, d in reference.items() if n != "repair_report.json"}, f"{case}: output differs from a clean run"
    return code


def revision(hub, pinned: str) -> str:
    """SRC by its branch, as a user names it, while main is still the clean run's commit; then by that sha."""
    return SRC if hub.head(SRC) == pinned else f"{SRC}@{pinned}"


def schedule(name: str, reads: int, files: list[str], window: list[int] | None = None):
    """(run, kind, file, moment) for each run; a shard's moment drawn from `window` when given."""
    rng = random.Random(f"{SEED}/{name}")
    for i, kind in enumerate(k for k in KINDS for _ in range(RUNS_PER_KIND)):
        shard = kind not in ("config", "remote")
        k = rng.choice(window) if shard and window else rng.randint(1, reads)
        yield i, kind, rng.choice(files) if shard else "config.json", k


def test_hub_fix_with_src_changed_at_a_random_moment(hub, broken, capsys, tmp_path):
    pinned = hub.add_repo(SRC, broken)
    source = hub.repo_files(SRC, pinned)
    work = tmp_path / "work"
    work.mkdir()
    places = lambda name: sorted(work.glob(f"ckpt-repair-hub-*/src/*/*/{name}"))  # noqa: E731 - the run's mirror
    counted = Window(SHARDS[1], places)  # the shards a fork's rewrite downloads: SHARDS[1:], read one after the other
    code, err, _ = run(capsys, ["hub", "fix", SRC, "--to", "alice/clean", "--workdir", work, "--quiet"], trigger=counted)
    assert code == 0, err
    reference, reads = hub.repo_files("alice/clean"), counted.count
    assert reads > 5 and counted.whole
    outcomes = []
    for i, kind, name, k in schedule("hub fix", reads, SHARDS[1:2], counted.whole):
        case = f"hub fix: {kind} {name} at read {k} of {reads} (seed {SEED})"
        fork, head = f"alice/fixed-{i}", hub.head(SRC)
        code, err, _ = run(capsys, ["hub", "fix", revision(hub, pinned), "--to", fork, "--workdir", work, "--quiet"], k,
                           Mutation(hub, kind, name, places))
        published = lambda: hub.repo_files(fork) if hub.store.get(fork) else None  # noqa: E731
        outcomes.append(check(case, code, err, published, source, reference))
        assert not [c for c in HfApi(endpoint=hub.endpoint).list_repo_commits(SRC) if c.title.startswith("ckpt-repair")], case
        assert hub.head(SRC) == head or kind == "remote", case
    assert 2 in outcomes, "no run saw its input change: the schedule is not testing anything"


def test_fix_of_a_hub_id_with_its_cached_copy_changed_at_a_random_moment(hub, broken, capsys, tmp_path, monkeypatch):
    pinned = hub.add_repo(SRC, broken)
    source = hub.repo_files(SRC, pinned)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache-clean"))
    code, err, counted = run(capsys, ["fix", SRC, "-o", tmp_path / "clean", "--quiet"])
    assert code == 0, err
    reference, reads = {n: (tmp_path / "clean" / n).read_bytes() for n in tree_hashes(tmp_path / "clean")}, counted.count
    assert reads > 5
    outcomes = []
    for i, kind, name, k in schedule("fix", reads, SHARDS):
        case = f"fix owner/name: {kind} {name} at read {k} of {reads} (seed {SEED})"
        cache, out = tmp_path / f"cache-{i}", tmp_path / f"out-{i}"
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))  # each run downloads afresh: no run inherits a changed copy
        places = lambda n, cache=cache: sorted(cache.glob(f"models--*/snapshots/*/{n}"))  # noqa: E731
        code, err, _ = run(capsys, ["fix", revision(hub, pinned), "-o", out, "--quiet"], k, Mutation(hub, kind, name, places))
        published = lambda: {n: (out / n).read_bytes() for n in tree_hashes(out)} if out.exists() else None  # noqa: E731
        outcomes.append(check(case, code, err, published, source, reference))
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}.partial")], case
    assert 2 in outcomes, "no run saw its input change: the schedule is not testing anything"


class AtDownload(HubTrigger):
    """Fires at the k-th whole-file download only: the moment between one file's check and the next file's."""

    CALLS = ()


@pytest.mark.parametrize("kind", ["rewrite", "swap", "replace", "truncate"])
def test_a_cached_copy_changed_after_its_check_is_never_used(hub, broken, capsys, tmp_path, monkeypatch, kind):
    """`fix owner/name -o OUT` checked each download's sha256 by path, then opened them all again to plan: a copy
    changed in the cache in between (here: the first shard, while the last file downloads) built OUT with exit 0."""
    hub.add_repo(SRC, broken)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    downloads = run(capsys, ["fix", SRC, "-o", tmp_path / "clean", "--quiet"], trigger=AtDownload(0, None))[2].count
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache-2"))
    trigger = AtDownload(downloads, lambda: mutate(kind, next((tmp_path / "cache-2").glob(f"models--*/snapshots/*/{SHARDS[1]}"))))
    code, err, _ = run(capsys, ["fix", SRC, "-o", tmp_path / "out", "--quiet"], trigger=trigger)
    assert trigger.fired and code == 2 and SHARDS[1] in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["rewrite", "replace", "config"])
def test_hub_fix_refuses_an_original_changed_while_it_runs(hub, broken_export, original_model, capsys, tmp_path, kind):
    """`hub fix --original` pinned the local original but never checked it: changed after it was read (here: as the
    output is checked), the fork was made and committed with exit 0. Now: exit 2 naming it, no fork."""
    import repair.hub.workflow as workflow

    hub.add_repo(SRC, broken_export)
    orig = tmp_path / "orig"
    shutil.copytree(original_model, orig)
    name = "config.json" if kind == "config" else sorted(p.name for p in orig.glob("*.safetensors"))[0]
    real = workflow._refuse_unclean

    def then_change(*args):
        mutate(kind, orig / name)
        return real(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(workflow, "_refuse_unclean", then_change)
        code, _, err = run_captured(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--original", orig, "--quiet")
    assert code == 2 and name in err and "--original" in err and len(err.strip().splitlines()) == 1, err
    assert hub.store.get("alice/fixed") is None
