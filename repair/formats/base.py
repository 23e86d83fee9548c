"""What every checkpoint format plug-in provides, and the declaration value they all return.

A format knows how its tensors group into modules, which stored names play which role, how its
config declares quantization and exclusions, and how to write those declarations back. The rest
of the tool works on `StoredModule`s and `Declaration`s, so a new format (FP8 block, MXFP4) is a
new file in this package plus one line in `FORMATS`.

Roles use ModelOpt's names: "weight" (packed or plain), "weight_scale" (fp8 block scales),
"weight_scale_2" (the per-tensor global scale, a multiplier, or a divisor where the format's
`GLOBAL_SCALE_IS_DIVISOR` says so) and "input_scale".
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Protocol

from repair.io.checkpoint import Checkpoint
from repair.io.safetensors import TensorInfo
from repair.formats.modules import StoredModule

CANONICAL_ROLES = ("weight", "weight_scale", "weight_scale_2", "input_scale")


@dataclass(frozen=True)
class Declaration:
    """What the config files claim about quantization (None where a file or key is absent)."""

    quant_algo: str | None
    ignore: tuple[str, ...] | None  # config.json quantization_config.ignore
    exclude_modules: tuple[str, ...] | None  # hf_quant_config.json quantization.exclude_modules (ModelOpt only)
    format: str = "modelopt-nvfp4"
    targets: tuple[str, ...] | None = None  # compressed-tensors config_groups targets (None: every linear)

    @property
    def quantized(self) -> bool:
        return self.quant_algo is not None

    @property
    def exclusions(self) -> tuple[str, ...]:
        """The list vLLM uses: config.json's when present, else hf_quant_config.json's."""
        if self.ignore is not None:
            return self.ignore
        return self.exclude_modules or ()

    def excludes(self, prefix: str, exclusions: tuple[str, ...] | list[str] | None = None) -> bool:
        """True when vLLM builds the layer at `prefix` unquantized under this format's matching rules."""
        from repair.targets import vllm_matching

        listed = self.exclusions if exclusions is None else exclusions
        if self.format == "compressed-tensors":
            return vllm_matching.ct_is_excluded(prefix, listed, self.targets)
        return vllm_matching.is_excluded(prefix, listed)


def without_quantization(ckpt: Checkpoint) -> dict | None:
    """config.json contents for a plain BF16 checkpoint (no quantization_config), whatever the format."""
    config = copy.deepcopy(ckpt.config)
    if config is not None:
        config.pop("quantization_config", None)
    return config


class Format(Protocol):
    """A checkpoint format plug-in (a module in this package)."""

    NAME: str
    GLOBAL_SCALE_IS_DIVISOR: bool
    RUNTIME_LEAVES: dict[str, str]  # stored leaf name -> role, for the parameters vLLM allocates for a packed layer

    def claims(self, ckpt: Checkpoint) -> bool: ...
    def group_modules(self, infos: dict[str, TensorInfo]) -> list[StoredModule]: ...
    def check_packed(self, module: StoredModule, infos: dict[str, TensorInfo], where: str, out_dtype: str = "BF16") -> None: ...
    def read_declaration(self, ckpt: Checkpoint) -> Declaration: ...
    def exclusion_entry(self, module: str) -> str: ...
    def with_exclusions(self, ckpt: Checkpoint, names: list[str], covers, remove: list[str] = ()) -> tuple[dict | None, dict | None]: ...
    def exclusion_lists(self, config: dict | None, hf_quant: dict | None) -> list[list[str]]: ...
    def without_quantization(self, ckpt: Checkpoint) -> dict | None: ...
    def unsupported(self, operation: str) -> str | None: ...
