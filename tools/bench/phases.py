"""Where `fix` spends its wall time: run it in-process with the main phases timed.

    python -X importtime -m tools.bench.phases SRC OUT RESULT.json [fix flags...]

Times are the main thread's wall seconds in each phase; hashing threads overlap them. The torch
import time comes from -X importtime (stderr), read by the caller.
"""

from __future__ import annotations

import json
import sys
import time

START = time.perf_counter()


def main() -> None:
    src, out, result, *flags = sys.argv[1:]
    import repair.doctor.diagnose
    import repair.execute.copies as copies
    import repair.execute.writer as ex
    import repair.io.atomic as atomic
    import repair.io.hashing as hashing

    spent: dict[str, float] = {}
    marks: dict[str, float] = {}

    def wrap(owner, name: str, label: str, first: str | None = None) -> None:
        real = getattr(owner, name)

        def timed(*args, **kwargs):
            begin = time.perf_counter()
            if first and first not in marks:
                marks[first] = begin - START
            try:
                return real(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - begin
        setattr(owner, name, timed)

    wrap(ex, "execute", "execute", first="execute starts")
    wrap(copies.WholeCopies, "digest", "whole-shard copies (copy + sha256)")
    wrap(ex, "_rewrite", "rewritten shards (copy, compute, output sha256; torch import if needed)")
    wrap(hashing.HashedOutput, "close", "  of which: waiting for the output's sha256")
    wrap(ex, "_self_check", "self-check of written headers")
    wrap(repair.doctor.diagnose, "diagnose", "doctor before/after (report)")
    wrap(atomic, "fsync_tree", "fsync of the output")
    from repair.cli import main as cli

    try:
        cli(["fix", src, "-o", out, "--quiet", *flags])
    except SystemExit as stop:
        if stop.code:
            raise
    spent["total (in process)"] = time.perf_counter() - START
    with open(result, "w") as fh:
        json.dump({"spent": spent, "marks": marks}, fh, indent=1)


def torch_import_seconds(importtime_stderr: str) -> float | None:
    """Cumulative seconds of the top-level `import torch` in -X importtime output."""
    for line in importtime_stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip() == "torch":
            return int(parts[1]) / 1e6
    return None


if __name__ == "__main__":
    main()
