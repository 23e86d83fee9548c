"""A corpus of malformed checkpoints: one small builder per defect, for the reliability tests.

Each builder gets an empty work folder, writes the tiny broken NVFP4 assistant there (the
project's own codec, no ModelOpt import) and breaks one thing the way real downloads and
exports break. It returns a Case: the folder to give `fix`, a substring the one-line error
must contain, and for the output-side cases the OUT to use. To look at every case by hand:

    python -m tools.malformed /tmp/corpus      # then: ckpt-repair fix /tmp/corpus/<case>/src -o ...
"""

from __future__ import annotations

import json
import pickle
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SHARDS = [["pre_projection"], ["post_projection"]]  # -> model-00001..3-of-00003, pre in 2, post in 3
ONE = "model.safetensors"
SHARD_1, SHARD_2, SHARD_3 = (f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Case:
    src: Path
    expect: str  # substring of the one error line (or of stdout when exit_code is 0)
    out: Path | None = None  # None: <work>/out
    exit_code: int = 2


CASES: dict[str, Callable[[Path], Case]] = {}


def case(fn: Callable[[Path], Case]) -> Callable[[Path], Case]:
    CASES[fn.__name__] = fn
    return fn


def build(name: str, work: Path) -> Case:
    """Build case `name` inside the (empty or missing) folder `work`."""
    Path(work).mkdir(parents=True, exist_ok=True)
    return CASES[name](Path(work))


# --- helpers -------------------------------------------------------------------------------------

def assistant(work: Path, sharded: bool = False, broken: bool = True) -> Path:
    """The healthy starting point: the tiny broken (fixable) assistant in <work>/src."""
    from repair.examples import TINY, write_assistant

    return write_assistant(work / "src", TINY, broken=broken, shards=SHARDS if sharded else None)


def _split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(path: Path, header_json: bytes, data: bytes) -> None:
    header_json += b" " * (-len(header_json) % 8)
    path.write_bytes(struct.pack("<Q", len(header_json)) + header_json + data)


def _edit_header(path: Path, edit: Callable[[dict], None]) -> None:
    header, data = _split(path)
    edit(header)
    _write(path, json.dumps(header).encode(), data)


def edit_tensors(path: Path, edit: Callable[[dict], None]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    content = json.loads(path.read_text())
    edit(content)
    path.write_text(json.dumps(content, indent=2))


def _header_len(path: Path) -> int:
    with open(path, "rb") as fh:
        return struct.unpack("<Q", fh.read(8))[0]


def _cut(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def _scale_2(value: float, says: str) -> Callable[[Path], Case]:
    def builder(work: Path) -> Case:
        import torch

        src = assistant(work)
        edit_tensors(src / ONE, lambda t: t.update({"pre_projection.weight_scale_2": torch.tensor(value)}))
        return Case(src, f"pre_projection.weight_scale_2: global scale {says}")
    return builder


# --- the shard file itself -----------------------------------------------------------------------

@case
def empty_shard(work):  # a download that never started: 0 bytes
    src = assistant(work)
    _cut(src / ONE, 0)
    return Case(src, f"{ONE}: file is 0 bytes, too short")


@case
def truncated_in_header(work):
    src = assistant(work)
    _cut(src / ONE, 8 + 1000)
    return Case(src, f"{ONE}: header length {_header_len(src / ONE)} runs past the end of the 1008-byte file")


@case
def truncated_shard(work):  # a download cut off inside the tensor data
    src = assistant(work)
    size = (src / ONE).stat().st_size * 6 // 10
    _cut(src / ONE, size)
    return Case(src, f"run past the {size - 8 - _header_len(src / ONE)}-byte data section; the file is truncated")


@case
def header_length_beyond_file(work):
    src = assistant(work)
    raw = (src / ONE).read_bytes()
    (src / ONE).write_bytes(struct.pack("<Q", len(raw) * 2) + raw[8:])
    return Case(src, f"header length {len(raw) * 2} runs past the end of the {len(raw)}-byte file")


@case
def header_length_absurd(work):  # e.g. a pickle or HTML error page saved as .safetensors
    src = assistant(work)
    (src / ONE).write_bytes(b"<!DOCTYPE html><html>rate limited</html>" * 4)
    return Case(src, "is over the 100000000-byte limit")


@case
def header_not_json(work):
    src = assistant(work)
    raw = bytearray((src / ONE).read_bytes())
    raw[8:40] = b"\xff" * 32
    (src / ONE).write_bytes(bytes(raw))
    return Case(src, f"{ONE}: header is not valid JSON")


@case
def duplicate_name_in_header(work):  # json.loads would silently keep the last one
    src = assistant(work)
    header, data = _split(src / ONE)
    text = json.dumps(header)[:-1] + ', "pre_projection.weight": ' + json.dumps(header["post_projection.weight"]) + "}"
    _write(src / ONE, text.encode(), data)
    return Case(src, "pre_projection.weight: name appears twice in the header")


@case
def offsets_out_of_range(work):
    src = assistant(work)
    _edit_header(src / ONE, lambda h: h["model.norm.weight"].update(data_offsets=[10**9, 10**9 + 128]))
    return Case(src, "model.norm.weight: data_offsets [1000000000, 1000000128] run past the")


@case
def offsets_overlap(work):
    src = assistant(work)
    entry = "model.layers.0.input_layernorm.weight"
    _edit_header(src / ONE, lambda h: h[entry].update(data_offsets=[o - 64 for o in h[entry]["data_offsets"]]))
    return Case(src, f"{entry}: data range overlaps the previous tensor")


@case
def offsets_leave_gap(work):  # an entry lost from the header: its bytes are a hole nobody covers
    src = assistant(work)
    _edit_header(src / ONE, lambda h: h.pop("model.layers.0.input_layernorm.weight"))
    return Case(src, "model.layers.0.layer_scalar: data range leaves a gap before it")


@case
def trailing_bytes(work):  # data past the last tensor: not what any writer produces
    src = assistant(work)
    with open(src / ONE, "ab") as fh:
        fh.write(b"\0" * 16)
    return Case(src, f"{ONE}: 16 bytes after the last tensor")


@case
def dtype_shape_mismatch(work):
    src = assistant(work)
    _edit_header(src / ONE, lambda h: h["model.norm.weight"].update(shape=[65]))
    return Case(src, "model.norm.weight: BF16 [65] needs 130 bytes but data_offsets span 128")


@case
def unknown_dtype(work):  # e.g. an MXFP4 export's E8M0 scales
    src = assistant(work)
    _edit_header(src / ONE, lambda h: h["pre_projection.weight_scale"].update(dtype="F8_E8M0"))
    return Case(src, "pre_projection.weight_scale: unknown dtype 'F8_E8M0'")


@case
def bad_metadata(work):
    src = assistant(work)
    _edit_header(src / ONE, lambda h: h.update(__metadata__={"format": 1}))
    return Case(src, "__metadata__ must map strings to strings")


# --- the folder: shards, index, links ------------------------------------------------------------

@case
def duplicate_across_shards(work):  # a stale copy of a shard left beside the new one
    src = assistant(work, sharded=True)
    (src / "model-00002-of-00003.old.safetensors").write_bytes((src / SHARD_2).read_bytes())
    return Case(src, "is stored in both model-00002-of-00003.old.safetensors and model-00002-of-00003.safetensors")


@case
def index_names_missing_shard(work):
    src = assistant(work, sharded=True)
    (src / SHARD_3).unlink()
    return Case(src, f"{SHARD_3}: named in the index but missing; download the missing shard")


@case
def index_missing_tensor(work):
    src = assistant(work, sharded=True)
    _edit_json(src / INDEX, lambda i: i["weight_map"].pop("post_projection.weight_scale"))
    return Case(src, f"post_projection.weight_scale is in {SHARD_3} but the index does not list it")


@case
def index_lists_unstored_tensor(work):
    src = assistant(work, sharded=True)
    _edit_json(src / INDEX, lambda i: i["weight_map"].update({"lm_head.weight": SHARD_1}))
    return Case(src, "tensor lm_head.weight is listed in the index but not stored")


@case
def index_invalid_json(work):
    src = assistant(work, sharded=True)
    (src / INDEX).write_text('{"weight_map": {')
    return Case(src, f"{INDEX}: invalid JSON at line 1")


@case
def index_without_weight_map(work):
    src = assistant(work, sharded=True)
    _edit_json(src / INDEX, lambda i: i.pop("weight_map"))
    return Case(src, f"{INDEX}: missing or invalid 'weight_map'")


@case
def index_bad_metadata(work):
    src = assistant(work, sharded=True)
    _edit_json(src / INDEX, lambda i: i.update(metadata=[["total_size", 1]]))
    return Case(src, f"{INDEX}: 'metadata' is not an object")


@case
def symlink_outside(work):
    src = assistant(work)
    (work / "elsewhere.json").write_text("{}")
    (src / "tokenizer.json").symlink_to(work / "elsewhere.json")
    return Case(src, "tokenizer.json: symlink points outside the checkpoint folder")


@case
def symlink_dangling(work):
    src = assistant(work)
    (src / "tokenizer.json").symlink_to(src / "gone.json")
    return Case(src, "tokenizer.json: symlink is broken")


@case
def pickle_checkpoint(work):  # never unpickled: loading a pickle can run code
    src = work / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": [0.0]}))
    return Case(src, "pytorch_model.bin: pickle checkpoints are refused (loading them can run code); convert to safetensors")


@case
def no_safetensors(work):
    src = work / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    return Case(src, "no .safetensors files found")


@case
def src_not_a_folder(work):
    src = assistant(work)
    return Case(src / ONE, f"{ONE}: not a folder")


# --- the config files ----------------------------------------------------------------------------

@case
def config_invalid_json(work):
    src = assistant(work)
    (src / "config.json").write_text((src / "config.json").read_text()[:200])
    return Case(src, "config.json: invalid JSON at line")


@case
def config_not_an_object(work):
    src = assistant(work)
    (src / "config.json").write_text("[]")
    return Case(src, "config.json: expected a JSON object, found list")


@case
def hf_quant_invalid_json(work):
    src = assistant(work)
    (src / "hf_quant_config.json").write_bytes(b"\xef\xbb\xbf{\x00")
    return Case(src, "hf_quant_config.json: ")


@case
def hf_quant_missing_quantization(work):
    src = assistant(work)
    _edit_json(src / "hf_quant_config.json", lambda c: c.pop("quantization"))
    return Case(src, "hf_quant_config.json: missing the 'quantization' object")


@case
def missing_quant_algo(work):
    src = assistant(work)
    _edit_json(src / "config.json", lambda c: c["quantization_config"].pop("quant_algo"))
    _edit_json(src / "hf_quant_config.json", lambda c: c["quantization"].pop("quant_algo"))
    return Case(src, "config.json: quantization_config has no quant_algo")


@case
def unknown_quant_algo(work):
    src = assistant(work)
    _edit_json(src / "config.json", lambda c: c["quantization_config"].update(quant_algo="W4A8_AWQ"))
    _edit_json(src / "hf_quant_config.json", lambda c: c["quantization"].update(quant_algo="W4A8_AWQ"))
    return Case(src, "config.json: quant_algo 'W4A8_AWQ' is not supported")


@case
def quant_algos_disagree(work):
    src = assistant(work)
    _edit_json(src / "hf_quant_config.json", lambda c: c["quantization"].update(quant_algo="FP8"))
    return Case(src, "hf_quant_config.json: quant_algo 'FP8' is not supported")


@case
def ignore_not_a_list(work):
    src = assistant(work)
    _edit_json(src / "config.json", lambda c: c["quantization_config"].update(ignore="lm_head"))
    return Case(src, "quantization_config.ignore must be a list of module names")


# --- packed modules the repair touches -----------------------------------------------------------

@case
def missing_weight_scale(work):
    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.pop("pre_projection.weight_scale"))
    return Case(src, "pre_projection.weight: packed NVFP4 weight without its weight_scale")


@case
def missing_weight_scale_2(work):
    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.pop("pre_projection.weight_scale_2"))
    return Case(src, "pre_projection.weight: packed NVFP4 weight without its weight_scale_2")


@case
def weight_scale_wrong_shape(work):
    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.update({"pre_projection.weight_scale": t["pre_projection.weight_scale"].reshape(32, 24)}))
    return Case(src, "pre_projection.weight_scale: F8_E4M3 [32, 24] does not fit packed weight [64, 96]")


