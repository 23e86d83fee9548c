"""doctor's result values: findings (severity and kind as enums) and the diagnosis that holds them.

The enums are StrEnums, so JSON and text show the same words as before ("error", "load-error", ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from repair.arch.base import Architecture
from repair.doctor.scales import ScaleScan
from repair.targets.profiles import Target
from repair.targets.vllm_loader import Outcome


class Severity(StrEnum):
    ERROR = "error"  # will not load, or loads wrong values
    WARNING = "warning"  # loads, but against the model's intended precision or with inconsistent metadata


class Kind(StrEnum):
    """What a finding is about (its `code` in JSON)."""

    TP_IMPOSSIBLE = "tp-impossible"
    LOAD_ERROR = "load-error"
    SILENT_GARBAGE = "silent-garbage"
    IGNORED_TENSORS = "ignored-tensors"
    NOT_BF16 = "not-bf16"
    QUANT_CONFIG = "quant-config"
    NULL_EXCLUSIONS = "null-exclusions"  # the list a runtime reads is null, which it refuses
    HANDSHAKE_QUANTIZED = "handshake-quantized"
    UNUSED_EXCLUSION = "unused-exclusion"
    CONFIGS_DISAGREE = "configs-disagree"
    CONFIG_CONTRADICTION = "config-contradiction"
    FUSED_SHARDS = "fused-shards"
    SIBLINGS_SCALE_2 = "siblings-scale-2"
    EXPERTS_SCALE_2 = "experts-gate-up-scale-2"  # a routed expert's gate/up global scales differ (doctor/expert_scales.py)
    MISSING_WEIGHT_SCALE = "missing-weight-scale"
    SCALE_SHAPE = "scale-shape"
    BLOCK_SCALES = "block-scales"
    MISSING_SCALE_2 = "missing-scale-2"
    GLOBAL_SCALE = "global-scale"
    SCALE_OVERFLOW = "scale-overflow"
    INPUT_SCALE = "input-scale"
    MISSING_INPUT_SCALE = "missing-input-scale"
    ALGORITHM_MISMATCH = "algorithm-mismatch"
    KV_CACHE_SCALES = "kv-cache-scales"
    FP8_SCALE = "fp8-scale"
    UNSCALED_FLOAT8 = "unscaled-float8"  # float8 tensors with no leaf and no scale (3-D experts): no plan reads them
    RUNTIME_SCHEME = "runtime-scheme"
    MISSING_MODULE = "missing-module"
    DROPPED_TENSOR = "dropped-tensor"
    LOAD_REFUSED = "load-refused"  # the release loads no checkpoint of this architecture (its own load_weights fails)
    UNREGISTERED = "unregistered-architecture"  # the release has no model class of any listed architecture
    CONFIG_REFUSED = "config-refused"  # the release refuses config.json while reading it (its config class's validation)
    BUILD_REFUSED = "build-refused"  # the release's own model code refuses to build this architecture from its config
    UNEXPECTED_TENSOR = "unexpected-tensor"  # the release's load_weights has no parameter for a stored tensor and raises
    PRE_QUANT_SCALE = "pre-quant-scale"


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: Kind
    subject: str  # a module, tensor or file
    message: str
    runtime_error: str | None = None  # the exact exception text the runtime raises
    ranks: tuple[int, ...] = ()
    config_bound: bool = False  # only the quantization config makes the runtime build this full-precision layer quantized
    repairs: tuple[str, ...] = ()  # the stored modules its hint says fix --target turns BF16 and excludes (doctor/fix_hints.py)


@dataclass(frozen=True)
class Diagnosis:
    target: Target
    tp: int
    findings: tuple[Finding, ...]
    first_errors: tuple[Outcome, ...]  # per failing rank, the tensor the runtime stops on
    runtime_precision: dict[str, str]  # layer -> the scheme the target builds it as (simulated, else predicted from the config)
    bits_per_parameter: float
    architecture: str = "this model"  # config.json's `architectures` entry (else model_type), as messages name it
    simulated: bool = False  # the target's loader was simulated (the architecture has a loader profile)
    notes: tuple[Finding, ...] = ()  # worth knowing, but the target loads and runs it as intended: never counted, even by --strict
    scales: ScaleScan | None = None  # which scale values were read (block scales sampled, scanned or not read)
    family: Architecture | None = None  # the row of the class the target builds (target_family): what fix plans with

    def exit_code(self, strict: bool = False) -> int:
        bad = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
        return 1 if any(f.severity in bad for f in self.findings) else 0
