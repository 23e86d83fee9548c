"""A generator records a runtime's refusal as a fact, never our own bug (tools/raised_by.py).

tools/vllm_profile.py recorded any exception raised while building or learning a row as that architecture's vLLM
reason ("unprofiled: ..."), and its helpers recorded any as "nothing placed" / "no claim" (vllm_load_facts.py's
placed_weights: Kimi-Linear's load facts came out empty). The frame that raised decides: the innermost one of our
tree or of a runtime package. Here with stand-in packages laid out as installed (site-packages/vllm/...), and, read
with `ast`, every broad `except` of the generators either asks reraise_ours or re-raises.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from raised_by import raised_by, reraise_ours  # noqa: E402

RUNTIME = '''
import json

def refuse(config):
    return config["use_residual"]          # a config field the release reads: its KeyError is its refusal

def calls(callback):
    return callback()                      # the release calling back into our stand-in or shim

def through_library(fn):
    return json.loads(fn())                # a library frame between

def imports_missing():
    import a_kernel_package_this_host_lacks  # noqa: F401

def rewraps(callback):
    try:
        return callback()
    except KeyError as e:                  # the release catching what our callback raised and raising its own
        raise ValueError("the release could not read the layer") from e

def copies(param, loaded):
    param.data.copy_(loaded)               # default_weight_loader's copy, handed the harness's meta tensor
'''

LIBRARY = '''
def loads(fn):
    return fn()["a key"]                   # a library (torch, safetensors) raising on what our code handed it
'''


@pytest.fixture
def vllm(tmp_path):
    folder = tmp_path / "lib" / "python3.12" / "site-packages" / "vllm" / "models"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(RUNTIME)
    return load("vllm.models.model", folder / "model.py")  # the name it has installed


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def caught(fn) -> BaseException:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test reads who raised it
        return e
    raise AssertionError("nothing raised")


def our_bug():
    return {}["a name we computed wrong"]


def test_the_runtimes_own_refusal_is_the_runtimes(vllm):
    for error in (caught(lambda: vllm.refuse({})), caught(vllm.imports_missing),
                  caught(lambda: vllm.through_library(lambda: "{"))):
        assert raised_by(error) == "runtime", error
        reraise_ours(error)  # returns: the caller records it


def test_our_own_bug_is_ours_and_raised_again_whole(vllm):
    """Our code raising, or the runtime calling back into ours which raises, stops the generator (traceback kept)."""
    for error in (caught(our_bug), caught(lambda: vllm.calls(our_bug)),
                  caught(lambda: json_of(our_bug))):
        assert raised_by(error) == "ours", error
        with pytest.raises(KeyError) as info:
            reraise_ours(error)
        assert info.value is error and "our_bug" in [f.name for f in info.traceback]


def json_of(fn):
    import json

    return json.loads(fn())


RAISED_FOR_THE_CALLER = ("_config_lacks",)  # as tools/vllm_remote_configs.py's _noted_miss


def _config_lacks():
    raise AttributeError("'RemoteConfig' object has no attribute 'layer_group_size'")


class StubCalled(RuntimeError):
    """As tools/sglang_stubs.py's: a GPU-only stand-in reached."""


def _gpu_only():
    raise StubCalled("flash_mla is a stand-in for a GPU-only module")


def test_a_stand_in_answering_for_the_runtime_is_passed_over(vllm):
    """The learner's config lacking a field vLLM reads, and a GPU-only kernel vLLM reaches (a host limit): vLLM's."""
    assert raised_by(caught(lambda: vllm.calls(_config_lacks))) == "runtime"
    assert raised_by(caught(lambda: vllm.calls(_gpu_only))) == "runtime"
    assert raised_by(caught(_config_lacks)) == "ours"  # called by nothing of the runtime's: ours


# Broad catches that are no generator's fact: harnesses that report a load's error to the tier test reading it
# (which fails on it), and setup failures that stop with exit 3.
HARNESS = {("vllm_arch_check.py", "main"), ("vllm_arch_check.py", "vllm_placed"), ("vllm_declared.py", "main"),
           ("vllm_load.py", "main"), ("vllm_probe.py", "main"), ("vllm_runtime.py", "reported"),
           ("sglang_load.py", "_one_by_one"), ("sglang_load.py", "load"), ("sglang_probe.py", "main")}


