"""`fix --tp` and `fix --original` on ModelOpt's 3-D experts hold one expert at a time, not the tensor.

`fix --tp N` dequantizes each expert and writes each rank's part of it at the offset the rank file's header fixes;
`--original` verifies each expert against the original's, reading both one expert at a time. The memory is measured
in a fresh process (VmHWM, after a small run of the same command has done every import), against one expert's BF16
output: a gpt-oss-120b gate_up_proj is [128, 2880, 5760], 33 MiB an expert and 4 GiB the tensor. The bytes are the
ones the whole-tensor paths wrote (tests/test_golden_bytes.py; here: the ranks rebuild `fix`'s own output).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from repair.io.hasher import CHUNK
from tools.bench.experts3d import fix_args, take_original_recipe, write_experts, write_quantized_experts

RUN = (  # VmHWM: this process's own peak (ru_maxrss starts at the forking parent's: Linux keeps it across exec)
    "import json, sys\n"
    "from repair.cli import main\n"
    "def peak(): return int(next(line for line in open('/proc/self/status') if line.startswith('VmHWM')).split()[1])\n"
    "def fix(args):\n"
    "    try: main(args + ['--jobs', '1'])\n"
    "    except SystemExit as exit: assert exit.code in (0, None), exit.code\n"
    "warm, big = json.loads(sys.argv[1])\n"
    "fix(warm)  # a small one first: every import done, so the peak after is the big one's tensors\n"
    "before = peak()\n"
    "fix(big)\n"
    "print(peak() - before)\n"
)
E, ROWS, COLS = 64, 1024, 1024  # 128 MiB of BF16 output, 2 MiB an expert
EXPERT = ROWS * COLS * 2


def growth_in_child(warm: list[str], big: list[str]) -> int:
    """Peak RSS growth in bytes while `fix big` runs, in a fresh process that ran `fix warm` first."""
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps([warm, big])], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.splitlines()[-1]) * 1024


def test_fix_tp_holds_one_expert_not_the_tensor_and_its_slices(tmp_path):
    """`--target bf16 --tp 2` of one [64, 1024, 1024] experts tensor (128 MiB BF16 per rank file): one expert's output
    and its packed bytes and block scales, chunk temporaries, one CHUNK of each rank file mapped by its hashing thread
    (the placed bytes are hashed as they are in the page cache) and the source digest's read buffer (one CHUNK), with
    4 MiB of slack. Measured: +48 MiB, and 85 / 94 / 99 MiB peak RSS for 16 / 64 / 128 experts (tools/bench/
    experts3d.py --mode tp); before: +143 MiB (the whole output, with torch imported to slice it)."""
    warm = write_experts(tmp_path / "warm", 2, 32, 16)
    src = write_experts(tmp_path / "src", E, ROWS, COLS)
    growth = growth_in_child(fix_args("tp", warm, tmp_path / "warm-out"), fix_args("tp", src, tmp_path / "out"))
    assert growth <= 3 * EXPERT + 3 * CHUNK + 4 * 2**20, f"peak RSS grew {growth // 2**20} MiB"


def test_many_small_experts_hold_one_expert_not_the_tensor_s_block_scales(tmp_path):
    """The bound must not grow with E: [49152, 128, 128] experts (1.5 GiB BF16, 32 KiB an expert, 48 MiB of block
    scales). Before, the plan's check of the block scales (formats/nvfp4_packed.py `check_packed`) read them whole and
    copied them (2 x 1/32 of the BF16 output): +112 MiB here, +221 at 4 GiB, where [64, 1024, 1024] grows 32."""
    warm = write_experts(tmp_path / "warm", 2, 32, 16)
    src = write_experts(tmp_path / "src", 49152, 128, 128)
    growth = growth_in_child(fix_args("bf16", warm, tmp_path / "warm-out"), fix_args("bf16", src, tmp_path / "out"))
    assert growth <= 3 * CHUNK + 8 * 2**20, f"peak RSS grew {growth // 2**20} MiB"


def test_fix_original_verifies_3d_experts_one_expert_at_a_time(tmp_path):
    """Taking the experts from `--original` verifies them first: each expert of the original quantized again with the
    stored global scale and compared with its stored codes, and its error measured in float32 a few rows at a time.
    One [16, 2048, 2048] experts tensor (128 MiB BF16, 8 MiB an expert): the expert's bytes, its transposed copy, its
    float32 copy, the quantizer's outputs and temporaries (about 9 experts in all), the output's copy hashed from the
    page cache (one CHUNK) and the source digest's read buffer (one CHUNK). Measured: +105 MiB, and +104 for 4 experts.
    Before: +939 MiB, the tensor whole in float32 several times over (original, dequantized, their difference)."""
    warm = write_quantized_experts(tmp_path / "warm", tmp_path / "warm-original", 2, 32, 16)
    src = write_quantized_experts(tmp_path / "src", tmp_path / "original", 16, 2048, 2048)
    recipe = take_original_recipe(tmp_path / "take.toml")
    growth = growth_in_child(fix_args("original", warm, tmp_path / "warm-out", tmp_path / "warm-original", recipe),
                             fix_args("original", src, tmp_path / "out", tmp_path / "original", recipe))
    assert growth <= 12 * (2048 * 2048 * 2) + 2 * CHUNK + 4 * 2**20, f"peak RSS grew {growth // 2**20} MiB"
    report = json.loads((tmp_path / "out" / "repair_report.json").read_text())
    assert report["original"]["verified"] == report["original"]["checked"] == 1, report["original"]


def _colwise(src: Path) -> Path:
    """An architecture no profile knows, whose config's transformers TP plan splits the experts column-wise."""
    config = json.loads((src / "config.json").read_text())
    config.update(architectures=["MyMoeForCausalLM"], model_type="mymoe", base_model_tp_plan={"layers.*.mlp.experts": "colwise"})
    (src / "config.json").write_text(json.dumps(config))
    return src


