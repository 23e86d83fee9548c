"""BENCHMARKS.md from the figures of one run: a summary of every target, then the details."""

from __future__ import annotations


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def _ok(met: bool) -> str:
    return "met" if met else "**missed**"


def render(r: dict) -> str:
    s1, runs = r["31b"], r["31b"]["runs"]
    floor = runs["floor"]["s"]
    torch_rss = r["torch_rss_mb"]
    budget = {k: torch_rss + 2 * mb + 100 for k, mb in s1["largest_mb"].items()}
    ms = r["multi-shard"]
    ms4 = max(ms.values(), key=lambda v: len(v["runs"]["fix"]["runs"]))  # the size measured in every round (4 GB)
    growth_budget = torch_rss + 2 * r["growth_largest_mb"] + 100
    growth_rss = [v["runs"]["fix"]["rss_mb"] for layout in ("multi-shard", "one shard") for v in r[layout].values()]
    # "flat": no growth between the two largest sizes (smaller inputs may not yet run every copy thread at once)
    growth = max(_rss_at_largest(r[layout], 0) - _rss_at_largest(r[layout], 1) for layout in ("multi-shard", "one shard"))
    c = r["codec"]
    ins = r["inspect"]["runs"]
    json_s = ins['python -c "import json"']["s"]
    rows = [
        ("1", "fix, 31B shapes, default recipe", "<= 1.3x floor", _ratio(runs["fix"]["s"], floor), runs["fix"]["s"] / floor <= 1.3),
        ("1", "fix --target bf16, 31B shapes", "<= 1.3x floor", _ratio(runs["fix --target bf16"]["s"], floor), runs["fix --target bf16"]["s"] / floor <= 1.3),
        ("2", f"fix, {ms4['gb']:.1f} GB multi-shard", "<= 1.15x floor", _ratio(ms4["runs"]["fix"]["s"], ms4["runs"]["floor"]["s"]),
         ms4["runs"]["fix"]["s"] / ms4["runs"]["floor"]["s"] <= 1.15),
        ("3", f"dequantize {c['shape']} vs ModelOpt", ">= 2x faster", _ratio(c["dequantize"]["ModelOpt"], c["dequantize"]["ours"]), c["dequantize"]["ModelOpt"] / c["dequantize"]["ours"] >= 2),
        ("3", f"quantize {c['shape']} vs ModelOpt", ">= 2x faster", _ratio(c["quantize"]["ModelOpt"], c["quantize"]["ours"]), c["quantize"]["ModelOpt"] / c["quantize"]["ours"] >= 2),
        ("4", "naive load+save / fix", "report", _ratio(runs["naive load_file + save_file"]["s"], runs["fix"]["s"]), True),
        ("4", "compressed-tensors / fix --target bf16", "report", _ratio(runs["compressed-tensors convert_checkpoint"]["s"], runs["fix --target bf16"]["s"]), True),
        ("5", "max RSS, fix (31B)", f"<= {budget['fix']:.0f} MB", f"{runs['fix']['rss_mb']:.0f} MB", runs["fix"]["rss_mb"] <= budget["fix"]),
        ("5", "max RSS, fix --target bf16 (31B)", f"<= {budget['fix --target bf16']:.0f} MB", f"{runs['fix --target bf16']['rss_mb']:.0f} MB", runs["fix --target bf16"]["rss_mb"] <= budget["fix --target bf16"]),
        ("5", "max RSS, fix, 1-8 GB (both layouts)", f"<= {growth_budget:.0f} MB; flat: <= +10 MB from 4 to 8 GB",
         f"{min(growth_rss):.0f}-{max(growth_rss):.0f} MB; {round(growth) + 0:+d} MB from 4 to 8 GB", max(growth_rss) <= growth_budget and growth <= 10),
        ("6", f"inspect, {r['inspect']['shards']} shards", "<= 3x `import json`", _ratio(ins["ckpt-repair inspect"]["s"], json_s), ins["ckpt-repair inspect"]["s"] / json_s <= 3),
    ]
    cmd = ".venv/bin/python tools/benchmark.py" + (" --quick" if r["quick"] else "")  # from the repository root
    out = [
        "# Benchmarks", "",
        f"Reproduce: `{cmd}` (writes this file; {r['minutes']:.1f} min). Every figure below is from that one run"
        f" ({r['started']}): Python {r['python']}, torch {r['torch']} CPU, {r['threads']} torch threads, 2 cores, 24 GiB, ext4.",
        f"Load average (1/5/15 min) at start {r['load_start']}, at end {r['load_end']}: other sessions share the 2 cores.",
        f"Contenders alternate, {r['repeats']} rounds (medians; single runs where marked). Page cache warm for all (cannot be dropped here).",
        "floor = `python -c \"import torch\"` then `cp -r SRC DST`.", "",
        "## Summary", "", "| # | what | target | measured | |", "|---|---|---|---|---|",
    ]
    out += [f"| {n} | {what} | {target} | {got} | {_ok(met) if target != 'report' else ''} |" for n, what, target, got, met in rows]
    out += ["", f"## 1, 4, 5. The 31B-assistant-shape checkpoint ({s1['gb']:.2f} GB, one shard)", "",
            "| command | median s | all runs s | x floor | x fix | max RSS MB |", "|---|---|---|---|---|---|"]
    for name, v in runs.items():
        out.append(f"| {name} | {v['s']:.2f} | {', '.join(f'{t:.2f}' for t in v['runs'])} | {_ratio(v['s'], floor)} | {_ratio(v['s'], runs['fix']['s'])} | {v['rss_mb']:.0f} |")
    out += ["", f"RSS budget = torch import RSS ({torch_rss:.0f} MB) + 2 x largest changed tensor in BF16"
            f" ({s1['largest_mb']['fix']:.1f} MB default, {s1['largest_mb']['fix --target bf16']:.1f} MB bf16) + 100 MB.", ""]
    out += _compare_lines(s1["compare"])
    out += ["", "Where the time goes (one in-process run each, main-thread wall s; hashing threads overlap these):", ""]
    out += _phase_table({**{k: v for k, v in s1["phases"].items()}, f"{ms4['gb']:.1f} GB multi-shard": ms4.get("phases")})
    out += ["", "## 2, 5. Growing checkpoints: changed tensors in one 0.65 GB shard, plus 512 MiB filler tensors", "",
            "multi-shard: filler in extra shards (copied whole). one shard: filler inside the changed shard (copied tensor by tensor).", "",
            "| layout | size GB | floor s | fix s | x floor | rounds | floor RSS MB | fix RSS MB |", "|---|---|---|---|---|---|---|---|"]
    for layout in ("multi-shard", "one shard"):
        for v in r[layout].values():
            f, o = v["runs"]["floor"], v["runs"]["fix"]
            out.append(f"| {layout} | {v['gb']:.2f} | {f['s']:.2f} | {o['s']:.2f} | {_ratio(o['s'], f['s'])} | {len(o['runs'])} | {f['rss_mb']:.0f} | {o['rss_mb']:.0f} |")
    out += ["", f"## 3. NVFP4 codec on {c['shape']} vs ModelOpt `NVFP4QTensor` (CPU; outputs asserted bit-identical)", "",
            f"Ours runs its chunk loop on one thread; ModelOpt runs with torch's default ({c['threads']} threads), and on 1 thread for reference.", "",
            "| op | ours s | ModelOpt s | speed-up | ModelOpt 1 thread s | speed-up |", "|---|---|---|---|---|---|"]
    for op in ("dequantize", "quantize"):
        v = c[op]
        out.append(f"| {op} | {v['ours']:.3f} | {v['ModelOpt']:.3f} | {_ratio(v['ModelOpt'], v['ours'])} | {v['ModelOpt, 1 thread']:.3f} | {_ratio(v['ModelOpt, 1 thread'], v['ours'])} |")
    out += ["", f"## 6. Header-only commands on a {r['inspect']['shards']}-shard checkpoint", "",
            "| command | median s | x `import json` | max RSS MB |", "|---|---|---|---|"]
    for name, v in ins.items():
        out.append(f"| {name} | {v['s']:.3f} | {_ratio(v['s'], json_s)} | {v['rss_mb']:.0f} |")
    out += ["", "`inspect` and `doctor` never import torch: tests/test_doctor.py asserts it (their RSS above shows it too).", ""]
    if "many_tensors" in r:
        out += many_tensors_section(r["many_tensors"])
    if "jobs" in r:
        from tools.bench.jobs import jobs_section

        out += jobs_section(r["jobs"])
    if "multitarget" in r:
        from tools.bench.multitarget import multitarget_section

        out += multitarget_section(r["multitarget"])
    return "\n".join(out)


