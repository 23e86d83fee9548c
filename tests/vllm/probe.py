"""Shared helpers of the vLLM consumer tier: running tools/vllm_probe.py, batching, expected tensors.

The probe runs in the separate .venv-vllm (tools/vllm_env.sh) as a subprocess. Importing vLLM costs
seconds per process, so each probe configuration (behaviour x TP size x TP rank x weights tracking)
loads every folder that needs it in ONE process: `ProbeRuns` maps a configuration to its folder list,
runs it lazily on first use (selecting a single test runs only the probes it needs) or, after
`prefetch()`, runs every configuration in the background, two processes at a time.

Expected per-rank tensors (`expected_params`) are computed from a checkpoint folder with the
safetensors library, independent of vLLM and of the project's own readers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("VLLM_VENV", REPO / ".venv-vllm"))
VLLM_PY = VLLM_VENV / "bin" / "python"
PROBE = REPO / "tools" / "vllm_probe.py"
LEGACY_FILE = VLLM_VENV / "legacy" / "gemma4_mtp_0_24.py"
PROBE_TIMEOUT_S = 1800

requires_vllm = pytest.mark.skipif(not VLLM_PY.exists(),
                                   reason=f"{VLLM_PY} does not exist (create it with tools/vllm_env.sh)")
needs_legacy = pytest.mark.skipif(not LEGACY_FILE.exists(),
                                  reason=f"{LEGACY_FILE} missing (tools/vllm_env.sh extracts it)")


# --------------------------------------------------------------------------------------------------------
# running the probe
# --------------------------------------------------------------------------------------------------------
class Run(NamedTuple):
    """One probe configuration; every folder listed for it loads in the same process."""

    behaviour: str  # "installed" (vLLM 0.32's gemma4_mtp.py) | "legacy" (0.24's)
    tp_size: int = 1
    tp_rank: int = 0
    weights_track: bool = True  # False: vLLM's default for quantized drafts (no missing-weights check)


def run_oracle(source: str) -> dict:
    """`source` run by the vLLM venv's python (tools/ on its sys.path as argv[1], no inherited PYTHONPATH/VIRTUAL_ENV):
    the last JSON line it emits."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", source, str(REPO / "tools")], env=clean, cwd="/", timeout=600,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_probe(dirs: list[Path], behaviour: str, tp_size: int, tp_rank: int, hash_: bool = True,
              weights_track: bool = True, traceback: bool = False) -> list[dict]:
    """One probe process over `dirs`; one result dict per dir. With `traceback`, failed results get
    "traceback": the traceback the probe printed for that dir (None if it cannot be told apart)."""
    cmd = [str(VLLM_PY), str(PROBE), "--behaviour", behaviour, "--tp-size", str(tp_size),
           "--tp-rank", str(tp_rank), "--draft", *map(str, dirs)]
    if hash_:
        cmd.append("--hash")
    if not weights_track:
        cmd.append("--no-weights-track")
    if traceback:
        cmd.append("--traceback")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, cwd="/")
    assert proc.returncode == 0, f"probe exited {proc.returncode}\nstderr tail:\n{proc.stderr[-4000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == len(dirs), f"expected {len(dirs)} JSON lines, got:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    for line, d in zip(lines, dirs):
        assert line["draft"] == str(d)
        assert isinstance(line["ok"], bool)
    if traceback:
        for line, segment in zip(lines, _per_dir_stderr(proc.stderr, dirs)):
            if not line["ok"]:
                found = segment.rfind("Traceback (most recent call last):") if segment else -1
                line["traceback"] = segment[found:] if found >= 0 else None
    return lines


def _per_dir_stderr(stderr: str, dirs: list[Path]) -> list[str | None]:
    """Split the probe's stderr at its per-dir log line ("[vllm_probe] DIR: draft arch=...")."""
    starts = [stderr.find(f"[vllm_probe] {d}: draft arch=") for d in dirs]
    out: list[str | None] = []
    for i, start in enumerate(starts):
        later = [s for s in starts[i + 1:] if s > start]
        out.append(stderr[start:later[0] if later else len(stderr)] if start >= 0 else None)
    return out


def innermost_function(tb: str | None) -> str | None:
    """The function of the innermost frame of a Python traceback text (where the exception was raised)."""
    frames = re.findall(r'^  File "[^"]+", line \d+, in (\S+)$', tb or "", flags=re.M)
    return frames[-1] if frames else None


