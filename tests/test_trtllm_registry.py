"""TensorRT-LLM's model registry: tools/trtllm_registry.py reads it from the release's source, and a `--target trtllm`
whose registry builds no class of config.json's FIRST listed name refuses the model in TensorRT-LLM's words.

TensorRT-LLM (modeling_auto.py `AutoModelForCausalLM.from_config`, 1.0 to main; read through the code index: NVIDIA/
TensorRT-LLM @ 01bffee125e24ebe5b4a63437840a9422eb70868 and its 1.0-era form, code index id 316476577) asks only
`architectures[0]` of the table `@register_auto_model` fills and raises `ValueError: Unknown architecture for
AutoModelForCausalLM: <name>` with no fallback. Its own git mirror cannot be fetched on this host (every snapshot is
over the fetch limit), so the generator is tested on a git repository laid out as the release's is, written here in
our own words (a model package whose __init__ imports its modules, decorators, a factory raising an f-string); the
shipped files' registries are checked against the real mirror when TRTLLM_MIRROR names one.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from repair.arch.registry import Builds, resolve
from repair.doctor import refused_load
from repair.targets import profiles
from repair.targets.runtime_rules import DATA, read_rules
from tests.conftest import run_captured
from tests.trtllm_helpers import doctor_json, findings
from tools import trtllm_registry as gen
from tools.real_fixture import write_real_model

PKG = "tensorrt_llm/_torch/models"
ERROR = "ValueError: Unknown architecture for AutoModelForCausalLM: {architecture}"
FILES = {  # a model package as the release lays it out (our own text: the shapes the generator reads)
    f"{PKG}/__init__.py": "from .modeling_auto import AutoModelForCausalLM\nfrom .modeling_qwen3 import Qwen3ForCausalLM\n"
                          "from . import modeling_mix\nfrom .checkpoints import HfLoader\n",
    f"{PKG}/modeling_utils.py": "TABLE = {}\n\ndef register_auto_model(name):\n    return lambda cls: TABLE.setdefault(name, cls)\n",
    f"{PKG}/modeling_qwen3.py": "from .modeling_utils import register_auto_model\nfrom .modeling_llama import Base\n\n"
                                "@register_auto_model('Qwen3ForCausalLM')\nclass Qwen3ForCausalLM(Base):\n    pass\n",
    f"{PKG}/modeling_llama.py": "from . import modeling_utils as mu\n\nclass Base:\n    pass\n\n"
                                "@mu.register_auto_model(\"LlamaForCausalLM\")\nclass Llama(Base):\n    pass\n\n"
                                "mu.register_auto_model('EAGLE3LlamaForCausalLM')(Llama)\n",
    f"{PKG}/modeling_mix.py": "from .modeling_utils import register_auto_model\nWHICH = 'X'\n\n"
                              "@register_auto_model(WHICH)\nclass Mix:\n    pass\n",
    f"{PKG}/modeling_unimported.py": "from .modeling_utils import register_auto_model\n\n"
                                    "@register_auto_model('GraniteForCausalLM')\nclass G:\n    pass\n",
    f"{PKG}/checkpoints/__init__.py": "from .modeling_hidden import HfLoader\n",
    f"{PKG}/modeling_hidden.py": "from .modeling_utils import register_auto_model\nregister_auto_model('HiddenForCausalLM')\n",
    f"{PKG}/modeling_auto.py": (
        "from .modeling_utils import TABLE\n\nclass AutoModelForCausalLM:\n    @staticmethod\n"
        "    def from_config(config):\n        arch = config.pretrained_config.architectures[0]\n"
        "        if hasattr(config.pretrained_config, 'draft_vocab_size'):\n"
        "            arch = 'EAGLE3' + arch.replace('Eagle3', '')\n        found = TABLE.get(arch)\n"
        "        if found is None:\n            raise ValueError(\n"
        "                f'Unknown architecture for AutoModelForCausalLM: {config.pretrained_config.architectures[0]}')\n"
        "        return found(config)\n"),
}


def git(folder: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    """A bare mirror with the release's layout at tag v1.0.0, and a later commit (tag v1.1.0) adding a model."""
    work = tmp_path_factory.mktemp("trtllm-src")
    git(work, "init", "-q")
    for path, text in FILES.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    git(work, "add", "-A")
    git(work, "commit", "-qm", "one")
    git(work, "tag", "v1.0.0")
    (work / PKG / "__init__.py").write_text(FILES[f"{PKG}/__init__.py"] + "from .modeling_unimported import G\n")
    (work / PKG / "modeling_auto.py").write_text(FILES[f"{PKG}/modeling_auto.py"].replace(  # the 1.0-era form: cut always
        "        if hasattr(config.pretrained_config, 'draft_vocab_size'):\n            arch = 'EAGLE3' + arch.replace('Eagle3', '')\n",
        "        arch = arch.replace('Eagle3', '')\n        if hasattr(config.pretrained_config, 'draft_vocab_size'):\n"
        "            arch = 'EAGLE3' + arch\n"))
    git(work, "commit", "-qam", "two")
    git(work, "tag", "v1.1.0")
    bare = tmp_path_factory.mktemp("mirror") / "trt.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(work), str(bare)], check=True)
    return bare