MANY_TENSORS_HEADING = "## 7. "
MANY_TENSORS_TARGETS = {"inspect": (10, 500), "doctor": (10, 500), "fix --dry-run": (20, None)}  # seconds, max RSS MB


def many_tensors_section(m: dict) -> list[str]:
    """Section 7: the DeepSeek-R1-sized header-only checkpoint (tools/bench/many_tensors.py)."""
    out = [f"{MANY_TENSORS_HEADING}Header-only commands on {m['tensors']:,} tensors in {m['shards']} shards (DeepSeek-R1 NVFP4 layout)", "",
           f"Reproduce: `{m['command']}` (rewrites only this section; {m['minutes']:.1f} min). Measured {m['started']}, "
           f"load average at start {m['load_start']}, at end {m['load_end']} (other sessions share the 2 cores); "
           f"median of {m['repeats']} runs, page cache warm.", "",
           f"{m['layers']} MoE layers x {m['experts']} experts x 3 projections x 4 tensors (packed weight, block scales, weight_scale_2, "
           "input_scale), plus 3 dense layers, attention, norms and router. Scale bytes are real; packed weights are file holes. "
           f"Expert shapes are scaled down to [{m['expert_shape'][0]}, {m['expert_shape'][1]}] so doctor's block-scale reads are "
           f"{m['scale_mb']:.0f} MB, not the ~40 GB of the real model (see Findings). `fix --dry-run` uses {m['recipe']}.", "",
           "| command | target | median s | all runs s | max RSS MB | |", "|---|---|---|---|---|---|"]
    for name, v in m["runs"].items():
        seconds, rss = MANY_TENSORS_TARGETS[name]
        target = f"<= {seconds} s" + (f", <= {rss} MB" if rss else "")
        met = v["s"] <= seconds and (rss is None or v["rss_mb"] <= rss)
        out.append(f"| {name} | {target} | {v['s']:.2f} | {', '.join(f'{t:.2f}' for t in v['runs'])} | {v['rss_mb']:.0f} | {_ok(met)} |")
    return out + [""]


