"""Fused layers whose shards are stored at different precisions, where the runtime fuses them.

vLLM builds a fused layer (qkv_proj from q/k/v, gate_up_proj from gate/up; the architecture's fused layers, from
the generated profile, and the layers only its loader merges, `merged_layers`: StableLM's qkv_proj, the Gemma 4
assistant's gate_up_proj) once, with the method the config declares for it. A shard stored in another precision than
its siblings then cannot be loaded: a BF16 k_proj [out, in] does not fit the packed [out, in/2] slice of an NVFP4
qkv_proj, and vLLM 0.32 stops on the shape assertion of its fused-parameter loader (measured: Qwen3, one BF16 k_proj;
StableLM and the assistant alike, tests/vllm/test_merged_shards_vs_vllm.py).
"""

from __future__ import annotations

from repair.arch import Architecture
from repair.doctor.findings import Finding, Kind, Severity
from repair.formats.base import Declaration
from repair.formats.modules import StoredModule
from repair.targets.precision import built, declared_algorithm
from repair.targets.profiles import Target

# vllm/model_executor/parameter.py (0.32): the loader each fused layer's packed parameter uses for one shard
SHARD_LOADER = {"qkv_proj": "load_qkv_weight"}
DEFAULT_LOADER = "load_merged_column_weight"


def fused_storage_findings(declaration: Declaration, modules: dict[str, StoredModule], family: Architecture,
                           target: Target) -> list[Finding]:
    """An error per fused layer declared quantized whose shards are not all stored quantized (or all not)."""
    if not target.profile.follows_draft_config or not declaration.quantized:
        return []
    out = []
    for fused, shards in family.scale_groups(modules):  # a merged layer too (StableLM's qkv_proj: vLLM asserts the same)
        if len({modules[s].is_quantized for s in shards}) < 2:
            continue
        algo = next((a for s in shards if (a := declared_algorithm(declaration, family, s)) is not None), None)
        if algo is None:
            continue  # built unquantized: a packed shard is the excluded-but-packed contradiction, reported as such
        plain = [s for s in shards if not modules[s].is_quantized]
        leaf = fused.rpartition(".")[2]
        loader = SHARD_LOADER.get(leaf, DEFAULT_LOADER)
        names = [s.rpartition(".")[2] for s in shards]
        same_shape = built(algo) == "fp8_block"  # a float8 [out, in] parameter: the shard's rows are cast into it
        what, error = (("is cast into the float8 parameter, its rows of the block scales never filled: the runtime loads it "
                        "silently and the layer computes garbage", None) if same_shape else
                       ("does not fit its packed parameter, so loading stops", f"AssertionError: (no message) shape check in {loader} fails"))
        out.append(Finding(Severity.ERROR, Kind.FUSED_SHARDS, fused,
                           f"{fused}: {target.spec} builds {', '.join(names[:-1])} and {names[-1]} as one {algo} layer, but "
                           f"{', '.join(plain)} {'is' if len(plain) == 1 else 'are'} stored {modules[plain[0]].precision}, which "
                           f"{what}; dequantize every shard of it (fix --target does), or store every shard quantized",
                           error, repairs=tuple(s for s in shards if modules[s].is_quantized)))
    return out


def said_by_fused(findings: list[Finding], modules: dict[str, StoredModule], family: Architecture) -> set[str]:
    """The shards of every layer a fused-shards error names: that error is their whole account (excluding one shard
    apart is no repair: vLLM refuses a fused layer's shards excluded apart, and builds a merged one BF16 for all)."""
    fused = {f.subject for f in findings if f.code == Kind.FUSED_SHARDS}
    return {s for layer, shards in family.scale_groups(modules) if layer in fused for s in shards} if fused else set()
