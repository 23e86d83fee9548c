#!/usr/bin/env python
"""Ask SGLang 0.5.23 what it does with checkpoints, on CPU. Run with the .venv-sglang python (tools/sglang_env.sh).

    sglang_probe.py load DIR [DIR ...] [--digests] [--tp-size N --tp-rank R]
    sglang_probe.py rules CASES.json

`load`: for each DIR, one JSON line on stdout, in order (tools/sglang_load.py):
    {"dir": DIR, "ok": true|false, "quant_config": "ModelOptFp4Config", "architecture": "...",
     "layers": {prefix: {"class": "QKVParallelLinear", "method": "ModelOptFp4LinearMethod", "scheme": "nvfp4",
                         "fused": ["q_proj", "k_proj", "v_proj"] | null}},
     "owners": {param: module prefix}, "routes": {checkpoint tensor: [params it was loaded into]},
     "shard_ids": {checkpoint tensor: shard id given to a fused layer's loader}, layers also carry "asked" (the prefix
     the constructor asked the quant config about),
     "skipped": [checkpoint tensors no weight loader received], "params": {...} (--digests)}
    failed lines add "stage" ("build" | "load"), "error_type" and "error" (str(exception), verbatim).
The model is SGLang's own class for the checkpoint, built by its own constructor with the quantization config
SGLang's loader makes (tools/sglang_runtime.py), so each layer's method is what its get_quant_method chose;
then SGLang's own load_weights runs on the checkpoint's tensors. With --tp-size/--tp-rank, every linear and
vocab-parallel layer is built and loaded as rank R of N (tools/sglang_runtime.tensor_parallel).

`rules`: one line {"answers": [SGLang's decision per case], "packed_modules_mapping": {arch: mapping}}
(tools/sglang_rules_probe.py): what a rules data file claims, asked of SGLang's own functions.

SGLang's logs go to stderr (fd 1 is pointed at fd 2; the JSON lines go to a private copy of stdout). Exit 0
when every DIR / case produced a line; 3 when SGLang itself cannot be set up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _private_stdout():
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    loading = sub.add_parser("load")
    loading.add_argument("dirs", nargs="+")
    loading.add_argument("--digests", action="store_true")
    loading.add_argument("--tp-size", type=int, default=1)
    loading.add_argument("--tp-rank", type=int, default=0)
    sub.add_parser("rules").add_argument("cases")
    args = parser.parse_args(argv)
    out = _private_stdout()
    try:
        from tools import sglang_runtime  # (stubs, environment)
    except Exception:
        traceback.print_exc()
        return 3
    if args.command == "load":
        from tools import sglang_load

        sglang_runtime.tensor_parallel(args.tp_size, args.tp_rank)
        for d in args.dirs:
            out.write(json.dumps(sglang_load.load(d, args.digests)) + "\n")
    else:
        from tools import sglang_rules_probe

        cases = json.loads(Path(args.cases).read_text())
        out.write(json.dumps({"answers": sglang_rules_probe.answers(cases),
                              "packed_modules_mapping": sglang_rules_probe.packed_mappings()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