@case
def odd_packed_dims(work):
    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.update({"pre_projection.weight": t["pre_projection.weight"][:, :95].contiguous()}))
    return Case(src, "pre_projection.weight: packed shape [64, 95] unpacks to 190 input columns, not a multiple of the 16")


@case
def nan_block_scales(work):
    src = assistant(work)

    def poison(tensors):
        import torch

        tensors["pre_projection.weight_scale"].view(torch.uint8)[0, :3] = 0x7F  # E4M3 NaN
    edit_tensors(src / ONE, poison)
    return Case(src, "pre_projection.weight_scale: 3 NaN and 0 negative block scales")


for _name, _value, _says in (("scale_2_nan", float("nan"), "is NaN"), ("scale_2_inf", float("inf"), "is infinite"),
                             ("scale_2_zero", 0.0, "is 0.0 (must be > 0)"), ("scale_2_negative", -0.25, "is -0.25 (must be > 0)")):
    CASES[_name] = _scale_2(_value, _says)


# --- the output ----------------------------------------------------------------------------------

@case
def out_inside_src(work):
    src = assistant(work)
    return Case(src, "output is inside the input folder", out=src / "fixed")


@case
def out_exists(work):
    src = assistant(work)
    (work / "out").mkdir()
    (work / "out" / "notes.txt").write_text("mine")
    return Case(src, "out: already exists; choose a new folder or pass --overwrite")


@case
def out_parent_missing(work):
    src = assistant(work)
    return Case(src, "parent folder does not exist; create it first", out=work / "no" / "out")


@case
def already_repaired(work):  # the fixed (or correctly exported) checkpoint: a no-op that says so
    return Case(assistant(work, broken=False), "nothing to repair; it is already fixed. Nothing written.", exit_code=0)


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "malformed-corpus")
    for name in CASES:
        built = build(name, root / name)
        print(f"{name:32} {built.src}  expect: {built.expect}")
