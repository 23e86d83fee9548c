"""tools/sglang_stubs.py's stand-ins (used for SGLang's GPU-only imports and, in the vLLM tools, for torchvision) decide
nothing: a placeholder called for a result raises and is recorded, so a tier result that reached one cannot pass for
the runtime's own; a class the runtime derives from a placeholder still works, and a real module of the name wins."""

from __future__ import annotations

import importlib

import pytest

from tools import sglang_stubs

NAME = "ckpt_repair_stand_in_probe"  # no real package of this name exists
MODULE = f"{NAME}.transforms.v2.functional"


@pytest.fixture(scope="module")
def stub():
    sglang_stubs.install((NAME,))
    return importlib.import_module(MODULE)


def test_a_placeholder_called_for_a_result_raises_and_is_recorded(stub):
    mark = len(sglang_stubs.CALLED)
    for call in (lambda: stub.resize(1, size=2), lambda: stub.resize(), lambda: stub.InterpolationMode.BICUBIC("x")):
        with pytest.raises(sglang_stubs.StubCalled):
            call()
    assert sglang_stubs.CALLED[mark:] == [f"{MODULE}.{name}" for name in ("resize", "resize", "InterpolationMode.BICUBIC")]


def test_a_decorator_use_leaves_the_function_and_is_recorded(stub):
    mark = len(sglang_stubs.CALLED)

    def kernel():
        return 7

    assert stub.register(kernel) is kernel and kernel() == 7
    assert sglang_stubs.CALLED[mark:] == [f"{MODULE}.register"]


def test_a_class_derived_from_a_placeholder_is_a_real_class(stub):
    mark = len(sglang_stubs.CALLED)

    class Backend(stub.Base):
        def __init__(self, value):
            self.value = value

    assert Backend(3).value == 3 and sglang_stubs.CALLED[mark:] == []


def test_a_real_module_of_a_stubbed_name_wins():
    sglang_stubs.install(("json",))
    assert not getattr(importlib.import_module("json"), "__stub__", False)