def broad_catches(path: Path):
    """(function, line) of every `except Exception` / `except BaseException` / bare `except` whose body neither calls
    reraise_ours nor raises again."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        inner = {id(n) for f in function.body for n in ast.walk(f)
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f is not function}
        for node in ast.walk(function):
            if not isinstance(node, ast.ExceptHandler) or id(node) in inner:
                continue
            names = [n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)] if node.type is not None else ["bare"]
            if not {"Exception", "BaseException", "bare"} & set(names):
                continue
            body = [n for stmt in node.body for n in ast.walk(stmt)]
            honest = any(isinstance(n, ast.Raise) and n.exc is None for n in body) or any(
                isinstance(n, ast.Call) and getattr(n.func, "id", None) == "reraise_ours" for n in body)
            if not honest:
                yield function.name, node.lineno


def test_every_broad_catch_of_a_generator_lets_our_own_bugs_through():
    """Failed before: 40 broad catches in tools/vllm_*.py and tools/sglang_*.py recorded whatever they caught."""
    found = [f"{p.name}:{line} ({name})" for p in sorted((REPO / "tools").glob("*.py"))
             if p.name.startswith(("vllm_", "sglang_", "ct_groups"))
             for name, line in broad_catches(p) if (p.name, name) not in HARNESS]
    assert not found, found


def test_a_library_in_a_venv_named_like_a_runtime_is_not_the_runtime(tmp_path):
    """Failed before: any folder named vllm/sglang/transformers in a frame's path made it the runtime's, and the SGLang
    tier's venv is /work/venvs/sglang: torch (any library) there raising on what our stand-in handed it read as
    SGLang's refusal. The runtime is the package a frame's module belongs to, not a folder's name."""
    folder = tmp_path / "venvs" / "sglang" / "lib" / "python3.12" / "site-packages" / "a_library"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(LIBRARY)
    library = load("a_library", folder / "__init__.py")
    error = caught(lambda: library.loads(dict))
    assert raised_by(error) == "ours", error


def test_the_runtime_rewrapping_our_bug_is_ours(vllm):
    """Failed before: the release catching our callback's KeyError and raising its own ValueError `from` it was counted
    the release's (its frame is the innermost of the last exception); the chain says whose bug it is."""
    error = caught(lambda: vllm.rewraps(our_bug))
    assert isinstance(error, ValueError) and raised_by(error) == "ours", error
    assert raised_by(caught(lambda: vllm.rewraps(_config_lacks))) == "runtime"  # not a KeyError: vLLM's own raise


def test_torch_refusing_the_harness_meta_tensor_in_the_runtime_is_ours(vllm):
    """Failed before: torch's "Cannot copy out of meta tensor" inside vLLM's default_weight_loader (Apertus's xIELU
    buffers, which no recorder stood for) was counted vLLM's refusal; the meta tensors are the harness's, not the
    checkpoint's, so no such error says anything of vLLM."""
    import torch

    error = caught(lambda: vllm.copies(torch.zeros(2), torch.empty(2, device="meta")))
    assert "meta tensor" in str(error) and raised_by(error) == "ours", error


def _config_lacks_broken():
    return {}["a field our stand-in computed wrong"]


def test_a_stand_in_passed_over_only_for_the_lookup_it_answers(vllm):
    """Failed before: a function listed in RAISED_FOR_THE_CALLER was passed over whatever it raised, so a bug of ours
    inside a stand-in's `__getattr__` (a KeyError, a TypeError) read as vLLM's refusal. Only its AttributeError is the
    caller's failed lookup."""
    global RAISED_FOR_THE_CALLER
    listed = RAISED_FOR_THE_CALLER
    RAISED_FOR_THE_CALLER = (*listed, "_config_lacks_broken")
    try:
        assert raised_by(caught(lambda: vllm.calls(_config_lacks_broken))) == "ours"
        assert raised_by(caught(lambda: vllm.calls(_config_lacks))) == "runtime"
    finally:
        RAISED_FOR_THE_CALLER = listed