def test_generator_reads_the_names_the_package_import_registers(mirror):
    """Every literal register_auto_model call in the modules the package imports, followed through their own relative
    imports; a module nothing imports registers nothing; a subpackage's imports are its own; a name that is no literal
    is counted, never guessed."""
    found = gen.facts(gen.GitSource.at(mirror, "v1.0.0"), "v1.0.0")
    assert found["registry"] == ["EAGLE3LlamaForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM"]
    assert found["source"]["unread_registrations"] == {f"{PKG}/modeling_mix.py": 1}
    assert found["source"]["commit"] == git(mirror, "rev-parse", "v1.0.0^{commit}").strip()
    later = gen.facts(gen.GitSource.at(mirror, "v1.1.0"), "v1.1.0")
    assert "GraniteForCausalLM" in later["registry"] and "GraniteForCausalLM" not in found["registry"]


def test_generator_reads_the_first_name_rule_from_the_factory(mirror):
    """The error's f-string, `architectures[0]`, and the draft rename: "Eagle3" cut inside the draft branch only
    (main @ 01bffee1) or from every name before it (the 1.0-era form, code index id 316476577)."""
    said = gen.rule(gen.GitSource.at(mirror, "v1.0.0"))
    draft = {"key": "draft_vocab_size", "prefix": "EAGLE3", "cut": "Eagle3"}
    assert said == {"listed": "first", "unsupported": ERROR, "renamed": draft | {"cut_when": "key"}}
    assert gen.rule(gen.GitSource.at(mirror, "v1.1.0"))["renamed"] == draft | {"cut_when": "always"}


def test_generator_says_what_it_cannot_read(mirror, tmp_path, capsys):
    with pytest.raises(gen.Unreadable, match="no tag v9.9.9"):
        gen.GitSource.at(mirror, "v9.9.9")
    data = tmp_path / "data"
    data.mkdir()
    for name in gen.RELEASES:
        (data / name).write_bytes((DATA / name).read_bytes())
    assert gen.main(["--mirror", str(mirror), "--write", "--data", str(data)]) == 1  # v1.3.0rc29, v1.4.0rc1 absent
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["file"] for line in lines if "unreadable" in line] == ["trtllm-1.3.json", "trtllm-1.4.json"]
    assert (data / "trtllm-1.3.json").read_bytes() == (DATA / "trtllm-1.3.json").read_bytes()  # left as it was
    written = json.loads((data / "trtllm-1.1.json").read_text())
    assert written["rules"]["registry"][-1] == "Qwen3ForCausalLM" and written["source"]["registry"]["tag"] == "v1.1.0"
    for key in ("registry", "registry_rule"):
        del written["rules"][key]
    del written["source"]["registry"]
    assert written == json.loads((DATA / "trtllm-1.1.json").read_text())  # every other fact as it was


def generated_rules(mirror: Path, tmp_path: Path, file: str = "trtllm-1.4.json", tag: str = "v1.0.0"):
    """The shipped rules of `file` with the registry the generator reads from the mirror at `tag`."""
    data = tmp_path / "gen"
    data.mkdir(exist_ok=True)
    (data / file).write_bytes((DATA / file).read_bytes())
    gen.write(data / file, gen.facts(gen.GitSource.at(mirror, tag), tag))
    return read_rules(json.loads((data / file).read_text()), file)


