"""Peak RSS, wall and CPU of `fix` on ModelOpt BMM 3-D experts tensors, against the output's own size: `--target bf16`,
`--target bf16 --tp 2` (`--mode tp`), or taking the experts from `--original` (`--mode original`: the verification).

The checkpoint is built in code in ModelOpt's transposed layout (tests/test_bmm_experts_nvfp4.py: `X` uint8 [E, in/2, out],
`X_weight_scale` float8 [E, in/16, out], float32 scalar `X_weight_scale_2`), with random codes and block scales in a
range no global scale check refuses: the bytes are not the point, the memory the dequantization holds is. `--mode
original` quantizes random BF16 experts as ModelOpt does instead (`write_quantized_experts`), so the original verifies.

    python -m tools.bench.experts3d [--mode bf16|tp|original --experts 32 --rows 2048 --cols 2048 --layers 1 --jobs 1
                                     --repeats 3 --code OTHER_TREE]

`--code DIR` runs another checkout's `repair` (e.g. `git archive` of the commit before a change) against the same input,
in alternation with this one, so load drift hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def write_experts(root: Path, experts: int, rows: int, cols: int, layers: int = 1, seed: int = 0) -> Path:
    """A gpt-oss-named checkpoint whose changed tensors are `layers` [experts, rows, cols] NVFP4 experts weights."""
    rng = np.random.default_rng(seed)
    tensors, names = {}, [f"model.layers.{i}.mlp.experts.gate_up_proj" for i in range(layers)]
    for name in names:
        tensors |= {name: rng.integers(0, 256, (experts, rows // 2, cols), dtype=np.uint8),
                    f"{name}_weight_scale": rng.integers(0x28, 0x48, (experts, rows // 16, cols), dtype=np.uint8),
                    f"{name}_weight_scale_2": np.array(1e-3, dtype=np.float32),
                    f"{name}_input_scale": np.array(0.02, dtype=np.float32)}
    return _save(root, tensors, [f"{name}_weight_scale" for name in names])


def write_linears(root: Path, rows: int, cols: int, layers: int = 1, seed: int = 0) -> Path:
    """The same, with `layers` 2-D NVFP4 Linears [rows, cols] (o_proj: uint8 [rows, cols/2], block scales [rows, cols/16])
    in place of the experts: each is dequantized whole, as one result."""
    rng = np.random.default_rng(seed)
    tensors, names = {}, [f"model.layers.{i}.self_attn.o_proj" for i in range(layers)]
    for name in names:
        tensors |= {f"{name}.weight": rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8),
                    f"{name}.weight_scale": rng.integers(0x28, 0x48, (rows, cols // 16), dtype=np.uint8),
                    f"{name}.weight_scale_2": np.array(1e-3, dtype=np.float32), f"{name}.input_scale": np.array(0.02, dtype=np.float32)}
    return _save(root, tensors, [f"{name}.weight_scale" for name in names])


def _save(root: Path, tensors: dict[str, np.ndarray], scales: list[str]) -> Path:
    """The tensors (block scales `scales` retyped F8_E4M3) in one shard, with ModelOpt NVFP4 gpt-oss config files."""
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    _retype(root / "model.safetensors", scales)
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": []}
    (root / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
                                                  "quantization_config": {"quant_algo": "NVFP4", "quant_method": "modelopt"}}))
    (root / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"},
                                                           "quantization": quant}))
    return root


def write_quantized_experts(root: Path, original: Path, experts: int, rows: int, cols: int, layers: int = 1,
                            seed: int = 0) -> Path:
    """The same names, quantized from random BF16 experts as ModelOpt's export does (each expert transposed, one global
    scale per tensor), and `original`, those BF16 experts as transformers saves them: `fix --original` verifies it."""
    import torch
    from safetensors.torch import save_file

    from repair.codec import nvfp4

    gen, tensors, weights = torch.Generator().manual_seed(seed), {}, {}
    for i in range(layers):
        name = f"model.layers.{i}.mlp.experts.gate_up_proj"
        weight = weights[name] = (torch.randn(experts, rows, cols, generator=gen) * 0.05).bfloat16()
        scale_2 = nvfp4.global_scale(weight)
        packed, scales = zip(*(nvfp4.quantize(w.t().contiguous(), scale_2)[:2] for w in weight))
        tensors |= {name: torch.stack([p.t().contiguous() for p in packed]),
                    f"{name}_weight_scale": torch.stack([s.t().contiguous() for s in scales]),
                    f"{name}_weight_scale_2": scale_2.reshape(()).float(), f"{name}_input_scale": torch.tensor(0.02)}
    write_experts(root, 1, 32, 16, 0)  # its config files; the tensors are replaced
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    original.mkdir(parents=True)
    save_file(weights, str(original / "model.safetensors"), metadata={"format": "pt"})
    (original / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}))
    return root


def take_original_recipe(path: Path, layers: int = 1) -> Path:
    """A recipe taking the experts from --original (the run verifies the original first)."""
    modules = [f"model.layers.{i}.mlp.experts.gate_up_proj" for i in range(layers)]
    path.write_text(f'name = "t"\ndescription = "t"\n[[rules]]\naction = "take_original"\nmodules = {json.dumps(modules)}\n')
    return path


def fix_args(mode: str, src: Path, out: Path, original: Path | None = None, recipe: Path | None = None) -> list[str]:
    """`fix`'s arguments for one mode (the tests' subprocesses run the same ones)."""
    args = ["fix", str(src), "-o", str(out), "--quiet"]
    return args + {"bf16": ["--target", "bf16"], "tp": ["--target", "bf16", "--tp", "2"],
                   "original": ["--recipe", str(recipe), "--original", str(original)]}[mode]


def _retype(path: Path, names: list[str]) -> None:
    """safetensors' numpy writer has no float8: the scale bytes were saved as U8, their header entry says F8_E4M3."""
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    for name in names:
        header[name]["dtype"] = "F8_E4M3"
    text = json.dumps(header, separators=(",", ":")).encode()
    text = text.ljust(-(-len(text) // 8) * 8)  # offsets count from the data's start: only the header's length changes
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data[8 + size:]))


