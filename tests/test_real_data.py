"""The real-world config files under tests/data/real stay readable, documented and meaningful.

They are copies of published checkpoints' configs that fixtures are built from; a broken or
undocumented copy would make every fixture built on it unverifiable.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REAL = Path(__file__).resolve().parent / "data" / "real"
PROVENANCE = REAL / "PROVENANCE.md"
FOLDERS = sorted(p for p in REAL.iterdir() if p.is_dir())


def provenance_sections() -> dict[str, str]:
    """Map each `## <folder>` heading of PROVENANCE.md to the text of its section."""
    parts = re.split(r"^## (\S+)\s*$", PROVENANCE.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def quantization_declaration(folder: Path) -> dict | None:
    """The folder's quantization block: config.json's first, as vLLM reads it, then hf_quant_config.json's."""
    config = folder / "config.json"
    if config.exists() and "quantization_config" in json.loads(config.read_text()):
        block = json.loads(config.read_text())["quantization_config"]
        return block.get("quantization", block)  # ModelOpt's raw {"producer", "quantization"} form (its EAGLE exporter)
    hf_quant = folder / "hf_quant_config.json"
    if hf_quant.exists():
        return json.loads(hf_quant.read_text()).get("quantization")
    bare = folder / "quantization_config.json"
    return json.loads(bare.read_text()) if bare.exists() else None


def test_there_is_real_data():
    assert len(FOLDERS) >= 7


@pytest.mark.parametrize("path", sorted(REAL.rglob("*.json")), ids=lambda p: str(p.relative_to(REAL)))
def test_every_json_file_parses(path):
    assert isinstance(json.loads(path.read_text()), dict)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_folder_and_file_is_documented(folder):
    sections = provenance_sections()
    assert folder.name in sections, f"{folder.name}: no '## {folder.name}' section in PROVENANCE.md"
    for path in folder.iterdir():
        assert f"`{path.name}`" in sections[folder.name], f"{folder.name}/{path.name} is not described"


def test_every_documented_folder_exists():
    assert sorted(provenance_sections()) == [f.name for f in FOLDERS]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_folder_declares_its_quantization(folder):
    declaration = quantization_declaration(folder)
    assert declaration, f"{folder.name}: no hf_quant_config.json, config.json quantization_config or quantization_config.json"
    if "quant_method" in declaration:
        assert declaration["quant_method"] in {"modelopt", "compressed-tensors", "fp8"}
        assert declaration.get("config_groups") or declaration.get("quant_algo")
    else:
        assert declaration["quant_algo"] in {"NVFP4", "MIXED_PRECISION"}
