"""ModelOpt's 3-D NVFP4 experts (gpt-oss, Llama4: `X` uint8 [E, in/2, out], `X_weight_scale` [E, in/16, out], one
float32 global scale) dequantize expert by expert through the 2-D path's table, into one preallocated output.

The oracles: the layout's definition (each expert is its [out, in] Linear, quantized transposed: the 2-D table path on
the transposed expert, itself checked against NVFP4QTensor in test_codec_nvfp4.py; it was the executor's only way
before), and ModelOpt's own NVFP4QTensor.dequantize on the whole 3-D tensor, transposed as its export transposes it.
The executor's run of it imports no torch and holds the output, one expert's packed bytes and chunk-sized temporaries,
not float32 products; with --jobs 1 it holds one result at a time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repair.codec import dequant_table
from tests.test_bmm_experts_nvfp4 import gpt_oss_export
from tools.bench.experts3d import write_experts, write_linears

TORCH = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
SIGNED = {"BF16": np.int16, "F16": np.int16, "F32": np.int32}


def per_expert_linear(packed: np.ndarray, scale: np.ndarray, scale_2: float, dtype: str, divisor: bool) -> np.ndarray:
    """Each expert as its [out, in] Linear through the 2-D table, transposed back and stacked (the path before)."""
    return np.stack([dequant_table.dequantize(np.ascontiguousarray(p.T), np.ascontiguousarray(s.T), scale_2, dtype, divisor).T
                     for p, s in zip(packed, scale)])


def modelopt_3d(packed: np.ndarray, scale: np.ndarray, scale_2: float, dtype: str) -> np.ndarray:
    """NVFP4QTensor.dequantize of the [E, out, in/2] tensor ModelOpt quantized, transposed back to [E, in, out]."""
    from tools.modelopt_export import modelopt_dequantize

    p = torch.from_numpy(packed).transpose(1, 2).contiguous()
    s = torch.from_numpy(scale).view(torch.float8_e4m3fn).transpose(1, 2).contiguous()
    values = modelopt_dequantize(p, s, torch.tensor(scale_2, dtype=torch.float32), TORCH[dtype]).transpose(1, 2)
    return values.contiguous().view(torch.int16 if values.dtype.itemsize == 2 else torch.int32).numpy()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experts=st.integers(1, 5), blocks=st.integers(1, 5), cols=st.integers(1, 40), dtype=st.sampled_from(sorted(TORCH)),
       divisor=st.booleans(), scale_2=st.sampled_from([1.0, 2.0**-20, 0.00372, 1e30, 1 / 3]), seed=st.integers(0, 2**32 - 1),
       chunk=st.sampled_from([dequant_table.CHUNK_ELEMENTS, 16, 700]))
def test_experts_dequantize_bit_for_bit_as_each_experts_linear_and_as_modelopt(experts, blocks, cols, dtype, divisor,
                                                                               scale_2, seed, chunk):
    """Every byte and every block-scale code (NaN 0x7F/0xFF, negatives, zero) can occur; chunking never shows."""
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, (experts, blocks * 8, cols), dtype=np.uint8)
    scale = rng.integers(0, 256, (experts, blocks, cols), dtype=np.uint8)
    saved, dequant_table.CHUNK_ELEMENTS = dequant_table.CHUNK_ELEMENTS, chunk  # per example: no function-scoped fixture
    try:
        got = dequant_table.dequantize_experts(packed, scale, scale_2, dtype, divisor)
    finally:
        dequant_table.CHUNK_ELEMENTS = saved
    assert got.shape == (experts, blocks * 16, cols)
    want = per_expert_linear(packed, scale, scale_2, dtype, divisor)
    assert got.dtype == want.dtype and np.array_equal(got.view(SIGNED[dtype]), want.view(SIGNED[dtype]))
    each = list(dequant_table.each_expert(packed, scale, scale_2, dtype, divisor))  # one expert at a time: fix --tp, --original
    assert len(each) == experts and all(np.array_equal(one.view(SIGNED[dtype]), w.view(SIGNED[dtype])) for one, w in zip(each, want))
    if not divisor:  # compressed-tensors writes no 3-D experts; ModelOpt's global scale multiplies
        pytest.importorskip("modelopt")
        assert np.array_equal(got.view(SIGNED[dtype]), modelopt_3d(packed, scale, scale_2, dtype))


def test_block_scales_that_do_not_fit_the_experts_are_refused():
    with pytest.raises(ValueError, match="do not fit packed expert"):
        dequant_table.dequantize_experts(np.zeros((2, 8, 3), np.uint8), np.zeros((2, 1, 4), np.uint8), 1.0, "BF16")
    with pytest.raises(ValueError, match="do not fit packed expert"):
        list(dequant_table.each_expert(np.zeros((2, 8, 3), np.uint8), np.zeros((2, 1, 4), np.uint8), 1.0, "BF16"))
    with pytest.raises(ValueError, match="do not fit 2 packed experts"):
        list(dequant_table.each_expert(np.zeros((2, 8, 4), np.uint8), np.zeros((3, 1, 4), np.uint8), 1.0, "BF16"))


RUN = (  # VmHWM: this process's own peak (ru_maxrss starts at the forking parent's: Linux keeps it across exec)
    "import sys\n"
    "from repair.cli import main\n"
    "def peak(): return int(next(line for line in open('/proc/self/status') if line.startswith('VmHWM')).split()[1])\n"
    "def fix(src, out):\n"
    "    try: main(['fix', src, '-o', out, '--target', 'bf16', '--quiet', '--jobs', '1'])\n"
    "    except SystemExit as exit: assert exit.code in (0, None), exit.code\n"
    "fix(*sys.argv[1:3])  # a small one first: every import done, so the peak after is the big one's tensors\n"
    "before = peak()\n"
    "fix(*sys.argv[3:5])\n"
    "print(peak() - before, 'torch' in sys.modules)\n"
)


def fix_in_child(tmp_path: Path, src: Path) -> tuple[int, bool]:
    """(peak RSS growth in bytes while `fix --target bf16` writes src, whether torch was imported), in a fresh process."""
    warm = write_experts(tmp_path / "warm", 2, 32, 16)
    args = [str(warm), str(tmp_path / "warm-out"), str(src), str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    growth_kib, torch_imported = done.stdout.splitlines()[-1].split()
    return int(growth_kib) * 1024, torch_imported == "True"


def test_fix_of_gpt_oss_experts_to_bf16_imports_no_torch(tmp_path):
    """Its 2-D attention and its 3-D experts all dequantize on numpy tables (before: torch, ~1-1.5 s, for the experts)."""
    assert not fix_in_child(tmp_path, gpt_oss_export(tmp_path / "src"))[1], "torch was imported"


def test_fix_of_3d_experts_holds_one_expert_not_the_output(tmp_path):
    """Peak RSS growth of `fix` while it dequantizes one [64, 1024, 1024] experts tensor (128 MiB BF16 out, 2 MiB an
    expert): one expert's output, packed bytes and block scales, the source digest's read buffer (one hashing CHUNK,
    reading the bytes the copy skipped) and one CHUNK of the output mapped as it is hashed (the experts are written at
    their offsets and hashed from the page cache), with 4 MiB of slack. Measured: +32 MiB; before: +142 MiB (the
    output whole), and before that +176 MiB for a quarter of it (the packed tensor read whole, per-expert results and
    their stacked copy, isfinite's bool tensors over the whole output)."""
    from repair.io.hasher import CHUNK

    growth, _ = fix_in_child(tmp_path, write_experts(tmp_path / "src", 64, 1024, 1024))
    assert growth <= 3 * 1024 * 1024 * 2 + 2 * CHUNK + 4 * 2**20, f"peak RSS grew {growth // 2**20} MiB"


def test_fix_with_one_job_holds_one_result_at_a_time(tmp_path):
    """Two [8192, 8192] Linears (128 MiB BF16 each, each dequantized whole), --jobs 1: the first one's bytes are let
    go before the second is computed, but for the tail the hashing thread may still hold (HELD) while the second starts.
    Before, the writer's loop variable and the hashing thread's last job (waiting for the next) each kept the first
    alive: +263 MiB, two results, measured on two such 3-D experts tensors (now written expert by expert)."""
    from repair.io.hasher import CHUNK, HELD

    output = 8192 * 8192 * 2
    growth, _ = fix_in_child(tmp_path, write_linears(tmp_path / "src", 8192, 8192, layers=2))
    assert growth <= output + 8192 * 8192 // 2 + CHUNK + HELD + 4 * 2**20, f"peak RSS grew {growth // 2**20} MiB"


def test_the_expert_reader_is_a_sequence_of_exactly_its_experts(tmp_path):
    """compute.py's reader stands for the packed [E, in/2, out] array: iterating it (Sequence's own __iter__ stops at
    IndexError), indexing from the end or past it gives that tensor's experts, never the bytes of the tensor after it."""
    from safetensors.torch import load_file

    from repair.execute.compute import ExpertReader
    from repair.io.safetensors import read_header

    src = write_experts(tmp_path / "src", 3, 32, 4, layers=2)
    shard = read_header(src / "model.safetensors")
    name = "model.layers.0.mlp.experts.gate_up_proj"
    info = next(t for t in shard.tensors if t.name == name)
    assert info.end < max(t.end for t in shard.tensors), "a tensor follows it"
    stored, reader = load_file(str(src / "model.safetensors"))[name].numpy(), ExpertReader(shard, info)
    assert [e.tolist() for e in reader] == [e.tolist() for e in stored]
    assert np.array_equal(reader[-1], stored[-1]) and np.array_equal(reader[-3], stored[0])
    for outside in (3, -4):
        with pytest.raises(IndexError):
            reader[outside]
