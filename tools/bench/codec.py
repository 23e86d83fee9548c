"""Our NVFP4 codec against ModelOpt's NVFP4QTensor on one weight, alternating, outputs asserted equal."""

from __future__ import annotations

import statistics
import time


def codec_bench(n: int, repeats: int) -> dict:
    import torch

    from repair.codec import nvfp4
    from tools.modelopt_export import modelopt_dequantize, modelopt_quantize

    weight = (torch.randn(n, n, generator=torch.Generator().manual_seed(0)) * 0.05).bfloat16()
    modelopt_quantize(weight[:16])  # import ModelOpt (~10 s) outside the timings
    default_threads = torch.get_num_threads()

    def modelopt_threads(threads):
        def run(fn):
            torch.set_num_threads(threads)
            try:
                return fn()
            finally:
                torch.set_num_threads(default_threads)
        return run

    packed = nvfp4.quantize(weight)
    ops = {
        "quantize": {"ours": lambda: nvfp4.quantize(weight), "ModelOpt": lambda: modelopt_quantize(weight)},
        "dequantize": {"ours": lambda: nvfp4.dequantize(*packed), "ModelOpt": lambda: modelopt_dequantize(*packed)},
    }
    result: dict = {"shape": [n, n], "threads": default_threads}
    for op, fns in ops.items():
        times: dict[str, list[float]] = {"ours": [], "ModelOpt": [], "ModelOpt, 1 thread": []}
        outs = {}
        for _ in range(repeats):
            for label, call in (("ours", fns["ours"]), ("ModelOpt", fns["ModelOpt"]),
                                ("ModelOpt, 1 thread", lambda: modelopt_threads(1)(fns["ModelOpt"]))):
                start = time.perf_counter()
                outs[label] = call()
                times[label].append(time.perf_counter() - start)
        _assert_same(op, outs["ours"], outs["ModelOpt"])
        result[op] = {k: statistics.median(v) for k, v in times.items()}
    return result


def _assert_same(op: str, ours, theirs) -> None:
    import torch

    if op == "quantize":
        same = torch.equal(ours[0], theirs[0]) and torch.equal(ours[1].view(torch.uint8), theirs[1].view(torch.uint8)) \
            and torch.equal(ours[2].reshape(()), theirs[2].reshape(()))
    else:
        same = torch.equal(ours.view(torch.int16), theirs.view(torch.int16))
    if not same:
        raise AssertionError(f"{op}: our output differs from ModelOpt's")
