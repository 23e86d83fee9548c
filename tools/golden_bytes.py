"""sha256 of every tensor and config file `fix` writes, per fixture and options: the bytes a speed change must keep.

    PYTHONPATH=/path/to/other/checkout .venv/bin/python -m tools.golden_bytes tests/data/golden_bytes.json

Run with another checkout's code on PYTHONPATH (e.g. main), it records what that code writes;
tests/test_golden_bytes.py builds the same fixtures and asserts this checkout writes the same bytes.
The report and the TP manifest are left out: they name the run's folders, and the report may gain fields. The fixtures are the tiny generated
assistant (one shard, and three shards), ModelOpt's own export of the buggy assistant and its
compressed-tensors conversion, ModelOpt's own MIXED_PRECISION export and its NVFP4 gpt-oss (3-D BMM experts, written
expert by expert: `--tp 2` too, and taking them from `--original`, which verifies them expert by expert), and
requantizing from `--original`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable

REPORTS = ("repair_report.json", "tp_manifest.json")  # they record the run's paths; the report may gain fields
# case -> (fixture, fix flags); a flag `{name}` is replaced by fixture `name`'s folder (an original model)
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "tiny default": ("tiny", ()),
    "tiny bf16": ("tiny", ("--target", "bf16")),
    "tiny bf16 jobs 3": ("tiny", ("--target", "bf16", "--jobs", "3")),
    "tiny vllm==0.32.0": ("tiny", ("--target", "vllm==0.32.0")),
    "tiny tp 2": ("tiny", ("--target", "bf16", "--tp", "2")),
    "sharded default": ("sharded", ()),
    "sharded bf16 jobs 2": ("sharded", ("--target", "bf16", "--jobs", "2")),
    "modelopt default": ("modelopt", ()),
    "modelopt bf16": ("modelopt", ("--target", "bf16")),
    "modelopt requantize": ("modelopt", ("--original", "{original}", "--requantize", "pre_projection,post_projection,model.layers.0.mlp.gate_proj,model.layers.0.mlp.up_proj")),
    "compressed-tensors bf16": ("ct", ("--target", "bf16")),
    "mixed bf16": ("mixed", ("--target", "bf16")),
    "gpt-oss bf16": ("gptoss", ("--target", "bf16")),
    "gpt-oss bf16 jobs 2": ("gptoss", ("--target", "bf16", "--jobs", "2")),
    "gpt-oss vllm==0.32.0 tp 2": ("gptoss", ("--target", "vllm==0.32.0", "--tp", "2")),
    "gpt-oss bf16 tp 2": ("gptoss", ("--target", "bf16", "--tp", "2")),
    "gpt-oss bf16 original": ("gptoss", ("--target", "bf16", "--original", "{gptoss-original}")),
    "gpt-oss bf16 original tp 2": ("gptoss", ("--target", "bf16", "--original", "{gptoss-original}", "--tp", "2")),
}


def fixtures(root: Path) -> dict[str, Callable[[], Path]]:
    """Each fixture, built on first use under `root` (the test suite passes its session fixtures instead)."""
    from repair.demo.examples import TINY, write_assistant
    from tools import ct_export, modelopt_export
    from tools.malformed import SHARDS
    from tools.modelopt_gptoss_export import TINY_GPT_OSS, export_gpt_oss
    from tools.modelopt_mixed_export import export_mixed_llama

    built: dict[str, Path] = {}

    def once(name: str, make: Callable[[], Path]) -> Callable[[], Path]:
        def get() -> Path:
            if name not in built:
                built[name] = make()
            return built[name]
        return get

    modelopt = once("modelopt", lambda: modelopt_export.export_modelopt(root / "broken", exclude_projections=False))
    return {
        "tiny": once("tiny", lambda: write_assistant(root / "tiny", TINY)),
        "sharded": once("sharded", lambda: write_assistant(root / "sharded", TINY, shards=SHARDS)),
        "modelopt": modelopt,
        "original": once("original", lambda: modelopt_export.save_original(root / "original")),
        "ct": once("ct", lambda: ct_export.convert_modelopt(modelopt(), root / "compressed-tensors")),
        "mixed": once("mixed", lambda: export_mixed_llama(root / "mixed")),
        "gptoss": once("gptoss", lambda: export_gpt_oss(root / "gpt-oss")),
        "gptoss-original": once("gptoss-original", lambda: modelopt_export.save_tiny_causal_lm_original(
            "GptOssConfig", "GptOssForCausalLM", TINY_GPT_OSS, root / "gpt-oss-original")),
    }


def output_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every written file but the report, by path inside the output."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in REPORTS}


def run_case(case: str, get: dict[str, Callable[[], Path]], out: Path) -> dict[str, str]:
    """Write `case`'s output to `out` with the CLI in-process; its file hashes."""
    from repair.cli import main

    fixture, flags = CASES[case]
    args = [str(get[fixture]()), "-o", str(out), "--quiet", *(str(get[f[1:-1]]()) if f[:1] == "{" else f for f in flags)]
    try:
        main(["fix", *args])
    except SystemExit as stop:
        if stop.code:
            raise RuntimeError(f"{case}: fix exited {stop.code}") from None
    return output_hashes(out)


def main() -> None:
    import repair

    with tempfile.TemporaryDirectory(prefix="golden-bytes-") as tmp:
        get = fixtures(Path(tmp) / "src")
        result = {case: run_case(case, get, Path(tmp) / f"out-{i}") for i, case in enumerate(CASES)}
    result["_written_by"] = {"code": str(Path(repair.__file__).parents[1])}
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