def run_fix(args: list[str], jobs: int, code: Path | None) -> dict:
    """One `fix` under /usr/bin/time: wall s, user+sys CPU s, max RSS MiB."""
    env = dict(os.environ, PYTHONPATH=str(code)) if code else dict(os.environ)
    cmd = ["/usr/bin/time", "-f", "%e %U %S %M", sys.executable, "-m", "repair", *args, "--jobs", str(jobs)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=code or REPO)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    wall, user, system, rss = done.stderr.strip().splitlines()[-1].split()
    return {"wall": float(wall), "cpu": float(user) + float(system), "rss_mib": int(rss) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("bf16", "tp", "original"), default="bf16")
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--layers", type=int, default=1, help="experts tensors (one per layer), for --jobs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--code", type=Path, help="another checkout's repair, run in alternation with this one")
    args = parser.parse_args()
    contenders = {"this": None} | ({"other": args.code.resolve()} if args.code else {})
    out_mib = args.experts * args.rows * args.cols * 2 / 2**20
    with tempfile.TemporaryDirectory(prefix="ckpt-experts3d-") as tmp:
        src, original, recipe = Path(tmp) / "src", Path(tmp) / "original", Path(tmp) / "take.toml"
        if args.mode == "original":
            write_quantized_experts(src, original, args.experts, args.rows, args.cols, args.layers)
            take_original_recipe(recipe, args.layers)
        else:
            write_experts(src, args.experts, args.rows, args.cols, args.layers)
        runs: dict[str, list[dict]] = {k: [] for k in contenders}
        for i in range(args.repeats):
            for name, code in contenders.items():
                out = Path(tmp) / f"out-{name}-{i}"
                runs[name].append(run_fix(fix_args(args.mode, src, out, original, recipe), args.jobs, code))
                subprocess.run(["rm", "-rf", str(out)], check=True)
    print(f"fix ({args.mode}) output tensors: {args.layers} x {out_mib:.0f} MiB BF16 [{args.experts}, {args.rows}, {args.cols}], --jobs {args.jobs}")
    for name, rs in runs.items():
        print(f"{name}: " + "; ".join(f"wall {r['wall']:.2f} s, cpu {r['cpu']:.2f} s, max RSS {r['rss_mib']:.0f} MiB" for r in rs))


if __name__ == "__main__":
    main()
