"""tp_manifest.json as `fix --tp` writes it: what each rank holds, and how to rebuild the standard output byte for
byte (`unshard` reads it back, as hostile data, through tp/manifest.py)."""

from __future__ import annotations

from pathlib import Path

from repair.io.atomic import json_text
from repair.io.names import path_text
from repair.io.ranges import source_of
from repair.io.shard_writer import OutTensor, encode_header
from repair.planning.model import ShardOp
from repair.tp.manifest import FORMAT, RANK_FILE, rank_folder
from repair.tp.plan import VOCAB_PADDING, TpPlan

VOCAB_NOTE = (f"vLLM pads the vocabulary to a multiple of {VOCAB_PADDING} and gives each rank padded/tp rows; only real rows "
              "are stored, so rank r holds rows [r*padded/tp, min((r+1)*padded/tp, vocab)) and the last rank(s) may be short "
              "(vLLM zero-fills its padding rows at load)")


def index_name(plan) -> str | None:
    """The standard output's index, which no rank folder gets (it names shards a rank does not have)."""
    name = plan.source.index_name
    return name if name and (name in plan.json_files or name in plan.copied_files) else None


def manifest(tpp: TpPlan, rank_hashes: dict[int, dict[str, str]], tmp: Path) -> dict:
    """What each rank holds (each file's sha256 and size, as written in `tmp`: `unshard` refuses a file of another
    size by a stat, before reading it), and how to rebuild the standard output byte for byte."""
    plan = tpp.plan
    return {
        "format": FORMAT, "version": 1, "tp": tpp.tp, "source": path_text(plan.source.root),
        "parallel_plan": tpp.source, "vocab_padding": VOCAB_NOTE,
        "ranks": [{"rank": r, "folder": rank_folder(r), "files": files,
                   "sizes": {n: tmp.joinpath(rank_folder(r), *n.split("/")).stat().st_size for n in files}}
                  for r, files in sorted(rank_hashes.items())],
        "standard": {"shards": [_shard_entry(plan, s) for s in plan.shards],
                     "files": sorted(n for n in rank_hashes[0] if n != RANK_FILE), "index": _index_entry(plan)},
        "tensors": {t.step.out.name: t.entry(tpp.tp) for t in tpp.tensors},
    }


def _shard_entry(plan, step) -> dict:
    """A standard shard: its tensors in order and metadata; a copied shard whose header is not canonical keeps it verbatim."""
    entry = {"name": step.name, "metadata": step.metadata, "tensors": [t.out.name for t in step.tensors]}
    if step.op == ShardOp.COPY_FILE:
        shard = next(s for s in plan.source.shards if s.path.name == step.name)
        raw = bytes(source_of(shard).read(0, shard.data_start))  # the header as pinned at plan time
        canonical = encode_header([OutTensor(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors], step.metadata)
        if raw != canonical:
            entry["header"] = raw[8:].decode("utf-8")
    return entry


def _index_entry(plan) -> dict | None:
    name = index_name(plan)
    if name is None:
        return None
    pinned = None if name in plan.json_files else plan.source.input(name)
    text = json_text(plan.json_files[name]) if pinned is None else bytes(pinned.read(0, pinned.size)).decode("utf-8")
    return {"name": name, "text": text}