def test_the_ranks_rebuild_fix_s_own_output_replicated_and_split_column_wise(tmp_path, capsys):
    """Each rank's experts written expert by expert at their offsets: `unshard` gives `fix`'s output byte for byte, with
    the experts replicated (gpt-oss's profile) or split column-wise (a config's TP plan: each expert's rows, as
    transformers splits a 3-D parameter), with one job or two."""
    from tests.conftest import run_captured

    for name, src in (("replicated", write_experts(tmp_path / "r", 6, 64, 48, layers=2)),
                      ("column-wise", _colwise(write_experts(tmp_path / "c", 6, 64, 48, layers=2)))):
        assert run_captured(capsys, "fix", "--target", "bf16", src, "-o", tmp_path / f"{name}-one")[0] == 0
        for jobs in ("1", "2"):
            tp = tmp_path / f"{name}-tp-{jobs}"
            code, out, err = run_captured(capsys, "fix", "--target", "bf16", "--tp", "2", "--jobs", jobs, src, "-o", tp)
            assert code == 0, out + err
            entries = json.loads((tp / "tp_manifest.json").read_text())["tensors"].values()
            assert {t["style"] for t in entries} == ({"replicated"} if name == "replicated" else {"column"}), entries
            # transformers' ColwiseParallel shards a parameter on dim ndim - 2 (distributed/tensor_parallel.py
            # shard_param: Shard(meta.ndim - 2)): a 3-D experts tensor's second dim, each expert's rows, not the experts
            assert all(t["dim"] == len(t["shape"]) - 2 for t in entries if t["style"] == "column"), entries
            assert run_captured(capsys, "unshard", tp, "-o", tmp_path / f"{name}-back-{jobs}")[0] == 0
            one = (tmp_path / f"{name}-one" / "model.safetensors").read_bytes()
            assert (tmp_path / f"{name}-back-{jobs}" / "model.safetensors").read_bytes() == one, (name, jobs)


