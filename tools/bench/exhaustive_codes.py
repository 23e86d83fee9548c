"""One-off proof check (~5 min): the quantizer's E2M1 code table against ModelOpt's searchsorted rule
(`nvfp4._e2m1_codes`, the rule tests/test_codec_nvfp4.py checks against ModelOpt) for all 2^32
float32 bit patterns.

    .venv/bin/python -m tools.bench.exhaustive_codes
"""

from __future__ import annotations

import time

import torch

from repair.codec import nvfp4


def main() -> None:
    torch.set_num_threads(1)
    start, bad, step = time.time(), 0, 1 << 24
    for first in range(-(2**31), 2**31, step):
        bits = torch.arange(first, first + step, dtype=torch.int64).to(torch.int32)
        want = nvfp4._e2m1_codes(bits.view(torch.float32))
        got = nvfp4._codes_by_table(bits, torch.empty_like(bits), torch.empty_like(bits), torch.empty(step, dtype=torch.uint8))
        bad += int((want != got).sum())
    print(f"all 2^32 float32 bit patterns checked: {bad} mismatches ({time.time() - start:.0f} s)")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
