"""Ways to copy a file and hash it, by CPU seconds: what `io/hashing.py` chose, measured against the others.

    .venv/bin/python -m tools.bench.copy_variants FILE [--rounds 3] [--shift BYTES]

Each variant copies FILE to FILE.copy (removed, and dirty pages flushed, before each run) and prints the
process's CPU (user + system, all threads) per run, variants alternating round by round. --shift writes the
copy that many bytes further into FILE.copy, as a rewritten shard's copied tensors land at the input's offsets
plus the change in the header's size: copy_file_range costs ~60% more CPU when the two offsets differ modulo
64 KiB (the page cache's large folios are then written in two pieces each; BENCHMARKS, #27.3 fifth pass).
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import resource
from pathlib import Path

CHUNK = 16 << 20


def buffer_hash_write(src: int, dst: int, size: int, shift: int) -> None:
    """pread into a buffer, hash it, write it: the bytes hashed are the bytes written, twice through user space."""
    digest, buffer, offset = hashlib.sha256(), bytearray(CHUNK), 0
    while offset < size:
        view = memoryview(buffer)[:os.preadv(src, [buffer], offset)]
        digest.update(view)
        os.pwrite(dst, view, offset + shift)
        offset += view.nbytes


def kernel_copy_pread_back(src: int, dst: int, size: int, shift: int) -> None:
    """copy_file_range, then pread the output's new bytes back and hash them."""
    digest, buffer, offset = hashlib.sha256(), bytearray(CHUNK), 0
    while offset < size:
        n = os.copy_file_range(src, dst, min(CHUNK, size - offset), offset, offset + shift)
        digest.update(memoryview(buffer)[:os.preadv(dst, [memoryview(buffer)[:n]], offset + shift)])
        offset += n


def kernel_copy_mapped_back(src: int, dst: int, size: int, shift: int) -> None:
    """copy_file_range, then hash the output's new bytes through a read-only mapping (what io/hashing does)."""
    digest, offset = hashlib.sha256(), 0
    while offset < size:
        n = os.copy_file_range(src, dst, min(CHUNK, size - offset), offset, offset + shift)
        at = offset + shift
        base = at - at % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(dst, at + n - base, offset=base, access=mmap.ACCESS_READ) as window:
            digest.update(memoryview(window)[at - base:])
        offset += n


def kernel_copy_only(src: int, dst: int, size: int, shift: int) -> None:
    offset = 0
    while offset < size:
        offset += os.copy_file_range(src, dst, min(CHUNK, size - offset), offset, offset + shift)


VARIANTS = {f.__name__: f for f in (buffer_hash_write, kernel_copy_pread_back, kernel_copy_mapped_back, kernel_copy_only)}


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shift", type=int, default=0, help="bytes the copy lands further into the output than in the input")
    args = parser.parse_args()
    copy = args.file.with_name(args.file.name + ".copy")
    runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, variant in VARIANTS.items():
            copy.unlink(missing_ok=True)
            os.sync()
            src, dst = os.open(args.file, os.O_RDONLY), os.open(copy, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            before = cpu()
            variant(src, dst, os.fstat(src).st_size, args.shift)
            runs[name].append(round(cpu() - before, 2))
            os.close(src)
            os.close(dst)
    copy.unlink(missing_ok=True)
    for name, seconds in runs.items():
        print(f"{name}: CPU s {seconds}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
