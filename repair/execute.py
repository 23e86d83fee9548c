"""Plan -> files. Streams tensor bytes, builds the output in a temporary folder beside OUT and
renames it into place only when every file is written and checked. The input is only read.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from repair.errors import OutputError
from repair.io.hashing import copy_file_hashed, sha256_file
from repair.io.safetensors import OutTensor, ShardWriter, read_bytes, read_header
from repair.plan import Plan, ShardStep, TensorStep
from repair.report import REPORT_NAME, build_report

PARTIAL_TAG = ".partial-"


@dataclass(frozen=True)
class Result:
    """What a run produced: the output folder and the report written into it."""

    out: Path
    report: dict


def check_output(src: Path, out: Path, overwrite: bool) -> None:
    """Refuse outputs that would touch the input or silently replace something."""
    src_r, out_r = src.resolve(), out.resolve()
    if out_r == src_r or out_r.is_relative_to(src_r):
        raise OutputError(f"{out}: output is inside the input folder {src}; choose a folder outside it")
    if src_r.is_relative_to(out_r):
        raise OutputError(f"{out}: output folder contains the input {src}; choose another folder")
    if out.exists() and not overwrite:
        raise OutputError(f"{out}: already exists; choose a new folder or pass --overwrite")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: exists and is not a folder; remove it or choose another name")
    if not out.parent.is_dir():
        raise OutputError(f"{out.parent}: parent folder does not exist; create it first")


def execute(plan: Plan, out: Path, *, overwrite: bool = False, progress: bool | None = None, options: dict | None = None) -> Result:
    """Write the planned checkpoint to `out` atomically and return its report."""
    out = Path(out)
    check_output(plan.source.root, out, overwrite)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{PARTIAL_TAG}{os.getpid()}-", dir=out.parent))
    try:
        with _progress(plan, progress) as bar:
            hashes = _write_all(plan, tmp, bar)
        report = build_report(plan, hashes, options or {})
        _write_json(tmp / REPORT_NAME, report)
        _self_check(plan, tmp)
        _move_into_place(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise OutputError(f"{out}: disk full while writing; free space (about {plan.source.total_bytes} bytes needed) and re-run") from None
        raise OutputError(f"{out}: cannot write ({exc.strerror}); check the folder and permissions") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Result(out, report)


def _progress(plan: Plan, enabled: bool | None) -> tqdm:
    total = sum(s.size for s in plan.source.shards)
    show = sys.stderr.isatty() if enabled is None else enabled
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="repair", disable=not show, leave=False)


def _write_all(plan: Plan, tmp: Path, bar: tqdm) -> dict[str, dict[str, str]]:
    """Write every output file; return {file: {"source": sha256, "output": sha256}}."""
    root = plan.source.root
    hashes: dict[str, dict[str, str]] = {}
    for step in plan.shards:
        src = root / step.name
        if step.op == "copy_file":
            digest = copy_file_hashed(src, tmp / step.name)
            hashes[step.name] = {"source": digest, "output": digest}
        else:
            hashes[step.name] = {"source": sha256_file(src), "output": _rewrite(plan, step, tmp / step.name)}
        bar.update((root / step.name).stat().st_size)
    for name in plan.copied_files:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        digest = copy_file_hashed(root / name, tmp / name)
        hashes[name] = {"source": digest, "output": digest}
    for name, content in plan.json_files.items():
        source = root / name
        hashes[name] = {"source": sha256_file(source) if source.exists() else None, "output": _write_json(tmp / name, content)}
    return hashes


def _rewrite(plan: Plan, step: ShardStep, dst: Path) -> str:
    """Stream one changed shard: copy untouched tensors' bytes, compute the changed ones."""
    located = plan.source.locate()
    header = [OutTensor(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors]
    with ShardWriter(dst, header, step.metadata) as writer:
        for t in step.tensors:
            if t.op == "copy":
                shard, info = located[t.inputs[0]]
                writer.copy(t.out.name, shard.path, info)
            else:
                writer.write(t.out.name, _compute(t, located))
    return writer.digest.hexdigest()


def _compute(step: TensorStep, located: dict) -> memoryview:
    """Produce a changed tensor's bytes; torch is imported only here."""
    from repair.codec import nvfp4
    from repair.io import tensors

    inputs = []
    for name in step.inputs:
        shard, info = located[name]
        inputs.append(tensors.from_bytes(read_bytes(shard.path, info), info))
    if step.op == "dequantize":
        packed, scale, scale_2 = inputs
        result = nvfp4.dequantize(packed, scale, scale_2, tensors.TORCH_DTYPE[step.out.dtype])
        return tensors.to_bytes(result)
    raise AssertionError(f"unknown tensor op {step.op}")


def _write_json(path: Path, content: dict) -> str:
    """Write a small JSON file (2-space indent, key order kept, trailing newline); return its sha256."""
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return sha256_file(path)


def _self_check(plan: Plan, tmp: Path) -> None:
    """Re-open every written shard header and compare it with the plan before publishing."""
    for step in plan.shards:
        header = read_header(tmp / step.name)
        got = [(t.name, t.dtype, t.shape) for t in header.tensors]
        want = [(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors]
        if got != want:
            raise AssertionError(f"{tmp / step.name}: written header does not match the plan")


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished folder to OUT; an existing OUT (with --overwrite) is replaced only now."""
    if not out.exists():
        os.rename(tmp, out)
        return
    old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
