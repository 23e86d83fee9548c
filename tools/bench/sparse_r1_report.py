"""BENCHMARKS.md section 8 (the sparse DeepSeek-R1 cases of #27.6) from tools/bench/sparse_r1_bench.py's figures."""

from __future__ import annotations

HEADING = "## 8. "
DEEP_HEADING = "## 8.1. "
DEEP_METHOD = ("The floor is `dd` of exactly those byte ranges (a `cat` of them, one process, one core). **cold** drops the slice's "
               "pages from the page cache before each run (POSIX_FADV_DONTNEED, after a sync): both read the disk, as they must "
               "for the real R1, whose 41.6 GB of block scales do not fit in this machine's 24 GiB; this is the case the issue's "
               "target is about. **warm** reads the page cache. `doctor` without `--deep`, alternated beside them, is doctor's "
               "fixed cost on the slice (imports, headers, every other check); scan = doctor --deep - doctor.")
LOCAL = {"inspect (local)": (None, None), "doctor (local)": (15, 500)}  # seconds, MB read


def section(m: dict) -> list[str]:
    a = m["runs"]
    out = [f"{HEADING}DeepSeek-R1 NVFP4 at its real size: inspect and doctor, local and through the Hub server (#27.6)", "",
           _measured(m, "runs, page cache warm."), "",
           f"`tools/bench/sparse_r1.py`: {a['shards']} shards, 180,730 tensors, 44,849 NVFP4 modules at DeepSeek-R1's real shapes, "
           f"{a['apparent_gb']:.0f} GB apparent, {a['on_disk_mb']:.0f} MB on disk: headers, float32 scalars and the first and last "
           "4 KiB of each block-scale tensor hold bytes (the pages doctor's sample reads), everything else is a hole. Shards are laid "
           "out as safetensors' writer lays them out (float32 first, then BF16, float8, uint8). Hub: tools/hub_server with 30 ms "
           "added per request, and each shard GET answered by a redirect that is then followed (as the Hub sends LFS files to its "
           "CDN): both count. read MB = the process's rchar (bytes its read/pread calls returned: files; the Hub's bytes are "
           "in served MB). CPU s = user + system: with other sessions on the 2 cores, wall time here is mostly waiting.", "",
           "| command | target | median s | all runs s | CPU s | read MB | max RSS MB | requests (shards + other) | served MB | temp peak MB | |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, v in a.items():
        if not isinstance(v, dict):
            continue
        hub = "Hub" in name
        target, met = _target(name, v)
        reqs = f"{v['requests']} ({v['shard_requests']} + {v['other_requests']})" if hub else "-"
        first = f"| {name} | {target} | {v['s']:.2f} | {', '.join(f'{t:.2f}' for t in v['runs'])} | {v['cpu_s']:.2f} | {v['read_mb']:.1f} | "
        out.append(first + (f"{v['rss_mb']:.0f} | {reqs} | {v['bytes'] / 1e6:.1f} | {v['tmp_mb']:.1f} |" if hub else f"{v['rss_mb']:.0f} | - | - | - |"))
        out[-1] += f" {met} |"
    return out + ["", f"doctor's line about block scales on the Hub: `{a['doctor line']}`", ""]


def deep_section(m: dict) -> list[str]:
    """Section 8.1: `doctor --deep` against `dd` of the same bytes, warm and cold, with plain doctor (its fixed cost)."""
    d = m["deep"]
    slice_ = (f"A slice of the R1 layout of section 8, its first {d['layers']} layers: {d['shards']} shards holding "
              f"{d['block_scale_gb']:.2f} GB of block scales, every byte real (the whole R1's 41.6 GB does not fit on this disk). ")
    out = [f"{DEEP_HEADING}`doctor --deep` against `cat` of the block-scale bytes (#27.1)", "",
           _measured(m, "alternated runs. CPU s = user + system of the whole process."), "", slice_ + DEEP_METHOD, "",
           "| cache | contender | median s | all runs s | CPU s | read GB | ratio to dd | target | |", "|---|---|---|---|---|---|---|---|---|"]
    for cache in ("cold", "warm"):
        c = d[cache]
        floor = c["dd"]["s"]
        for name, v in c.items():
            target, met = {"dd": ("floor", ""), "doctor --deep": ("<= 1.2x dd", _ok(v["s"] <= 1.2 * floor)), "doctor": ("fixed cost", "")}.get(
                name, ("reads the block scales once", _ok(v["read_mb"] < 1.1 * c["doctor --deep"]["read_mb"])))
            read = f"{v['read_mb'] / 1e3:.2f}" if name != "dd" else f"{d['block_scale_gb']:.2f}"
            out.append(f"| {cache} | {name} | {v['s']:.2f} | {', '.join(f'{t:.2f}' for t in v['runs'])} | {v['cpu_s']:.2f} | {read} | "
                       f"{v['s'] / floor:.2f}x | {target} | {met} |")
        scan = c["doctor --deep"]["s"] - c["doctor"]["s"]
        out.append(f"| {cache} | the scan alone (deep - plain) | {scan:.2f} | | "
                   f"{c['doctor --deep']['cpu_s'] - c['doctor']['cpu_s']:.2f} | | {scan / floor:.2f}x | report | |")
    h = d["doctor --deep (Hub, 30 ms)"]
    out += ["", f"Through the Hub server (30 ms per request; one run): {h['s']:.2f} s, {h['requests']} requests (doctor reported "
            f"{h['reported_requests']}: the redirects are the client's), {h['bytes'] / 1e9:.2f} GB served (reported "
            f"{h['reported_bytes'] / 1e9:.2f} GB), {h['rss_mb']:.0f} MB max RSS.", ""]
    return out


def _measured(m: dict, how: str) -> str:
    return (f"Reproduce: `{m['command']}` (rewrites only this section; {m['minutes']:.1f} min). Measured {m['started']}, load average "
            f"at start {m['load_start']}, at end {m['load_end']} (other sessions share the 2 cores); median of {m['repeats']} {how}")


def _target(name: str, v: dict) -> tuple[str, str]:
    if name == "doctor (local)":
        return "<= 15 s, <= 500 MB read", _ok(v["s"] <= 15 and v["read_mb"] <= 500)
    if name == "doctor (Hub, 30 ms)":
        shards = 163
        ok = v["s"] <= 60 and v["shard_requests"] <= 8 * shards and v["bytes"] <= 100e6 and v["rss_mb"] <= 500 and v["tmp_mb"] <= 100
        return "<= 60 s, <= 8 requests per shard + small files, <= 100 MB, <= 500 MB RSS, <= 100 MB temp", _ok(ok)
    return "report", ""


def _ok(met: bool) -> str:
    return "met" if met else "**missed**"


def splice(text: str, lines: list[str], heading: str = HEADING) -> str:
    """BENCHMARKS.md with section `heading` (8 or 8.1) replaced (or added before the Findings), everything else as it was."""
    body, findings = (text.split("\n## Findings", 1) + [""])[:2]
    if heading in body:
        head, rest = body.split(heading, 1)
        tail = rest.split("\n## ", 1)
        body = head.rstrip("\n") + ("\n\n## " + tail[1] if len(tail) > 1 else "\n")
    findings = "\n## Findings" + findings if findings else ""
    return body.rstrip("\n") + "\n\n" + "\n".join(lines) + findings
