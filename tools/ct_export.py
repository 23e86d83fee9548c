"""compressed-tensors fixtures: a ModelOpt NVFP4 export converted by compressed-tensors' own converter.

`convert_checkpoint` with `ModelOptNvfp4Converter` renames and inverts ModelOpt's tensors
(weight -> weight_packed, weight_scale_2 -> weight_global_scale = 1/x, input_scale ->
input_global_scale = 1/x) and writes a `quant_method: compressed-tensors` config; the ModelOpt
export's exclusions carry over as `ignore`, so the Gemma 4 assistant's bug carries over too.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path


def convert_modelopt(src: Path, out: Path) -> Path:
    """compressed-tensors' conversion of the ModelOpt export at `src` into `out` (returned)."""
    from loguru import logger

    logger.remove()  # the converter logs every copied file at DEBUG
    logging.getLogger("compressed_tensors").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from compressed_tensors.entrypoints.convert import convert_checkpoint
        from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter

        ignore = json.loads((Path(src) / "config.json").read_text())["quantization_config"].get("ignore", [])
        convert_checkpoint(str(src), str(out), [ModelOptNvfp4Converter(targets=["Linear"], ignore=ignore)], device="cpu")
    return Path(out)

