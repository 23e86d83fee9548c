"""Tensor-parallel divisibility rules as the runtime applies them (pure values; torch is never imported).

Splitting a packed NVFP4 weight is not splitting a matrix: its stored input dim is in/2 bytes and its
block scales in/16, so every rank's input width must stay a multiple of the 16-element group; vLLM pads
the vocabulary to a multiple of 64 before dividing it, and divides a merged gate+up layer as one.
`doctor --tp` checks these on what the runtime builds; the TP planner (repair/tp/plan.py) on what it writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from repair.errors import UsageError
from repair.formats.modules import split_name

BLOCK = 16  # NVFP4 group: logical elements per fp8 block scale
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
MAX_DEGREE = 128  # degrees tried when listing the ones that work
MAX_RANKS = 4096  # ranks doctor simulates or fix writes at most (each rank costs memory and a file; unshard reads no more)
SPLIT_STYLES = ("column", "row", "merged", "vocab")
HEAD_ROLES = ("q_proj", "o_proj")
NVFP4_IN_FEATURES = "ValueError: Unsupported model when in features size is not multiple of 16"


@dataclass(frozen=True)
class RankRange:
    """One rank's part of the split dim, [start, end), in logical elements and in stored elements."""

    logical: tuple[int, int]
    stored: tuple[int, int]


@dataclass(frozen=True)
class Problem:
    """Why a degree is impossible for one tensor, with the runtime's own error where it has one."""

    tensor: str
    rule: str
    runtime_error: str | None = None


def padded_vocab(size: int) -> int:
    return -(-size // VOCAB_PADDING) * VOCAB_PADDING


@dataclass(frozen=True)
class ParallelSpec:
    """How one tensor is split across ranks: style, stored dim, the dim's logical length and stored unit."""

    tensor: str
    style: str  # column | row | merged | vocab | replicated
    dim: int | None = None  # stored dim that is split; None when replicated
    size: int = 0  # logical length of `dim` (full-precision elements)
    unit: int = 1  # logical elements per stored element along `dim`: 2 for packed bytes, 16 for block scales
    heads: int | None = None  # attention heads that must divide evenly
    blocked: bool = False  # NVFP4 on the input dim: each rank's logical width must be a multiple of 16

    def ranges(self, tp: int) -> tuple[RankRange, ...]:
        """Every rank's range; vocab ranks follow vLLM (padded rows are not stored, so the last may be short)."""
        if self.dim is None:
            return ()
        per = (padded_vocab(self.size) if self.style == "vocab" else self.size) // tp
        bounds = [(min(r * per, self.size), min((r + 1) * per, self.size)) for r in range(tp)]
        return tuple(RankRange((a, b), (a // self.unit, b // self.unit)) for a, b in bounds)

    def problem(self, tp: int) -> Problem | None:
        """The first rule this degree breaks for this tensor, or None."""
        if self.dim is None:
            return None
        if self.style == "vocab":
            padded = padded_vocab(self.size)
            if padded % tp:
                return Problem(self.tensor, f"vocab-parallel: the vocabulary ({self.size}, padded to {padded}, a multiple of "
                               f"{VOCAB_PADDING} as vLLM pads it) is not divisible by {tp}", f"AssertionError: {padded} is not divisible by {tp}")
            return None
        what = "input features" if self.style == "row" else "output features"
        if self.size % tp:
            total = 2 * self.size if self.style == "merged" and (2 * self.size) % tp else self.size  # vLLM divides gate+up first
            return Problem(self.tensor, f"{self.style}-parallel: its {self.size} {what} are not divisible by {tp}",
                           f"AssertionError: {total} is not divisible by {tp}")
        if self.heads and self.heads % tp:
            return Problem(self.tensor, f"its {self.heads} attention heads are not divisible by {tp}")
        if self.blocked and (self.size // tp) % BLOCK:
            return Problem(self.tensor, f"row-parallel NVFP4: each rank's input features ({self.size}/{tp} = {self.size // tp}) "
                           f"must be a multiple of {BLOCK}, the quantization group", NVFP4_IN_FEATURES)
        return None


def check_ranks(tp: int, why: str) -> None:
    """One line, before any per-rank work, for a degree past MAX_RANKS (`--tp 100000000` would allocate per rank)."""
    if tp > MAX_RANKS:
        raise UsageError(f"--tp {tp}: at most {MAX_RANKS} ranks ({why}); choose the degree the runtime will run with")


def problems(specs: Iterable[ParallelSpec], tp: int) -> list[Problem]:
    return [p for s in specs if (p := s.problem(tp)) is not None]


def valid_degrees(specs: Iterable[ParallelSpec], limit: int = MAX_DEGREE) -> list[int]:
    specs = list(specs)
    return [d for d in range(1, limit + 1) if not problems(specs, d)]


def degrees_text(degrees: list[int]) -> str:
    return ", ".join(map(str, degrees)) + f" (of 1-{MAX_DEGREE})" if degrees != [1] else "only 1 (no tensor parallelism)"


def check_degree(specs: Iterable[ParallelSpec], tp: int) -> None:
    """Raise UsageError naming the tensor and the rule when `tp` is impossible, with the degrees that work."""
    specs = list(specs)
    if tp < 1:
        raise UsageError(f"--tp {tp}: the tensor-parallel degree must be at least 1")
    found = sorted(problems(specs, tp), key=lambda p: (split_name(p.tensor)[0], not p.tensor.endswith(".weight"), p.tensor))
    if found:
        first = found[0]
        more = f" (and {len(found) - 1} more tensor(s))" if len(found) > 1 else ""
        raise UsageError(f"--tp {tp} is impossible: {first.tensor}: {first.rule}{more}; "
                         f"degrees that work for this checkpoint: {degrees_text(valid_degrees(specs))}")


def heads_of(config: dict | None) -> int | None:
    text = (config or {}).get("text_config")
    value = (text if isinstance(text, dict) else config or {}).get("num_attention_heads")
    return value if type(value) is int and value > 0 else None


def runtime_specs(specs: dict, precision: dict[str, str], config: dict | None, kinds: dict) -> tuple[ParallelSpec, ...]:
    """What the runtime splits, per module, as it builds it (NVFP4 or BF16): for doctor's degree check. `kinds`: the
    layer kinds of the class the target builds (its row's)."""
    heads = heads_of(config)
    out = []
    for spec in specs.values():
        style = kinds[spec.role].style
        if style not in SPLIT_STYLES or len(spec.shape) != 2:
            continue
        h = heads if spec.role in HEAD_ROLES else None
        if style == "row":
            out.append(ParallelSpec(spec.name, "row", 1, spec.shape[1], 1, h, precision.get(spec.name) == "nvfp4"))
        else:
            out.append(ParallelSpec(spec.name, style, 0, spec.shape[0], 1, h))
    return tuple(out)
