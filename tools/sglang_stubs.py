"""Import-time stand-ins for SGLang's GPU-only dependencies, so that its CPU-runnable parts import here.

SGLang 0.5.23 imports `torchvision` (the PyPI build is CUDA-linked), `sgl_kernel` and `flashinfer` (CUDA
kernels, not installable here) at module level in files the consumer tier needs (modelopt_quant.py,
linear.py pull them in through configs and utils). None of their functions run on the paths the tier
exercises: config parsing, exclusion matching, layer construction and weight loaders. `install()` appends a
meta-path finder that answers only for those top-level names (and their submodules) and only when nothing
earlier on `sys.meta_path` found a real module; every attribute of a stand-in is an inert placeholder class
that fails loudly if it is ever called for a result (see `_Placeholder`), and every call is recorded in `CALLED`
(so a caller that catches the error cannot hide that a stand-in was reached). Nothing in site-packages is edited.
(runtimes_beyond_vllm.md §4.) The vLLM tools use the same stand-in for `torchvision` alone (tools/vllm_runtime.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("torchvision", "sgl_kernel", "flashinfer", "vllm")
CALLED: list[str] = []  # qualified names of the placeholders called, in order (a decorator use included)


RAISED_FOR_THE_CALLER = ("__getattr__",)  # their AttributeError is the caller's lookup failing (tools/raised_by.py)


class StubCalled(RuntimeError):
    """A GPU-only function was reached: the probe's result would not be SGLang's CPU behaviour."""


class _PlaceholderMeta(type):
    """Attributes of a placeholder are placeholders too (`torchvision.transforms.InterpolationMode.BICUBIC`)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        if not cls.__dict__.get("_stand_in"):
            return super().__call__(*args, **kwargs)  # a class SGLang derived from a placeholder
        CALLED.append(cls.__qualname__)
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator (e.g. a torch custom-op registration): leave the function as is
        raise StubCalled(f"{cls.__qualname__} is a stand-in for a GPU-only module (tools/sglang_stubs.py)")


class _Placeholder(metaclass=_PlaceholderMeta):
    """Base of the placeholders, which carry `_stand_in` in their own namespace; a class derived from one does not."""


def placeholder(qualname: str) -> type:
    return _PlaceholderMeta(qualname.rpartition(".")[2], (_Placeholder,), {"__qualname__": qualname, "_stand_in": True})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []  # a package: submodules (flashinfer.jit.core) resolve through the finder too
        return module

    def exec_module(self, module) -> None:
        module.__stub__ = True
        # a version below every requirement: transformers' `is_torchvision_greater_or_equal` and the like
        # parse it, and turn features that need the real package off
        module.__version__ = "0"


class GpuOnlyStubFinder(importlib.abc.MetaPathFinder):
    def __init__(self, names: tuple[str, ...] = STUBBED):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def install(names: tuple[str, ...] = STUBBED) -> None:
    """Append the finder for `names` once; real installed modules of these names (found earlier) still win."""
    if not any(isinstance(f, GpuOnlyStubFinder) and f.names == names for f in sys.meta_path):
        sys.meta_path.append(GpuOnlyStubFinder(names))