def with_rules(monkeypatch, rules) -> None:
    """Doctor's shipped rules profiles, the one of `rules`' file replaced."""
    shipped = tuple(replace(p, rules=rules) if p.rules.source == rules.source else p for p in profiles.DATA_PROFILES)
    monkeypatch.setattr(profiles, "DATA_PROFILES", shipped)
    monkeypatch.setattr(refused_load, "DATA_PROFILES", shipped)


@pytest.mark.parametrize("listed,built", [
    (["Qwen3ForCausalLM", "GraniteForCausalLM"], "Qwen3ForCausalLM"),
    (["GraniteForCausalLM", "Qwen3ForCausalLM"], None),  # vLLM and SGLang would build the second: TensorRT-LLM asks none
    ([], None),
])
def test_only_the_first_listed_name_is_asked(mirror, tmp_path, listed, built):
    registry = generated_rules(mirror, tmp_path).model_registry
    found = resolve({"architectures": listed}, registry)
    assert found.name == built
    if listed and built is None:
        assert found.error == ERROR.replace("{architecture}", listed[0])


def test_an_eagle3_draft_is_asked_under_its_draft_name(mirror, tmp_path):
    registry = generated_rules(mirror, tmp_path).model_registry
    assert resolve({"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}, registry).name == "LlamaForCausalLM"
    assert resolve({"architectures": ["Eagle3LlamaForCausalLM"], "draft_vocab_size": 32000}, registry).name
    assert resolve({"architectures": ["Eagle3LlamaForCausalLM"]}, registry).error  # no draft key: asked as written
    always = generated_rules(mirror, tmp_path, tag="v1.1.0").model_registry  # the 1.0-era form cuts every name
    assert resolve({"architectures": ["Eagle3LlamaForCausalLM"]}, always).name == "Eagle3LlamaForCausalLM"


def listing(model: Path, folder: Path, listed: list[str]) -> Path:
    """A copy of `model` whose config.json lists `listed`."""
    folder.mkdir()
    for f in model.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, architectures=listed)))
    return folder


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return write_real_model(tmp_path_factory.mktemp("trtreg") / "qwen3-32b", "qwen3-32b")


def test_doctor_refuses_a_first_name_the_release_lacks_in_its_words(mirror, tmp_path, capsys, monkeypatch, qwen3):
    """Qwen3-32B's real config is clean where the release registers Qwen3ForCausalLM; listed second behind a name the
    release lacks, doctor and fix say the model is refused, on every rank, quoting TensorRT-LLM's ValueError."""
    with_rules(monkeypatch, generated_rules(mirror, tmp_path))
    code, report = doctor_json(capsys, qwen3, "trtllm==1.4.0", "--strict", "--tp", "2")
    assert (code, findings(report)) == (0, [])
    src = listing(qwen3, tmp_path / "q", ["GraniteForCausalLM", "Qwen3ForCausalLM"])
    code, report = doctor_json(capsys, src, "trtllm==1.4.0", "--tp", "2")
    [f] = findings(report, "unregistered-architecture")
    error = ERROR.replace("{architecture}", "GraniteForCausalLM")
    assert code == 1 and f["severity"] == "error" and f["runtime_error"] == error, f
    assert "the first architecture config.json lists" in f["message"] and "no Transformers fallback" in f["message"]
    assert [(s["rank"], s["error"]) for s in report["runtime_stops_at"]] == [(0, error), (1, error)]


def test_fix_refuses_a_model_the_release_refuses_in_one_line(mirror, tmp_path, capsys, monkeypatch, qwen3):
    with_rules(monkeypatch, generated_rules(mirror, tmp_path))
    src = listing(qwen3, tmp_path / "g", ["GraniteForCausalLM", "Qwen3ForCausalLM"])
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "trtllm==1.4.0")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "[unregistered-architecture]" in err, err
    assert "Unknown architecture for AutoModelForCausalLM: GraniteForCausalLM" in err and not (tmp_path / "out").exists()


