"""The changed shards, one at a time: download the shard(s) a rewrite reads, write the rewritten shard,
keep a sparse copy of its header and scales (for doctor after) and delete the inputs no longer needed.
Once every check of the output has passed (and only then is a fork created), each rewritten shard is
pre-uploaded to every destination and deleted. Disk use peaks at the rewritten shards plus one
rewrite's inputs: the shards that do not change are never downloaded.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from repair.errors import BadInput
from repair.execute.writer import check_inputs, write_rewritten_shard
from repair.io.atomic import own_output, write_json
from repair.hub import client, publish
from repair.hub.errors import hub_call
from repair.hub.ranges import RemoteBytes
from repair.hub.source import SCALE_LEAVES, SMALL_LIMIT, RemoteSource, fetch_shard, relabeled
from repair.hub.spec import local_path
from repair.hub.verify import verified
from repair.io.checkpoint import CONFIG, HF_QUANT_CONFIG, Checkpoint, open_checkpoint
from repair.io.hashing import sha256_pinned
from repair.io.pins import PinnedFile, Pins, changed_input
from repair.io.safetensors import read_header
from repair.formats.modules import split_name
from repair.planning.model import Plan, ShardOp, ShardStep


@dataclass
class Streamed:
    """What the rewrite loop produced: per destination the commit operations, and file hashes."""

    ops: dict[str, list] = field(default_factory=dict)  # destination kind ("fork" | "pr") -> operations
    hashes: dict[str, dict] = field(default_factory=dict)  # as execute() records them
    downloaded: list[str] = field(default_factory=list)
    peak_bytes: int = 0
    written: list[str] = field(default_factory=list)  # rewritten shards in work/out, in plan order


def rewrite(plan: Plan, source: RemoteSource, work: Path, say: Callable[[str], None], jobs: int = 1) -> Streamed:
    """Every "rewrite" step of the plan, streamed (see the module docstring), `jobs` tensors computed at once; the
    written shards stay in work/out until `upload` sends them, so nothing reaches a destination before the output
    is checked."""
    steps = [s for s in plan.shards if s.op == ShardOp.REWRITE]
    located = plan.source.locate()
    needs = {s.name: _reads(s, located) for s in steps}
    left = Counter(n for names in needs.values() for n in names)
    out, staging = _folder(work / "out"), _folder(work / "dl")
    result, pins = Streamed(), plan.source.pins
    for step in steps:
        for name in sorted(needs[step.name] - source.complete):
            say(f"download {name} ({source.repo.files[name].size:,} bytes)")
            fetch_shard(source, name, staging, pins)
            result.downloaded.append(name)
        try:
            digest = write_rewritten_shard(pinned_plan(plan), step, out / step.name, jobs)
        except EOFError:  # an input got shorter while it was read: say which, as `fix` does
            check_inputs(plan)
            raise
        result.hashes[step.name] = {"source": _source_digest(source, step.name, pins), "output": digest}
        result.peak_bytes = max(result.peak_bytes, _bytes_in(work))
        sparse_copy(out / step.name, _folder(work / "after") / step.name)
        for name in needs[step.name]:
            left[name] -= 1
            if not left[name]:  # every byte read: its pin checked, then let go (a change meanwhile is exit 2)
                pins.release(source.folder / name)
                (source.folder / name).unlink(missing_ok=True)
        result.written.append(step.name)
    return result


def upload(result: Streamed, work: Path, dests: list[tuple[str, str]], say: Callable[[str], None]) -> None:
    """Pre-upload every rewritten shard to every destination (after every check of the output passed)."""
    from huggingface_hub import CommitOperationAdd

    result.ops = {kind: [] for kind, _ in dests}
    for name in result.written:
        _upload(CommitOperationAdd, name, work / "out" / name, dests, result, say)


def _upload(op_class, name: str, path: Path, dests, result: Streamed, say, pinned: PinnedFile | None = None,
            sha256: str | None = None) -> None:
    """`pinned`: an input, uploaded from the file its check read (a file object over that open file: the path may
    name another by now), and refused unless the bytes huggingface_hub hashed are the verified ones (`sha256`)."""
    lfs = True
    for kind, repo in dests:
        op = op_class(name, open(os.dup(pinned.fd), "rb") if pinned else str(path))
        say(f"upload {name} -> {repo}" + (" (pull request)" if kind == "pr" else ""))
        lfs = publish.preupload(repo, op, pr=kind == "pr") and lfs
        if pinned is not None and (op.upload_info.sha256.hex() != str(sha256).lower() or pinned.changed()):
            raise changed_input(path)  # uploaded, not committed: the fork's commit never names it
        result.ops[kind].append(op)
    if lfs:  # the commit names LFS files by sha256 only: the local copy can go now
        path.unlink(missing_ok=True)


def upload_unchanged(source: RemoteSource, names: list[str], work: Path, fork: str, result: Streamed, say) -> list:
    """Files the fork lacks and cannot copy server-side (a repo the server did not duplicate, or a
    pinned commit outside its history): downloaded and uploaded one at a time."""
    from huggingface_hub import CommitOperationAdd

    ops = []
    staging = _folder(work / "dl")
    for name in names:
        repo = source.repo
        with hub_call(f"{repo.label}/{name}", missing="listed at the pinned commit but not downloadable; re-run"):
            path = client.download(repo.repo, repo.sha, name, local_dir=staging)
        pinned = verified(repo, name, path)
        result.downloaded.append(name)
        if not repo.files[name].is_lfs:
            ops.append(CommitOperationAdd(name, pinned_bytes(pinned)))
            pinned.close()
            path.unlink()
            continue
        sink = Streamed(ops={"fork": []})
        _upload(CommitOperationAdd, name, path, [("fork", fork)], sink, say, pinned, repo.files[name].sha256)
        pinned.close()
        ops += sink.ops["fork"]
    return ops


def _reads(step: ShardStep, located: dict) -> set[str]:
    """The source shards a rewrite step reads (a dequantized weight's scales may sit in another shard)."""
    names = set()
    for t in step.tensors:
        if getattr(t, "source", "checkpoint") == "checkpoint":
            names.update(located[i][0].path.name for i in t.inputs if i in located)
    return names | {step.name}


def pinned_plan(plan: Plan) -> Plan:
    """The plan with each downloaded shard read through the handle its check read it by (io/pins.py)."""
    pins = plan.source.pins
    shards = tuple(replace(s, file=pins.get(s.path) or s.file) for s in plan.source.shards)
    return replace(plan, source=replace(plan.source, shards=shards))


def _source_digest(source: RemoteSource, name: str, pins) -> str:
    remote = source.repo.files[name]
    return remote.sha256 if remote.sha256 else sha256_pinned(pins.get(source.folder / name))


def sparse_copy(full: Path, dst: Path) -> None:
    """A stand-in for a written shard: its real size, header and scale tensors; holes elsewhere."""
    header = read_header(full)
    with open(full, "rb") as fin, open(dst, "wb") as fout:
        fout.write(fin.read(header.data_start))
        for t in header.tensors:
            if split_name(t.name)[1] in SCALE_LEAVES and t.nbytes:
                os.pwrite(fout.fileno(), os.pread(fin.fileno(), t.nbytes, t.start), t.start)
        fout.truncate(header.size)


def after_checkpoint(plan: Plan, source: RemoteSource, work: Path, label: str) -> Checkpoint:
    """The repaired checkpoint as doctor needs it: rewritten shards' stand-ins (written by the loop),
    unchanged shards' stand-ins linked from the source mirror, and the new small files."""
    after = _folder(work / "after")
    for step in plan.shards:
        if step.op == ShardOp.COPY_FILE and not (after / step.name).exists():
            _link_stub(source, step.name, after / step.name)
    for name in (CONFIG, HF_QUANT_CONFIG, plan.source.index_name):
        if not name or name in plan.removed_files:
            continue
        if name in plan.json_files:
            write_json(after / name, plan.json_files[name])
        elif plan.source.pins.get(source.folder / name) is not None:  # the bytes planned from, not the path's now
            (after / name).write_bytes(pinned_bytes(plan.source.pins.get(source.folder / name)))
    with relabeled(after, label), own_output(after, label):
        ckpt = open_checkpoint(after)
    held = RemoteBytes(source.bytes.client, lambda path: path.name)  # rewritten: their scales; linked: what the mirror held
    for step in plan.shards:
        held.hold(after / step.name, source.bytes.held(source.folder / step.name), whole=step.op == ShardOp.REWRITE)
    return replace(ckpt, byte_source=held)


def link_unchanged(plan: Plan, source: RemoteSource, work: Path) -> None:
    """Before any download replaces a mirror file: keep the unchanged shards' stand-ins for doctor after."""
    after = _folder(work / "after")
    for step in plan.shards:
        if step.op == ShardOp.COPY_FILE:
            _link_stub(source, step.name, after / step.name)


def _link_stub(source: RemoteSource, name: str, dst: Path) -> None:
    """A second name for a shard's sparse stand-in: a hard link, else a new stand-in from the fetched ranges
    (a plain copy would fill the holes: 512 MB of zeros for an untouched embedding shard)."""
    src = source.folder / name
    try:
        os.link(src, dst)
        return
    except OSError:
        pass
    header = read_header(src)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(fin.read(header.data_start))
        for start, end in source.fetched.get(name, []):
            os.pwrite(fout.fileno(), os.pread(fin.fileno(), end - start, start), start)
        fout.truncate(header.size)


def pinned_bytes(pinned: PinnedFile) -> bytes:
    """A small file's bytes as its check read them (kept), else read through its handle."""
    return pinned.content if pinned.content is not None else pinned.read_all()


def small_file(source: RemoteSource, name: str, work: Path, pins: Pins) -> bytes:
    """The bytes of a small file of the source at the pinned commit, as verified (in the mirror, or downloaded now)."""
    mirrored = pins.get(source.folder / name)
    if mirrored is not None:
        return pinned_bytes(mirrored)
    repo = source.repo
    if repo.files[name].size > SMALL_LIMIT:
        raise BadInput(f"{repo.label}/{name}: {repo.files[name].size:,} bytes is too large for a non-LFS file; the repo is broken")
    local_path(work / "small", name, repo.label)
    with hub_call(f"{repo.label}/{name}", missing="listed at the pinned commit but not downloadable; re-run"):
        path = client.download(repo.repo, repo.sha, name, local_dir=work / "small")
    pinned = verified(repo, name, path)
    try:
        return pinned_bytes(pinned)
    finally:
        pinned.close()


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _bytes_in(folder: Path) -> int:
    """Disk blocks in use below `folder` (sparse stand-ins count only what they hold)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