def splice_many_tensors(text: str, section: list[str]) -> str:
    """BENCHMARKS.md with section 7 replaced (or added before the Findings), everything else as it was."""
    body, findings = (text.split("\n## Findings", 1) + [""])[:2]
    if MANY_TENSORS_HEADING in body:
        body = body[: body.index(MANY_TENSORS_HEADING)].rstrip("\n") + "\n"
    findings = "\n## Findings" + findings if findings else ""
    return body.rstrip("\n") + "\n\n" + "\n".join(section) + findings


def _rss_at_largest(series: dict, rank: int) -> float:
    """fix's max RSS at the largest (rank 0) or second-largest (rank 1) input of a series."""
    ordered = sorted(series.values(), key=lambda v: v["gb"], reverse=True)
    return ordered[min(rank, len(ordered) - 1)]["runs"]["fix"]["rss_mb"]


def _compare_lines(compare: dict) -> list[str]:
    out = ["Outputs against ours, tensor by tensor (bitwise):", ""]
    for name, v in compare.items():
        text = f"- {name}: {v['same']} tensors identical, {len(v['differing'])} differ"
        if v["differing"]:
            share = v["differing_elements"] / max(v["elements_in_differing"], 1)
            text += f" ({v['differing_elements']:,} of their {v['elements_in_differing']:,} elements, {share:.1%}; max relative difference {v['max_rel_diff']:.2g})"
        if v["only_ours"] or v["only_theirs"]:
            text += f"; only ours: {len(v['only_ours'])}, only theirs: {len(v['only_theirs'])}"
        text += f"; their files: {', '.join(v['files_theirs'])}"
        out.append(text)
    return out


def _phase_table(runs: dict) -> list[str]:
    runs = {k: v for k, v in runs.items() if v}
    labels: list[str] = []
    for v in runs.values():
        labels += [k for k in v["spent"] if k not in labels]
    out = ["| phase | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    out.append("| process wall | " + " | ".join(f"{v['wall (process)']:.2f}" for v in runs.values()) + " |")
    out.append("| until execute() starts (startup, imports, plan) | " + " | ".join(f"{v['marks'].get('execute starts', 0):.2f}" for v in runs.values()) + " |")
    for label in labels:
        cells = [v["spent"].get(label) for v in runs.values()]
        out.append(f"| {label} | " + " | ".join("-" if x is None else f"{x:.2f}" for x in cells) + " |")
    return out
