#!/usr/bin/env bash
# Creates the separate SGLang test-consumer venv used by tools/sglang_probe.py and tests/sglang/.
#
#   tools/sglang_env.sh            # -> ./.venv-sglang (override with SGLANG_VENV=...)
#
# What it does (skipped when its stamp exists):
#   1. python -m venv $SGLANG_VENV
#   2. pip install -r tools/sglang_requirements.txt torch==2.13.0   (every package pinned; torch in the SAME
#      command: any other torch request pulls a multi-GB CUDA build; 2.13.0+cpu is the build on this machine)
#   3. pip install --no-deps sglang==0.5.23   (its declared deps are CUDA-only: torch 2.14.1, flashinfer,
#      sgl-kernel, cuda-python, ...; the pure-Python ones it needs here are in the requirements file)
#   4. import check, with the GPU-only modules (torchvision, sgl_kernel, flashinfer, vllm) answered by the
#      project's import-time stand-ins (tools/sglang_stubs.py; nothing in site-packages is edited)
# SGLANG_USE_CPU_ENGINE must stay unset for the tier (it pads instead of failing); this script refuses it.
# Takes ~1 minute idle (8 measured on 2 shared cores) and ~2.5 GB the first time (triton ~1 GB); a rerun exits at once.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SGLANG_VENV="${SGLANG_VENV:-$REPO_ROOT/.venv-sglang}"
PYTHON_BIN="${PYTHON:-python3}"
SGLANG_VERSION="0.5.23"
TORCH_PIN="torch==2.13.0"
REQUIREMENTS="$REPO_ROOT/tools/sglang_requirements.txt"

say() { echo "[sglang_env] $*" >&2; }
die() { echo "[sglang_env] ERROR: $*" >&2; exit 1; }
trap 'rc=$?; [ $rc -ne 0 ] && echo "[sglang_env] FAILED (exit $rc) at line $LINENO: $BASH_COMMAND" >&2' ERR

[ -z "${SGLANG_USE_CPU_ENGINE:-}" ] || die "SGLANG_USE_CPU_ENGINE is set: its loaders pad instead of failing, so the tier would not see SGLang's GPU-path errors; unset it"
[ -f "$REQUIREMENTS" ] || die "missing $REQUIREMENTS"

say "venv: $SGLANG_VENV"
PY="$SGLANG_VENV/bin/python"
STAMP="$SGLANG_VENV/.stamp-sglang-$SGLANG_VERSION-$(sha256sum "$REQUIREMENTS" | cut -c1-12)"

[ -f "$STAMP" ] && [ -x "$PY" ] && { say "already complete (stamp $STAMP); delete it to redo the install and checks"; exit 0; }

# 1. venv (kept when it exists: pip below brings it to the pins)
[ -x "$PY" ] || "$PYTHON_BIN" -m venv "$SGLANG_VENV" \
    || die "$PYTHON_BIN -m venv $SGLANG_VENV failed (is python3-venv installed? is the folder writable?)"
PIP=("$PY" -m pip install --disable-pip-version-check -q --no-compile)  # bytecode is written on first import

# 2. pinned pure-Python deps + triton + CPU torch, in one command
start=$(date +%s)
say "pip install -r $(basename "$REQUIREMENTS") $TORCH_PIN (~1 minute, ~2.5 GB)"
"${PIP[@]}" -r "$REQUIREMENTS" "$TORCH_PIN" \
    || die "pip install of the pinned requirements failed (package registry unreachable, or a pin no longer published?)"

# 3. sglang itself, without its CUDA dependencies
say "pip install --no-deps sglang==$SGLANG_VERSION"
"${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION" || die "pip install --no-deps sglang==$SGLANG_VERSION failed"
say "pip took $(( $(date +%s) - start )) s"

torch_v="$("$PY" -c 'import torch; print(torch.__version__)')" || die "torch does not import in $SGLANG_VENV"
case "$torch_v" in
    2.13.0+cpu) say "torch $torch_v" ;;
    *) die "torch is $torch_v, expected 2.13.0+cpu (a CUDA torch was pulled in?)" ;;
esac

# 4. import check: what the tier uses
say "checking imports (~10 s)"
"$PY" - "$REPO_ROOT" <<'EOF' || die "import check failed: SGLang does not import with the stand-ins (see the traceback above)"
import sys, time
sys.path.insert(0, sys.argv[1])
t = time.time()
from tools import sglang_runtime  # noqa: F401  (installs the stand-ins)
import sglang
from sglang.srt.layers import linear  # noqa: F401
from sglang.srt.layers.quantization import modelopt_quant  # noqa: F401
from sglang.srt.layers.quantization.compressed_tensors import utils  # noqa: F401
print(f"[sglang_env] sglang {sglang.__version__}, import {time.time() - t:.1f} s", file=sys.stderr)
EOF

rm -f "$SGLANG_VENV"/.stamp-sglang-*
touch "$STAMP"
say "done: $PY"