def test_a_release_past_the_recorded_one_gets_a_note(mirror, tmp_path, capsys, monkeypatch, qwen3):
    """trtllm==1.5 takes 1.4's file: a later release may register the name, so a warning, not a refusal."""
    with_rules(monkeypatch, generated_rules(mirror, tmp_path))
    src = listing(qwen3, tmp_path / "g", ["GraniteForCausalLM"])
    _, report = doctor_json(capsys, src, "trtllm==1.5.0")
    assert not findings(report, "unregistered-architecture") and not report["runtime_stops_at"]
    [note] = [n for n in report["notes"] if n["code"] == "unregistered-architecture"]
    assert "registries grow with every release" in note["message"] and "asks no other" in note["message"], note


def test_shipped_trtllm_files_registry_shape_and_provenance():
    """Every trtllm data file is one the generator knows the release tag of; a registry shipped in one is the
    generator's (its rule, the tag and resolved commit, the files read); without a registry, no rule either."""
    shipped = sorted(p.name for p in DATA.glob("trtllm-*.json"))
    assert shipped == sorted(gen.RELEASES)
    for name in shipped:
        doc = json.loads((DATA / name).read_text())
        rules, where = doc["rules"], doc["source"].get("registry")
        if "registry" not in rules:
            assert "registry_rule" not in rules and where is None, name
            continue
        assert rules["registry"] == sorted(set(rules["registry"])) and rules["registry_rule"]["listed"] == "first"
        assert where["tag"] == gen.RELEASES[name] and len(where["commit"]) == 40 and gen.AUTO in where["files"]
        assert read_rules(doc, name).model_registry.first is not None


MIRROR = os.environ.get("TRTLLM_MIRROR")


@pytest.mark.skipif(not MIRROR or not Path(MIRROR).is_dir(), reason="no NVIDIA/TensorRT-LLM mirror (TRTLLM_MIRROR)")
def test_the_generator_on_the_real_mirror_reproduces_the_shipped_registries():
    for name, tag in gen.RELEASES.items():
        doc = json.loads((DATA / name).read_text())
        found = gen.facts(gen.GitSource.at(Path(MIRROR), tag), tag)
        assert doc["rules"].get("registry") == found["registry"], name
        assert doc["rules"].get("registry_rule") == found["registry_rule"], name
        assert doc["source"].get("registry") == found["source"], name


def test_builds_reads_each_registry_once_with_the_rule(mirror, tmp_path):
    registry = generated_rules(mirror, tmp_path).model_registry
    builds = Builds.read({"architectures": ["GraniteForCausalLM", "LlamaForCausalLM"]}, [registry])
    assert builds.of(registry).error == ERROR.replace("{architecture}", "GraniteForCausalLM")


def test_a_hostile_first_name_is_cut_and_forges_no_line(mirror, tmp_path):
    """Only architectures[0] is asked (a list of 10^5 names costs one lookup), and the error repeats it cut, escaped."""
    registry = generated_rules(mirror, tmp_path).model_registry
    found = resolve({"architectures": ["X" * 5000 + "\nerror: forged"] + ["LlamaForCausalLM"] * 100_000}, registry)
    assert found.name is None and "\n" not in found.error and len(found.error) < 300


RECORDED = [name for name in sorted(gen.RELEASES) if "registry" in json.loads((DATA / name).read_text())["rules"]]


@pytest.mark.skipif(not RECORDED, reason="no shipped trtllm file records a registry yet (tests/data/trtllm/PROVENANCE.md)")
@pytest.mark.parametrize("key", ["qwen3-32b", "qwen3-30b-a3b", "deepseek-v3-0324", "gemma-4-31b-it", "ct-laguna-moe"])
def test_real_configs_against_each_recorded_registry(tmp_path, capsys, key):
    """Each real config under each release whose file records TensorRT-LLM's registry: refused, in its words, exactly
    when the release's table lacks the class its first listed name is asked under (e.g. a model added after 1.0)."""
    src = write_real_model(tmp_path / key, key)
    config = json.loads((src / "config.json").read_text())
    for name in RECORDED:
        rules = read_rules(json.loads((DATA / name).read_text()), name)
        first = rules.model_registry.first
        _, report = doctor_json(capsys, src, "trtllm==" + ".".join(map(str, rules.release)))
        refused = findings(report, "unregistered-architecture")
        if first.asked(config["architectures"][0], config) in rules.registry:
            assert not refused, (name, refused)
        else:
            assert [f["runtime_error"] for f in refused] == [
                first.unsupported.replace("{architecture}", config["architectures"][0])], name
