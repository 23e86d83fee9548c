"""Whether a vLLM release reads a compressed-tensors `sparsity_config` (run in .venv-vllm; tools/vllm_profile.py records
it as the profile's `ct_sparsity_refused`).

llm-compressor writes `sparsity_config` beside the quantization groups of a sparse export (2:4 "sparse-24-bitmask" or
weights stored dense). vLLM's `CompressedTensorsConfig.from_config` hands it to `_parse_sparsity_config` while reading
the config (0.32 compressed_tensors.py:259, 273-300), before any layer is built. That release's own method is asked with
a config whose sparsity targets name the Linears and with one naming none: the error it raises for the first is
recorded, with the file:line that raised it, when it reads the second; {} where it reads both. A release that refuses
the second too reads sparsity in some way this tool does not know: it stops (no guess). Imports nothing from ``repair``.
"""

from __future__ import annotations

import os
import traceback

from raised_by import reraise_ours


def _ask(parse, targets: list[str]) -> BaseException | None:
    sparsity = {"format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": targets, "ignore": []}
    try:
        parse(config={"sparsity_config": sparsity})
    except Exception as exc:  # noqa: BLE001 - the release's own refusal is the answer
        reraise_ours(exc)
        return exc
    return None


def ct_sparsity_refused() -> dict[str, str]:
    """{"error": "<Type>: <message>", "where": "<file>:<line> <function>", "when": "targets"} where the release refuses a
    sparsity_config with targets while reading the config; {} where it reads it."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    parse = CompressedTensorsConfig._parse_sparsity_config
    if _ask(parse, []) is not None:
        raise SystemExit("vLLM refuses a sparsity_config with no targets: read how this release reads sparsity "
                         "(tools/vllm_ct_sparsity.py)")
    error = _ask(parse, ["Linear"])
    if error is None:
        return {}
    frame = traceback.extract_tb(error.__traceback__)[-1]
    where = frame.filename[frame.filename.rindex(f"{os.sep}vllm{os.sep}") + 1:]
    return {"error": f"{type(error).__name__}: {error}", "where": f"{where}:{frame.lineno} {frame.name}", "when": "targets"}


if __name__ == "__main__":
    import json

    print(json.dumps(ct_sparsity_refused()))
