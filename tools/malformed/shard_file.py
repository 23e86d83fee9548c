"""Cases that break the one safetensors file itself: truncation, the header's length and JSON, its
data_offsets, dtypes and __metadata__.
"""

from __future__ import annotations

import json
import struct

from .edits import ONE, _cut, _edit_header, _header_len, _split, _write, assistant
from .registry import Case, case


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
def unknown_dtype(work):  # a dtype this tool does not read (F8_E8M0, DeepSeek-V4's ue8m0 scales, it now reads)
    src = assistant(work)
    _edit_header(src / ONE, lambda h: h["pre_projection.weight_scale"].update(dtype="F6_E2M3"))
    return Case(src, "pre_projection.weight_scale: unknown dtype 'F6_E2M3'")


@case
def bad_metadata(work):
    src = assistant(work)
    _edit_header(src / ONE, lambda h: h.update(__metadata__={"format": 1}))
    return Case(src, "__metadata__ must map strings to strings")
