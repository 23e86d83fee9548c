"""docs/runtime_profiles.md from the shipped runtime profiles (repair/targets/data/*.json): coverage, and why not.

    python -m tools.profile_report            # rewrite docs/runtime_profiles.md
tests/test_profile_data.py fails when the document and the data disagree, so it is regenerated with the data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "repair" / "targets" / "data"
DOC = ROOT / "docs" / "runtime_profiles.md"
REFUSED = "vLLM refuses the config transformers writes"  # tools/vllm_profile.py: its own code raised (`build_refused`)
NO_LAYOUT = "no checkpoint layout to learn"  # tools/vllm_saved_names.py NO_LAYOUT
UNBUILT = "transformers' own class cannot build or save it"  # tools/vllm_profile.py UNBUILT
NO_PLACE = "vLLM's own loader has no place for the names transformers' class writes"  # tools/vllm_load_refused.py
CPU_IMPLEMENTATION = "vLLM builds its CPU implementation of it on this host"  # tools/vllm_gpu_stand_ins.py
REMOTE = ("transformers ships no model class of this name, nor vLLM a config class its model reads (its config comes "
          "with remote code)")  # tools/vllm_profile_configs.py REMOTE
LEARNED = "learned from vLLM's model code"  # tools/vllm_remote_configs.py: a row's config.source; an unprofiled reason
# a kernel or backend only a GPU host has (the CPU attention backend refuses chunk_lookback, rnj1.py, and alibi_sqrt,
# step1.py, which those models pass to every Attention they build, whatever the config)
GPU_ONLY = ("not supported on CPU", "sparse MLA backend", "triton", "dummy base class", "cutlass", "CPUAttentionBackendImpl",
            "backend CPU_ATTN")


def category(reason: str) -> str:
    if reason.startswith(REMOTE) and any(marker in reason for marker in GPU_ONLY):
        return "needs a GPU-only kernel or backend to build"
    if reason.startswith(REMOTE) or reason.startswith("transformers has no config class"):
        return "no config class in transformers nor one vLLM's model reads (remote code)"
    if reason.startswith(REFUSED):
        return "the release's own model code refuses to build it from transformers' config (`build_refused`: doctor says so)"
    if reason.startswith(NO_LAYOUT):
        return ("no checkpoint layout to learn (no transformers class writes its names, and vLLM's own names hold fused "
                "experts, or its mapper renames the published names, or its load_weights refuses its own names)")
    if reason.startswith(UNBUILT):
        return "transformers' own class cannot build or save it at the small size (no checkpoint names to learn)"
    if reason.startswith(NO_PLACE):
        return "vLLM's loader takes none of the names transformers' class writes (no checkpoint layout to learn)"
    if reason.startswith(CPU_IMPLEMENTATION):
        return "vLLM builds another class on a CPU host than on a GPU (the row would be the CPU's)"
    if any(marker in reason for marker in GPU_ONLY):
        return "needs a GPU-only kernel or backend to build"
    if "cannot import" in reason:
        return "vLLM cannot import its model file on this host"
    return "vLLM or transformers refuses the shrunk transformers config"


def section(doc: dict, name: str) -> list[str]:
    archs, missing = doc["architectures"], doc["unprofiled"]
    learned = sorted(a for a, e in archs.items() if e["config"]["source"].startswith(LEARNED))
    shipped = len(archs) - len(learned)
    remote = len(learned) + sum(1 for r in missing.values()
                                if category(r).startswith("no config class") or LEARNED in r or r.startswith(REMOTE))
    with_config = shipped + len(missing) - (remote - len(learned))
    asked = doc["registered"] + doc.get("registered_multimodal", 0)
    lines = [f"## {doc['runtime']} {doc['release']} (`repair/targets/data/{name}`)", "",
             f"- registered text-generation architectures: {doc['registered']}",
             *([f"- multimodal *ForConditionalGeneration classes (built with their towers): {doc['registered_multimodal']}"]
               if "registered_multimodal" in doc else []),
             f"- profiled: **{len(archs)} of {asked}**; of the {with_config} whose config class ships with "
             f"transformers or vLLM: **{shipped} of {with_config} ({100 * shipped // max(with_config, 1)}%)**",
             *([f"- of the {remote} whose config class comes with remote code only, learned from vLLM's own model code "
                f"(tools/vllm_remote_configs.py): **{len(learned)} of {remote}**: " + ", ".join(f"`{a}`" for a in learned)]
               if learned else []),
             f"- quantization config used: `{json.dumps(doc['quantization'], sort_keys=True)}`",
             "- MTP drafters: " + (", ".join(f"`{a}` ({e['mtp'].get('architecture') or 'not built: ' + e['mtp']['unbuilt'][:60]})"
                                             for a, e in sorted(archs.items()) if "mtp" in e) or "none"),
             *refused_lines(doc), *variant_lines(doc), *registry_lines(doc), *fused_lines(doc), *mapper_lines(doc),
             *sparsity_lines(doc), "",
             "Profiled: " + ", ".join(f"`{a}`" for a in sorted(archs)) + ".", "", "Not profiled, and why:", ""]
    by_category: dict[str, list[str]] = {}
    for arch, reason in sorted(missing.items()):
        by_category.setdefault(category(reason), []).append(arch)
    for cat, names in sorted(by_category.items()):
        lines.append(f"- {cat} ({len(names)}):")
        bare = [a for a in names if cat.startswith("no config") and missing[a] == REMOTE]
        lines += ["  - " + ", ".join(f"`{a}`" for a in bare)] if bare else []
        lines += [f"  - `{a}`: {missing[a].splitlines()[0].removeprefix(REMOTE + '; ')[:160]}" for a in names if a not in bare]
    return lines + [""]


def registry_lines(doc: dict) -> list[str]:
    """Which listed name the release builds (tools/vllm_registry.py): its whole registry and what else it does."""
    if "registry" not in doc:
        return []
    return [f"- whole registry (the names `resolve_model_cls` builds a class of, the first listed one it has): "
            f"{len(doc['registry'])}; unregistered names its Transformers backend takes (`transformers_fallback`): "
            f"{len(doc['transformers_fallback'])}; any other is refused: `{doc['unsupported']}` (or, for "
            f"{len(doc['retired'])} retired names, their own message)"] + ([
            f"- none listed (absent, null or []): the class named from model_type, transformers' base model of "
            f"{len(doc['unlisted']['classes'])} model types (`unlisted`, its get_config), built as listed; any other "
            f"model_type is refused: `{doc['unlisted']['refused']}`"] if "unlisted" in doc else [])


def fused_lines(doc: dict) -> list[str]:
    """How the release tests an exclusion list for a layer it fuses from checkpoint shards (`fused_exclusions`,
    tools/vllm_fused_exclusions.py, run on its own exclusion functions)."""
    found = doc.get("fused_exclusions") or {}
    return [f"- a layer fused from checkpoint shards (`fused_exclusions`): {kind} tests " + ", then ".join(
        f"`{step}`" for step in facts["steps"]) + f"; shards that disagree: `{facts['mixed']}`"
        for kind, facts in sorted(found.items())]


def sparsity_lines(doc: dict) -> list[str]:
    """A compressed-tensors sparsity_config the release refuses while reading the config (`ct_sparsity_refused`,
    tools/vllm_ct_sparsity.py, its own `_parse_sparsity_config` asked)."""
    fact = doc.get("ct_sparsity_refused") or {}
    return [f"- refuses a compressed-tensors `sparsity_config` whose targets name anything, while reading the config "
            f"(`ct_sparsity_refused`): `{fact['error']}` ({fact['where']})"] if fact else []


def mapper_lines(doc: dict) -> list[str]:
    """The classes whose build hands the quant config a weight-name mapper (`exclusion_mappers`, tools/
    vllm_exclusion_mappers.py): ModelOpt then splits an entry `X*` into `X` and `X.*`; those whose mapper renames."""
    with_mapper = {a: e["exclusion_mappers"] for a, e in sorted(doc["architectures"].items()) if "exclusion_mappers" in e}
    if not with_mapper:
        return []
    renaming = [a for a, maps in with_mapper.items() if any(maps)]
    return [f"- hand their quant config a weight-name mapper, which rewrites its lists (`exclusion_mappers`; ModelOpt "
            f"splits `X*` into `X` and `X.*`): {len(with_mapper)} of {len(doc['architectures'])}; renaming: "
            + ", ".join(f"`{a}`" for a in renaming)] + mixed_key_lines(doc)


WORDS = {"is": "is", "includes": "holds", "any_case": "is, in any case,", "starts_with": "starts with",
         "other_than": "is not"}  # tools/vllm_variants.py's condition kinds


def mixed_key_lines(doc: dict) -> list[str]:
    """Whether a ModelOpt MIXED_PRECISION config's quantized_layers keys are renamed by that mapper too
    (`modelopt_mixed_keys`, tools/vllm_mixed_keys.py, its own ModelOptMixedPrecisionConfig asked)."""
    fact = doc.get("modelopt_mixed_keys") or {}
    return [f"- renames a ModelOpt MIXED_PRECISION config's `quantized_layers` keys with that mapper (`modelopt_mixed_keys`): "
            f"`{fact['mapped']}` ({fact['at']})"] if fact else []


def refused_lines(doc: dict) -> list[str]:
    """The profiled architectures the release loads no checkpoint of (`load_refused`, tools/vllm_load_refused.py)."""
    if not doc.get("load_refused_checked"):
        return []
    refused = {a: e["load_refused"] for a, e in sorted(doc["architectures"].items()) if "load_refused" in e}
    return ["- loads no checkpoint of (its own loader on transformers' BF16 checkpoint fails in the model's load_weights, "
            "`load_refused`): " + (", ".join(f"`{a}` (`{why[:100]}`)" for a, why in refused.items()) or "none")]


def variant_lines(doc: dict) -> list[str]:
    """Rows with another build for another value of a config field (`variants`), and build refusals a config field
    lifts (`build_refused` `unless`): tools/vllm_variants.py, the model built again with the field varied."""
    def said(c: dict) -> str:
        kind = next((k for k in WORDS if k in c), "other_than")
        return f"`{c['field']}` {WORDS[kind]} `{json.dumps(c[kind], sort_keys=True)}`"
    built = [f"`{a}` where {said(v)} (built: " + ", ".join(f"`{m.rpartition('.')[2]}`" for m in sorted(set(v["modules"]) - set(e["modules"])))
             + ")" for a, e in sorted(doc["architectures"].items()) for v in e.get("variants", ())]
    lifted = [f"`{a}`'s refusal lifted where " + " or ".join(said(u) for u in f["unless"])
              for a, f in sorted(doc.get("build_refused", {}).items()) if f.get("unless")]
    return (["- another build for another value of a config field (`variants`, tools/vllm_variants.py): " + "; ".join(built)]
            if built else []) + (["- a build refusal a config field lifts (`build_refused` `unless`): " + "; ".join(lifted)]
                                 if lifted else [])


def render() -> str:
    head = ["# Runtime profiles: what each runtime release builds, generated from its own model code", "",
            "Generated by `python -m tools.profile_report` from the data files, which `tools/vllm_profile.py` writes",
            "(run in the vLLM tier's venv). For each registered architecture it builds the model class on the meta",
            "device with a quantization config that quantizes everything it can, and records per module-name pattern",
            "whether vLLM built the layer quantized, unquantized or with no quant method, the fused layers",
            "(`packed_modules_mapping`) and the weight-name mapping (`hf_to_vllm_mapper`). `inspect`, `doctor` and `fix`",
            "read the rows (`repair/arch/profiled.py`); an architecture without a profile gets the generic row, and",
            "`doctor` says it has no loader profile and what it checked. Where the config has MTP layers, the drafter",
            "vLLM builds for `speculative_config={\"method\": \"mtp\"}` (DeepSeekMTP, Qwen3_5MTP, ...) is profiled with it",
            "(`mtp`); a layer vLLM's NVFP4 method cannot build (in features not a multiple of 16) is excluded and named",
            "(`nvfp4_refused`). The vLLM tier writes a tiny ModelOpt NVFP4 export of every profiled architecture and",
            "checks `inspect`, `doctor` and `fix` against vLLM's own loader on it (tests/vllm/test_generated_archs_vs_vllm.py).",
            ""]
    body, rules = [], []
    for path in sorted(DATA.glob("*.json")):
        doc = json.loads(path.read_text())
        if "rules" in doc:
            rules += rules_section(doc, path.name)
        else:
            body += section(doc, path.name)
    return "\n".join(head + body + (RULES_FORM + rules if rules else []))


RULES_FORM = [
    "## Rules-only release files (SGLang, TensorRT-LLM): the form", "",
    "A release of a runtime whose model classes cannot be built here is one file `repair/targets/data/<runtime>-<release>.json`:",
    "`runtime`, `release` (X.Y.Z), `source` (`wheel` or `repo`+`commit`, `files` read, `sha256`/`index`), and `rules`:", "",
    "- `matchers`: per config kind (`modelopt`, `compressed-tensors`, `quantized_layers`; 0.5.23 also `deepseek_v4_fp8`,",
    "  DeepSeek-V4's published fp8 form as its HybridFp8NvFp4Config reads it, with the config forms it reads otherwise",
    "  refused in one line: `READING_REFUSALS`, `repair/targets/sglang_dsv4_fp8.py`) a rule name registered in",
    "  `repair/targets/matchers.py` (`EXCLUSION_MATCHERS`, `LAYER_MATCHERS`); each is a function of the data;",
    "- `follows_draft_config`; `layer_rows` (the `vllm==X` profile whose layer roles and model fusions apply; not vLLM's own name facts: its `prefixes` other than the routed experts', `nvfp4_load_refused`, `dropped`, `load_refused`);",
    "- `fused`: `policy` (`raise_on_listed_mix`, `any_shard_excluded_bf16`), `error` (template, `{prefix}`), `wildcard`;",
    "- `fallback_fused`: the release treats qkv_proj/gate_up_proj as fused without the model's packed mapping;",
    "- `unknown_tensors`: `policy` (`raise`, `skip`, `log_skip`) and `text`; `refused_algorithms`: quant_algo -> error;",
    "- optional `refused_spared`: quant_algo -> {`model_types`, `architecture_prefixes`}: config.json classes the",
    "  release's config reader spares that refusal (0.5.10-0.5.14 read MIXED_PRECISION as modelopt_mixed for NemotronH);",
    "- `loaders`: per layer kind (`row_parallel`, `merged_column`, `qkv`, `column_parallel`, `replicated`; a routed",
    "  expert's shard: `moe_w13` for gate/up, `moe_w2` for down, where the release's row adds them) and",
    "  direction (`packed_into_bf16`, `bf16_into_packed`, ...): `zero_pad`, `silent_cast`, or an error template;",
    "- optional `missing_weights`: {`linear`, `norm`} -> `refused` | `unchecked`, what the release's loader does with a",
    "  weight the checkpoint does not store (SGLang 0.5.23: `unchecked`, probed by its tier); without it doctor claims",
    "  nothing about that runtime's check;",
    "- `draft`: `mtp_bf16_when` (architecture -> quant methods its MTP/NextN layer drops), `mtp_prefixes`;",
    "- `errors`: other exact error templates; `packed_modules_mapping`: architecture -> the class's mapping.",
    "- optional: `packed_when_config` (architecture -> {config key: mapping its `__init__` adds when the key is set},",
    "  DeepSeek's q_lora_rank), `stacked_unchecked` (architecture -> stacked layers whose load_weights branch raises",
    "  KeyError on a tensor the built layer lacks), `nested_config_json_drops_exclusions` (quant methods whose nested",
    "  config.json exclusions the release never reads), `null_exclusions_refused` (quant method -> the error reading",
    "  the config raises when the exclusion list it reads is null), `plain_layers` (architecture -> layers built as a plain",
    "  torch.nn.Linear, loaded by the `plain` loader row), `built_layers` (architecture -> {the release's own layer",
    "  prefix, `*` for a layer number: its class}, in construction order: what its constructor asks the quant config",
    "  about where its names are not the checkpoint's, e.g. DeepSeek-V4's `model.layers.*.self_attn.wqkv_a`; generated",
    "  from the installed release's model code on the meta device by `tools/sglang_built_layers.py`, kept when",
    "  `tools/sglang_rules_data.py` rewrites the file; doctor asks each one: `doctor/built_layers.py`; a fusion of the",
    "  layer rows whose leaf names none of them is the rows' runtime's, not built: vLLM's DeepSeek-V4 `fused_wqa_wkv`,",
    "  whose shards SGLang's rules are then asked as themselves: `RuntimeRules.building`), `layer_names`",
    "  (architecture -> {checkpoint module pattern: the name the release's exclusion rules ask for the layer it loads",
    "  into, where the two differ}, e.g. Gemma 4's vision `...self_attn.q_proj.linear` -> `...self_attn.q_proj`, a shard",
    "  of the QKVParallelLinear asked as `...self_attn.qkv_proj`; generated from the installed release's own load of each",
    "  real-config fixture by `tools/sglang_layer_names.py`, kept likewise; doctor matches and fix writes exclusions",
    "  under these names: `targets/layer_names.py`), `transformers_backend` (what the release's Transformers backend",
    "  does with listed names its `registry` lacks: `takes`, `refuses` {its error, `{architecture}` for the name: names},",
    "  `missing` (its error for a name transformers lacks), `auto_map` {key: its error when that code does not load},",
    "  `asks` (`each` listed name, or the `first`), `skips` (leading words a name passes unasked with), `unanswered`",
    "  (classes that did not import where recorded: no refusal claimed), `unlisted` {form: its error for an `architectures`",
    "  naming no class first: absent, null, [], a mapping, \"\", a string, a number, a first entry no string; `entry_not_a_string`: any entry, none registered}; asked of",
    "  SGLang's own `resolve_transformers_arch` (and ModelConfig, for `unlisted`) on every top-level",
    "  name of the transformers beside it by `tools/sglang_backend.py`, kept likewise; read by `arch/registry.py`",
    "  `Backend`), `own_layers` (architecture -> module suffixes its model builds as",
    "  their own layer though the layer rows' leaf fusion names them a shard: TensorRT-LLM's Afmoe `self_attn.gate_proj`)",
    "  and `model_fusions` (architecture -> {fused leaf: shards} its model builds where the layer rows' runtime builds",
    "  separate layers: TensorRT-LLM's Laguna GatedMLP `gate_up_proj`); both read from the release's model source",
    "  (tests/data/trtllm/PROVENANCE.md); `registry_rule` (a release that asks its `registry` about the FIRST listed",
    "  name only, with no fallback: `listed: first`, `unsupported` its error with `{architecture}` for that name,",
    "  `renamed` {`key`, `prefix`, `cut`}: the name a config carrying `key`, an EAGLE-3 draft's, is asked under), written",
    "  with `registry` and its provenance (`source.registry`: tag, commit, files read) by `tools/trtllm_registry.py`",
    "  from TensorRT-LLM's own source at the release's tag; read by `arch/resolved.py` `FirstListed`;",
    "- optional `experts_gate_up_scale_2`: quant method -> what its NVFP4 MoE keeps of a routed expert's gate (w1) and up",
    "  (w3) global scales: `keeps` (`gate`/`up`) and `log` where every backend does the same (vLLM's form); where it",
    "  depends on a run-time choice, `backends` {MoE runner backend or scheme: `keeps` (`gate`, `up`, `both`) and `log`,",
    "  or `refuses` (its error) with `test` `exact`}, `default` [{`backend`, `when`}] (the release's own automatic choice by",
    "  GPU), `option` (the flag that picks one), `precisions` (the built precisions it was read for) and `by_precision`",
    "  {built precision: a fact of the same form} (another precision's own scheme: a weight-only one); written from",
    "  each SGLang wheel by `tools/sglang_expert_scales.py` (ast), read by `doctor/expert_scales.py`;",
    "- optional `moe_scheme_refused`: quant method -> {declared algorithm: `error`, `where`}: a routed-experts layer the",
    "  release's MoE scheme choice has no scheme for, so it refuses the model while building it (SGLang's compressed-",
    "  tensors `get_moe_scheme`: its own predicates, compiled from the wheel, asked of compressed-tensors' preset), and",
    "  `built_by`, the later releases (read from their wheels) that fall back to this file but build it (none since",
    "  0.5.13-0.5.22 ship their own files); written by",
    "  `tools/sglang_moe_schemes.py`, read by `doctor/moe_schemes.py`;",
    "- optional `linear_scheme_refused`: the same for every other quantized layer (SGLang's `_get_scheme_from_parts`, its",
    "  predicates asked in order, inside its activation-format gate as the wheel's utils.py reads the format the producer",
    "  writes); written by `tools/sglang_linear_schemes.py`, read by `doctor/moe_schemes.py`, which names the first",
    "  layer the build meets (layer 0's attention before its experts); in both, `<algorithm> in mixed-precision`: a config",
    "  group carrying its own format in a config whose top-level format is `mixed-precision` (compressed-tensors' when",
    "  the groups' formats differ), asked with the format the release's scheme map reads for it (`map_reads`: 0.5.9-0.5.16",
    "  the top-level one, so the group's input activations are dropped and the Linear gate is shut; 0.5.17+ the group's);",
    "- `ct_target_order`: the passes compressed-tensors' `find_matched_target` tries a config-group target in (`name`,",
    "  `class`, `fused`; formats/ct_groups.py), read from the wheel's compressed_tensors/utils.py by",
    "  `tools/sglang_rules_data.py`;",
    "- optional `sparse_24_refused`: quant method -> {`error`, `where`, `refused` {sparsity format: schemes}}: a Linear a",
    "  2:4 `sparsity_config` targets, built with one of those schemes (`BF16`: one the quantization config ignores), is",
    "  refused while built (SGLang's `get_linear_scheme` where its own `supports_cutlass_24` holds, compiled from the",
    "  wheel and asked by `tools/sglang_sparse24.py`); read by `doctor/sparse_24.py`;",
    "- optional `moe_backend_overrides`: architecture -> [{`backend`, `when`, `where`}]: a model's own server-arg",
    "  override of the MoE runner backend, applied before the quant method's automatic choice, its conditions quoted as",
    "  SGLang writes them (srt/arg_groups/model_overrides/); written by `tools/sglang_moe_overrides.py` (ast), named by",
    "  `doctor/expert_scales.py` before the defaults for the class the release builds;",
    "- optional `dropped_in_layers`: architecture -> {checkpoint module pattern: {`where`: a per-layer list of",
    "  config.json, `in`: its values, optionally `unless_listed`: lists of layer numbers}, or a list of such rules}:",
    "  the release's own model builds the module in no layer whose entry is one of them, except the layers every",
    "  `unless_listed` list names (SGLang 0.5.23's DeepSeek-V4 compressor and indexer by `compress_ratios`; V4.1's at",
    "  ratios 1 and 2 only in `kv_source_layer_ids` / `index_source_layer_ids` layers), learned from its constructor by",
    "  `tools/sglang_layer_drops.py` (vLLM's where_rules: built again with the list rotated; V4.1's lists: built again",
    "  with an unbuilt layer added to them); `doctor/missing.py`",
    "  expects no such module there, as it does with a vLLM row's own rule (vLLM's rows lent to it are not its build);",
    "- optional `registry_renamed`: model_type -> {listed name: the one name the release's own config class writes over",
    "  a one-name `architectures`}, asked of each class SGLang registers with every name another shipped release",
    "  registers and it does not (`tools/sglang_registry_renames.py`; 0.5.23: `deepseek_v41`'s `DeepseekV41ForCausalLM`",
    "  is built as `DeepseekV4ForCausalLM`, `olmo3`'s `Olmo3ForCausalLM` as `Olmo2ForCausalLM`, and three classes",
    "  write their own over any name; key `\"\"`: config.json lists none, e.g. `olmo3` then builds `Olmo2ForCausalLM`);",
    "  `arch/registry.py` resolves the written name;",
    "- optional `layer_values_refused`: architecture -> {`field`, `by_model_type`: {model_type: {`accepts`, `refused`:",
    "  {`error` (`{value}` as `shown`: str or repr), `where`}, `past_depth`, `short`: {`error`, `where`}}}}: the values",
    "  of a per-layer config.json list the release builds, and its refusal of any other whole number or string and of",
    "  a list shorter than the decoder (SGLang 0.5.23's DeepSeek-V4 `compress_ratios`: `deepseek_v4` refused by",
    "  transformers' config class, `deepseek_v41` by its attention's assert), learned from its own build by",
    "  `tools/sglang_layer_values.py`; `doctor/layer_values.py` says that one refusal and nothing else;",
    "- optional `config_model_types`: {`transformers`, `known`, `error`, `where`}: the model_types the release's config",
    "  reader knows (the transformers release its wheel pins, CONFIG_MAPPING_NAMES read from that wheel, plus SGLang's own",
    "  registered config classes and the types its get_config catches), and AutoConfig's refusal of any other; written",
    "  from the wheels by `tools/sglang_config_types.py`; `doctor/config_types.py` says that one refusal and nothing else",
    "  (SGLang 0.5.9-0.5.11 and DeepSeek-V4's `deepseek_v4`).", "",
    "`--target <runtime>==X.Y.Z` uses the newest file at or below X.Y.Z and says which. `tools/sglang_rules_data.py`",
    "writes the SGLang files from the wheels (rules table: `tools/sglang_rules_table.py`, re-checked against each wheel;",
    "a release whose row is `same_as` another takes that row only where every `RULE_CODE` unit, the rule-bearing files",
    "and methods, is the same code, ast for ast, in both wheels: 0.5.12 is 0.5.11's).", "",
    "### SGLang 0.5.13-0.5.22", "",
    "Each has its own file, every generator run on its own wheel (tests/test_sglang_release_files.py checks each file",
    "against what they read, where the wheels are at hand). Each release's `RULE_CODE` differs from the release before",
    "it, so each has a row of its own in `tools/sglang_rules_table.py` (none is `same_as`). What changes, by release:",
    "",
    "- 0.5.13: `_module_path_match` strips a trailing `.` (quantization/utils.py:53-54): `sglang_modelopt_dotted`;",
    "- ModelOptFp4Config.from_config refuses a quant_algo outside its list: NVFP4_AWQ and W4A16_NVFP4 to 0.5.16,",
    "  W4A16_NVFP4 in 0.5.17/0.5.18, none from 0.5.19 (0.5.10-0.5.12 refuse both too; their rows do not say so yet);",
    "- model_config.py reads MIXED_PRECISION as w4afp8 to 0.5.14 (but for NemotronH, `refused_spared`), as modelopt_mixed from 0.5.15 where a",
    "  quantized_layers entry is NVFP4/W4A16_NVFP4 (an FP8-only map is still w4afp8 there, unrecorded, as for 0.5.23);",
    "- `_quantized_layer_prefix_candidates` from 0.5.15 (`sglang_layers_language_swaps`: lm_head, the VL text stack's",
    "  two spellings), with `model.` <-> `model.language_model.` from 0.5.20 (`sglang_layers_aliases`);",
    "- compressed-tensors' ignore entries: substring to 0.5.16, exact or dotted suffix from 0.5.17 (`sglang_ct_suffix`);",
    "  the group's own format read from 0.5.17 (`linear_scheme_refused`/`moe_scheme_refused`); the weight-only NVFP4",
    "  schemes from 0.5.22;",
    "- `experts_gate_up_scale_2`: read for 0.5.13 (0.5.12's shape) and 0.5.21/0.5.22 (0.5.23's); 0.5.14-0.5.20's NVFP4",
    "  MoE method is a shape tools/sglang_expert_scales.py does not read (it stops), so those files claim nothing;",
    "- not carried over from 0.5.23's row, which its tier probed: `missing_weights`, the routed-expert loaders, the",
    "  DeepSeek-V4 fp8 form (`deepseek_v4_fp8`: its HybridFp8NvFp4Config exists from 0.5.14, but its reading is",
    "  judged against `built_layers`, generated only from the installed 0.5.23), nor the installed-release blocks.", ""]


def rules_section(doc: dict, name: str) -> list[str]:
    rules = doc["rules"]
    return [f"### {doc['runtime']} {doc['release']} (`repair/targets/data/{name}`, from `{doc['source'].get('wheel') or doc['source'].get('repo')}`)", "",
            "- matchers: " + ", ".join(f"{k} `{v}`" for k, v in sorted(rules["matchers"].items())),
            f"- fused: {rules['fused']['policy']}; unknown tensors: {rules['unknown_tensors']['policy']}; "
            f"refuses: {', '.join(sorted(rules['refused_algorithms'])) or 'nothing'}",
            f"- model classes with a packed mapping: {len(rules.get('packed_modules_mapping', {}))}",
            f"- model registry: {len(rules['registry']) if 'registry' in rules else 'not recorded'}"
            + (f" (asks the first listed name only: `{rules['registry_rule']['unsupported']}`)" if 'registry_rule' in rules else ""),
            *expert_lines(rules.get("experts_gate_up_scale_2", {})),
            *(f"- refuses to build a {method} {algo} MoE: `{fact['error']}` ({fact['where']})"
              + (f"; built by {', '.join(fact['built_by'])}, which fall back to this file" if fact.get("built_by") else "")
              for method, algos in rules.get("moe_scheme_refused", {}).items() for algo, fact in algos.items()),
            *(f"- refuses to build a {method} {algo} Linear: `{fact['error']}` ({fact['where']})"
              + (f"; built by {', '.join(fact['built_by'])}, which fall back to this file" if fact.get("built_by") else "")
              for method, algos in rules.get("linear_scheme_refused", {}).items() for algo, fact in algos.items()),
            *(f"- refuses to build a 2:4 sparse {method} Linear built {' or '.join(schemes)} ({fmt}): `{fact['error']}` "
              f"({fact['where']})" for method, fact in rules.get("sparse_24_refused", {}).items()
              for fmt, schemes in fact["refused"].items()),
            *([f"- model-specific MoE backend overrides: {len(rules['moe_backend_overrides'])} architectures"]
              if rules.get("moe_backend_overrides") else []), ""]


def expert_lines(facts: dict) -> list[str]:
    """What each quant method's NVFP4 MoE keeps of a routed expert's gate/up global scales, by default condition."""
    out = []
    for method, fact in [*facts.items(), *((f"{m} {p}", f) for m, top in facts.items()
                                             for p, f in top.get("by_precision", {}).items())]:
        if "backends" in fact:
            keeps = {name: b.get("keeps") or "refuses" for name, b in fact["backends"].items()}
            told = "; ".join(f"{d['when']}: {d['backend']} ({keeps.get(d['backend'])})" for d in fact["default"])
            out.append(f"- routed experts' gate/up global scales, {method}: by default {told}; "
                       + ", ".join(f"{k} {v}" for k, v in sorted(keeps.items())))
        else:
            out.append(f"- routed experts' gate/up global scales, {method}: keeps the {fact['keeps']}'s on every backend")
    return out



if __name__ == "__main__":
    DOC.write_text(render())
    sys.exit(0)