class ProbeRuns:
    """`runs`: {Run (or a (behaviour, tp_size, tp_rank) tuple): [folder names]}; `folders`: {name: Path}.

    Calling it with a folder name and a configuration returns that folder's probe line, running the
    configuration's one process the first time it is needed.
    """

    def __init__(self, folders: dict[str, Path], runs: dict[tuple, list[str]], workers: int = 2,
                 traceback: bool = False):
        self.folders = folders
        self.traceback = traceback
        self.runs = {Run(*key): names for key, names in runs.items()}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vllm-probe")
        self._futures: dict[Run, Future] = {}

    def _run(self, run: Run) -> dict[str, dict]:
        names = self.runs[run]
        lines = run_probe([self.folders[n] for n in names], run.behaviour, run.tp_size, run.tp_rank,
                          weights_track=run.weights_track, traceback=self.traceback)
        return dict(zip(names, lines))

    def _future(self, run: Run) -> Future:
        if run not in self._futures:
            self._futures[run] = self._pool.submit(self._run, run)
        return self._futures[run]

    def prefetch(self) -> None:
        """Start every configuration now (legacy ones only when the legacy file exists)."""
        for run in self.runs:
            if run.behaviour != "legacy" or LEGACY_FILE.exists():
                self._future(run)

    def __call__(self, name: str, behaviour: str, tp_size: int = 1, tp_rank: int = 0,
                 weights_track: bool = True) -> dict:
        run = Run(behaviour, tp_size, tp_rank, weights_track)
        if behaviour == "legacy" and not LEGACY_FILE.exists():
            pytest.skip(f"{LEGACY_FILE} missing")
        assert run in self.runs and name in self.runs[run], f"{name} is not probed in {run}; add it to the runs"
        return self._future(run).result()[name]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def prefetch_when_many(request, runs: ProbeRuns, at_least: int = 8, modules: tuple[str, ...] | None = None) -> None:
    """In a full run of the calling module (or of `modules`, for a session fixture), start all its probe
    configurations at once (two processes at a time); when only a few of its tests are selected, keep them lazy."""
    def wanted(item) -> bool:
        module = getattr(item, "module", None)
        return module is request.module if modules is None else getattr(module, "__name__", None) in modules

    if sum(map(wanted, request.session.items)) >= at_least:
        runs.prefetch()


# --------------------------------------------------------------------------------------------------------
# expected per-rank tensors (vLLM names) from a checkpoint folder
# --------------------------------------------------------------------------------------------------------
COLUMN = (".self_attn.q_proj", ".mlp.gate_up_proj", "pre_projection", "embed_tokens")
ROW = (".self_attn.o_proj", ".mlp.down_proj", "post_projection")
# parameters vLLM adds to quantized attention layers by itself (k/v-cache and attention scales)
VLLM_OWN_PARAMS = re.compile(r"\.attn\.(q|k|v|prob)_scale$")


def read_all(path: Path) -> dict:
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                out[k] = sf.get_tensor(k)
    return out


def sha(t) -> str:
    import torch

    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def expected_params(folder: Path, tp_size: int = 1, tp_rank: int = 0) -> dict:
    """vLLM parameter name -> the per-rank tensor loaded from this checkpoint (BF16 or NVFP4 layers).

    2-D tensors (weights, fp8 block scales) are narrowed: column layers along dim 0, row layers along
    dim 1; gate/up shards are concatenated into gate_up_proj. Per-tensor scales (weight_scale_2,
    input_scale, 0-d on disk) become [1], or [2] (gate, up) on gate_up_proj.
    """
    import torch

    t = read_all(folder)
    mapped = {}
    for k, v in t.items():
        if k.endswith("layer_scalar"):
            continue  # a buffer in vLLM, not a parameter
        if k.startswith(("pre_projection.", "post_projection.")):
            k = "model." + k
        mapped[k] = v

    def place(v, dim):
        if v.ndim != 2:
            return v.reshape(1)
        n = v.shape[dim] // tp_size
        return v.narrow(dim, tp_rank * n, n)

    out = {}
    for k, v in mapped.items():
        module = k.rpartition(".")[0]
        if module.endswith(".mlp.gate_proj"):
            up = mapped[k.replace(".gate_proj.", ".up_proj.")]
            out[k.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat([place(v, 0), place(up, 0)], 0)
        elif module.endswith(".mlp.up_proj"):
            continue
        elif module.endswith(COLUMN):
            out[k] = place(v, 0)
        elif module.endswith(ROW):
            out[k] = place(v, 1)
        else:
            out[k] = v
    return out


def expected_buffers(folder: Path) -> dict:
    return {k: v for k, v in read_all(folder).items() if k.endswith("layer_scalar")}


def assert_tensors_match(got: dict, expected: dict, check_hash: bool, exact_names: bool = True,
                         ignore: re.Pattern | None = None) -> None:
    names = {n for n in got if not (ignore and ignore.search(n))}
    if exact_names:
        assert names == set(expected), (f"only in vLLM: {sorted(names - set(expected))}; "
                                        f"only in the checkpoint: {sorted(set(expected) - names)}")
    else:
        assert set(expected) <= names
    for name, t in expected.items():
        assert got[name]["shape"] == list(t.shape), name
        assert got[name]["dtype"] == str(t.dtype).replace("torch.", ""), name
        if check_hash:
            assert got[name]["sha256"] == sha(t), f"{name}: loaded bytes differ from the checkpoint's"


def assert_params_match(result: dict, expected: dict, check_hash: bool = True,
                        buffers: dict | None = None, ignore: re.Pattern | None = None) -> None:
    assert result["ok"], result
    assert_tensors_match(result["params"], expected, check_hash, ignore=ignore)
    if buffers is not None:
        # vLLM's own buffers (rotary caches are non-persistent, but attn._k_scale & co. are) ride along
        assert_tensors_match(result["buffers"], buffers, check_hash, exact_names=False)
