"""Output a person can read at scale (issue #27.5): alike findings and plan lines grouped, natural order,
the summary first; --verbose and --json keep every finding; --quiet prints the summary and errors alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair.io.dtypes import nbytes
from tests.conftest import run_captured
from tools.bench import many_tensors

MOE_LAYERS, DENSE, EXPERTS = 89, 3, 4  # GLM-4.7's 92 layers: routers in layers 3..91


def _glm_like(folder: Path) -> Path:
    """A sparse DeepSeek-V3-named layout with GLM-4.7's layer count: every router stored packed NVFP4
    (an error each: vLLM builds routers unquantized), and every routed expert packed but excluded by
    the config (a warning each). About 1.4k modules, 5.5k tensors."""
    folder.mkdir()
    names = []
    for name, dtype, shape in many_tensors.tensors(MOE_LAYERS, EXPERTS, DENSE):
        if name.endswith(".mlp.gate.weight"):
            names += many_tensors._packed(name.removesuffix(".weight"), EXPERTS * 16, many_tensors.HIDDEN)
        elif not name.endswith("e_score_correction_bias"):
            names.append((name, dtype, shape))
    per = -(-len(names) // 8)
    weight_map = {}
    for i in range(8):
        shard = f"model-{i + 1:05d}-of-00008.safetensors"
        many_tensors._write_shard(folder / shard, names[i * per:(i + 1) * per], nbytes)
        weight_map.update({n: shard for n, _, _ in names[i * per:(i + 1) * per]})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    exclude = ["lm_head", "*embed_tokens", "*self_attn*", "*mlp.experts*"]
    quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": exclude, "producer": {"name": "modelopt", "version": "0.47.0"}}
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": many_tensors.HIDDEN,
              "num_hidden_layers": MOE_LAYERS + DENSE, "first_k_dense_replace": DENSE, "quantization_config": quant}
    (folder / "config.json").write_text(json.dumps(config))
    hf = {"producer": quant["producer"], "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": exclude}}
    (folder / "hf_quant_config.json").write_text(json.dumps(hf))
    return folder


@pytest.fixture(scope="module")
def glm(tmp_path_factory) -> Path:
    return _glm_like(tmp_path_factory.mktemp("glm") / "src")


def test_doctor_groups_alike_findings_into_few_lines(glm, capsys):
    code, out, _ = run_captured(capsys, "doctor", str(glm))
    lines = out.splitlines()
    assert code == 1 and len(lines) <= 40, out
    routers = [line for line in lines if "model.layers.{3..91}.mlp.gate:" in line]
    assert len(routers) == 1 and routers[0].startswith("error: [config-contradiction] 89 alike: "), out
    assert "model.layers.3.mlp.gate, model.layers.4.mlp.gate, model.layers.5.mlp.gate, ..." in out  # natural order
    assert lines[0].startswith("target ") and f"next: `ckpt-repair fix {glm} -o OUT --target" in lines[0]


def test_json_and_verbose_list_every_finding(glm, capsys):
    found = json.loads(run_captured(capsys, "doctor", str(glm), "--json")[1])["findings"]
    routers = [f for f in found if f["subject"].endswith(".mlp.gate")]
    experts = [f for f in found if ".mlp.experts." in f["subject"]]
    assert len(routers) == MOE_LAYERS and len(experts) == MOE_LAYERS * EXPERTS * 3
    verbose = run_captured(capsys, "doctor", str(glm), "--verbose")[1].splitlines()
    assert len([line for line in verbose if line.startswith(("error: ", "warning: "))]) == len(found)
    gates = [line.split("] ", 1)[1].split(": ")[0] for line in verbose if ".mlp.gate: stored" in line]
    assert gates == [f"model.layers.{i}.mlp.gate" for i in range(DENSE, DENSE + MOE_LAYERS)]  # layers.3 .. layers.91, natural order


def test_quiet_doctor_prints_the_summary_and_errors_alone(glm, capsys):
    out = run_captured(capsys, "doctor", str(glm), "--quiet")[1]
    assert out.splitlines()[0].startswith("target ") and "warning: " not in out and "error: [config-contradiction]" in out
    assert "bits per parameter" not in out


def test_a_long_plan_is_grouped_and_quiet_fix_prints_the_summary(glm, tmp_path, capsys):
    out = run_captured(capsys, "fix", str(glm), "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--dry-run")[1]
    assert len(out.splitlines()) <= 12 and "1157 alike: model.layers.{3..91}.mlp.experts.{0..3}.down_proj, " in out, out
    assert "exclusions: add 89 entries: model.layers.{3..91}.mlp.gate " in out
    verbose = run_captured(capsys, "fix", str(glm), "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--dry-run", "--verbose")[1]
    assert "model.layers.10.mlp.gate: dequantize" in verbose and len(verbose.splitlines()) > 1157
    quiet = run_captured(capsys, "fix", str(glm), "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--quiet")[1].splitlines()
    assert quiet[0] == f"wrote {tmp_path / 'out'} (report: {tmp_path / 'out' / 'repair_report.json'})" and len(quiet) <= 2, quiet


def test_doctor_output_of_the_small_cases_is_one_line_per_finding(capsys, tmp_path):
    """Below the group size, findings keep one line each (the README's examples)."""
    from repair.demo.examples import TINY, write_assistant

    src = write_assistant(tmp_path / "tiny", TINY)
    out = run_captured(capsys, "doctor", str(src), "--target", "vllm==0.25.0", "--strict")[1]
    assert " alike: " not in out and "pre_projection" in out


@pytest.mark.parametrize("hostile", ["\nerror: [forged] all is well\n", "\x1b[2K\x1b[1A", "\r"])
@pytest.mark.parametrize("verbose", [False, True])
def test_a_hostile_subject_cannot_forge_lines_or_terminal_codes(hostile, verbose):
    """Names come from the checkpoint: a newline, carriage return or escape code in one stays visible as an
    escape on its own line, grouped or not, and the line count is the same as for plain names."""
    from repair.doctor.findings import Finding, Kind, Severity
    from repair.doctor.grouping import finding_lines

    def findings(tag: str):
        return [Finding(Severity.WARNING, Kind.NOT_BF16, f"model.layers.{i}{tag}.mlp", f"model.layers.{i}{tag}.mlp is not bf16")
                for i in range(6)]

    lines = finding_lines(findings(hostile), tp=1, verbose=verbose)
    text = "\n".join(lines)
    assert len(text.splitlines()) == len(finding_lines(findings("x"), tp=1, verbose=verbose))
    assert all(c.isprintable() for line in lines for c in line), lines


def test_a_hostile_module_name_cannot_forge_plan_lines():
    from repair.planning.text import _change_lines
    from repair.planning.model import ModuleChange, ChangeAction

    changes = [ModuleChange(f"m.{i}\nplan: nothing", ChangeAction.DROP, (), ()) for i in range(30)]
    for verbose in (False, True):
        lines = _change_lines(changes, verbose)
        assert all(c.isprintable() for line in lines for c in line), lines


def _command(line: str) -> list[str]:
    import shlex

    return shlex.split(line.split("`")[1])


def test_the_summarys_next_command_runs_as_written_for_a_path_with_spaces(glm, tmp_path, capsys):
    """The first line's suggested command names this SRC, quoted for the shell, and this --tp."""
    src = tmp_path / "my model's copy"
    src.symlink_to(glm)
    code, out, _ = run_captured(capsys, "doctor", str(src), "--tp", "2")
    words = _command(out.splitlines()[0])
    assert code == 1 and words[:3] == ["ckpt-repair", "fix", str(src)], out
    assert words[words.index("--tp") + 1] == "2" and "--dry-run" in words


def test_fix_summary_names_out_quoted_for_the_shell(tmp_path):
    from types import SimpleNamespace

    from repair.cli.fix_cmd import _summary
    from repair.cli.fix_options import FixOptions

    out = tmp_path / "out dir; rm -rf ~"
    report = {"doctor": {"target": "vllm==0.32.0", "after": {"findings": [{"code": "x"}]}}}
    text = _summary(SimpleNamespace(copied_files=(), before=()), SimpleNamespace(out=out, report=report), FixOptions(quiet=True))
    line = next(line for line in text.splitlines() if "remain" in line)
    assert _command(line) == ["ckpt-repair", "doctor", str(out), "--target", "vllm==0.32.0"]


@pytest.mark.parametrize("count", [2, 30])
def test_inline_name_lists_escape_control_characters(count):
    """Exclusions and quantized_layers entries come from the config: listed inline, they stay one line."""
    from repair.doctor.grouping import names_text

    for verbose in (False, True):
        text = names_text([f"m.{i}\n\x1b[1A" for i in range(count)], verbose)
        assert all(c.isprintable() for c in text), text