def test_each_rank_part_of_an_expert_lands_where_the_sliced_tensor_has_it():
    """execute/experts.py for every split dim of [E, in, out]: the parts placed per rank make that rank's slice of the whole
    tensor, each byte placed once (the writer's header offsets are the tensor's own, checked by the tests above)."""
    from repair.targets.tp_rules import RankRange
    from repair.execute.experts import PLACED, place_experts

    whole = np.random.default_rng(0).integers(0, 2**16, (5, 32, 12), dtype=np.uint16)

    class Computer:
        def each_expert(self, step):
            return iter(list(whole))

    class Writer:
        def __init__(self, size):
            self.data, self.placed = bytearray(size), 0

        def place_part(self, name, offset, data):
            view = memoryview(data).cast("B")
            self.data[offset:offset + view.nbytes] = view
            self.placed += view.nbytes

    for dim, bounds in ((None, [None, None]), (0, [(0, 2), (2, 5)]), (1, [(0, 16), (16, 32)]), (2, [(0, 6), (6, 12)])):
        ranges = [RankRange(b, b) if b else None for b in bounds]
        want = [whole if b is None else whole[(slice(None),) * dim + (slice(*b),)] for b in bounds]
        writers = [Writer(w.nbytes) for w in want]
        assert place_experts(Computer(), "x", None, dim, ranges, writers) == PLACED
        for writer, w in zip(writers, want):
            assert writer.placed == w.nbytes and bytes(writer.data) == np.ascontiguousarray(w).tobytes(), dim


def test_a_bad_global_scale_is_refused_as_fix_refuses_it(tmp_path, capsys):
    """The expert-by-expert path reads every block-scale code before writing anything and refuses in the whole path's
    words (one line, exit 2, nothing written)."""
    from repair.io.safetensors import read_header
    from tests.conftest import run_captured

    src = write_experts(tmp_path / "src", 4, 64, 16)
    shard = read_header(src / "model.safetensors")
    info = next(t for t in shard.tensors if t.name == "model.layers.0.mlp.experts.gate_up_proj_weight_scale_2")
    with open(src / "model.safetensors", "r+b") as f:  # its global scale overflows BF16 with every block scale
        f.seek(info.start)
        f.write(np.array(3e38, dtype="<f4").tobytes())
    results = []
    for extra in ((), ("--tp", "2")):
        code, out, err = run_captured(capsys, "fix", "--target", "bf16", *extra, src, "-o", tmp_path / f"out{len(extra)}")
        assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / f"out{len(extra)}").exists(), out + err
        results.append(err.replace(str(tmp_path / f"out{len(extra)}"), "OUT"))
    assert results[0] == results[1], results


def test_parts_that_overlap_are_refused_even_when_their_bytes_add_up(tmp_path):
    """ShardWriter.place_part proves coverage, not a byte count: two parts at offset 0 of a 2-part tensor add up to its
    size but leave its second half unwritten (zeros hashed as if computed): our own bug, refused as one (exit 3)."""
    import pytest

    from repair.errors import InternalError
    from repair.io.shard_writer import OutTensor, ShardWriter

    half = np.arange(8, dtype=np.uint16)
    with pytest.raises(InternalError, match="placed"):
        with ShardWriter(tmp_path / "x.safetensors", [OutTensor("w", "F16", (2, 8))], None) as writer:
            writer.place_part("w", 0, half)
            writer.place_part("w", 0, half)
            writer.written_in_place("w")
    with ShardWriter(tmp_path / "y.safetensors", [OutTensor("w", "F16", (2, 8))], None) as writer:
        writer.place_part("w", 0, half)
        writer.place_part("w", half.nbytes, half + 8)
        writer.written_in_place("w")
    from safetensors.numpy import load_file
    assert (load_file(tmp_path / "y.safetensors")["w"].view(np.uint16).ravel() == np.arange(16)).all()
