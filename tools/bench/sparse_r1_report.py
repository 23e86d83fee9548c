"""BENCHMARKS.md section 8 (the sparse DeepSeek-R1 cases of #27.6) from tools/bench/sparse_r1_bench.py's figures."""

from __future__ import annotations

HEADING = "## 8. "
LOCAL = {"inspect (local)": (None, None), "doctor (local)": (15, 500)}  # seconds, MB read


def section(m: dict) -> list[str]:
    a, d = m["runs"], m["deep"]
    out = [f"{HEADING}DeepSeek-R1 NVFP4 at its real size: inspect and doctor, local and through the Hub server (#27.6)", "",
           f"Reproduce: `{m['command']}` (rewrites only this section; {m['minutes']:.1f} min). Measured {m['started']}, load average "
           f"at start {m['load_start']}, at end {m['load_end']} (other sessions share the 2 cores); median of {m['repeats']} runs, "
           "page cache warm.", "",
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
    out += ["", f"doctor's line about block scales on the Hub: `{a['doctor line']}`", "",
            f"`--deep` on a slice of R1 (its first 8 layers: {d['shards']} shards with block scales, {d['block_scale_gb']:.2f} GB of "
            "block scales, every byte real), against `dd` of exactly those byte ranges (a `cat` of them), alternated:", "",
            "| command | target | median s | all runs s | ratio | max RSS MB | requests | served GB | |", "|---|---|---|---|---|---|---|---|---|"]
    ours = d["doctor --deep (local)"]
    ratio = ours["s"] / d["cat s"]
    out.append(f"| dd of the block-scale bytes | floor | {d['cat s']:.2f} | {', '.join(f'{t:.2f}' for t in d['cat runs'])} | 1.00x | - | - | - | |")
    out.append(f"| doctor --deep (local) | <= 1.2x floor | {ours['s']:.2f} | {', '.join(f'{t:.2f}' for t in ours['runs'])} | {ratio:.2f}x | "
               f"{ours['rss_mb']:.0f} | - | - | {_ok(ratio <= 1.2)} |")
    h = d["doctor --deep (Hub, 30 ms)"]
    out.append(f"| doctor --deep (Hub, 30 ms; one run) | bounded concurrency; reports its requests and bytes | {h['s']:.2f} | {h['s']:.2f} | "
               f"{h['s'] / d['cat s']:.2f}x | {h['rss_mb']:.0f} | {h['requests']} (reported: {h['reported_requests']}) | "
               f"{h['bytes'] / 1e9:.2f} (reported: {h['reported_bytes'] / 1e9:.2f}) | |")
    return out + [""]


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


def splice(text: str, lines: list[str]) -> str:
    """BENCHMARKS.md with section 8 replaced (or added before the Findings), everything else as it was."""
    body, findings = (text.split("\n## Findings", 1) + [""])[:2]
    if HEADING in body:
        head, rest = body.split(HEADING, 1)
        tail = rest.split("\n## ", 1)
        body = head.rstrip("\n") + ("\n\n## " + tail[1] if len(tail) > 1 else "\n")
    findings = "\n## Findings" + findings if findings else ""
    return body.rstrip("\n") + "\n\n" + "\n".join(lines) + findings
