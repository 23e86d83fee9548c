"""Print, as one JSON line, the model types the installed SGLang's config reader knows: its transformers' CONFIG_MAPPING
after SGLang's get_config module is imported (which registers SGLang's own config classes), with `_CONFIG_REGISTRY`'s
keys, and what get_config says for each config folder given. Runs in SGLang's venv; imports nothing from `repair`;
the SGLang tier compares it with tools/sglang_config_types.py's reading of the wheel."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import sglang_stubs  # noqa: E402
from tools.raised_by import reraise_ours  # noqa: E402

sglang_stubs.install()

import transformers  # noqa: E402
from sglang.srt.utils.hf_transformers import common  # noqa: E402
from sglang.srt.utils.hf_transformers_utils import get_config  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402


def said(folder: str) -> str:
    try:
        return f"read: {type(get_config(folder, trust_remote_code=False)).__name__}"
    except Exception as exc:  # noqa: BLE001 - the release's own refusal, in its words
        reraise_ours(exc)
        return f"{type(exc).__name__}: {exc}"


print(json.dumps({"transformers": transformers.__version__, "known": sorted(set(CONFIG_MAPPING.keys()) | set(common._CONFIG_REGISTRY)),
                  "said": {folder: said(folder) for folder in sys.argv[1:]}}))
