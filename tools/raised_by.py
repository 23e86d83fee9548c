"""Whose code raised an exception a generator caught: the runtime's (a fact it may record) or ours (a bug it must not).

The generators (tools/vllm_profile.py and its helpers, tools/sglang_*.py) ask a runtime's own code and record its
refusals as facts ("unprofiled: ...", a load refusal, a field not confirmed). An exception raised by our own code
(tools/, repair/, tests/: a stand-in, a shim, a name computed wrong) is no such fact: recorded, it would read as the
runtime's reason. `reraise_ours(e)` at every broad `except` raises it again, traceback whole, so the generator stops.

The frame that decides is the innermost one in either our tree (by path) or a runtime package (by the package its
module belongs to: vllm, sglang, transformers; never a folder's name, as /work/venvs/sglang's torch); library frames
between (torch, importlib, the standard library) are passed over: torch raising inside vLLM's layer is vLLM's, torch
raising inside our stand-in is ours. An exception the runtime raised from one of ours (`__cause__`/`__context__`) is
ours, and so is torch refusing a meta tensor wherever it is raised (only our harness builds on and feeds the meta
device). A module a runtime imports and this host lacks (`No module named 'cutlass'`) is raised at the runtime's
import line: the runtime's, a host limit it states.
Two of our raises stand for what the host would do without us, and are passed over too: the AttributeError of a
function a module lists in its RAISED_FOR_THE_CALLER (a stand-in's attribute lookup, the remote-config learner's
config lacking a field: the one vLLM's read would meet anyway, at vLLM's line; anything else they raise is a bug), and
a GPU-only stand-in reached (HOST_LIMITS: the host has no such kernel, tools/sglang_stubs.py StubCalled).
Not seen here: a stand-in returning a value of the wrong kind that vLLM's own code then refuses (vLLM's frame raises,
nothing of ours is on the traceback): the stand-ins must answer as the host would.
Imports nothing from ``repair``.
"""

from __future__ import annotations

import os

TOOLS = os.path.dirname(os.path.abspath(__file__))
OURS = tuple(os.path.join(os.path.dirname(TOOLS), part) + os.sep for part in ("repair", "tests")) + (TOOLS + os.sep,)
RUNTIMES = ("vllm", "sglang", "transformers")
META = "meta tensor"  # torch's refusals: "Cannot copy out of meta tensor", "Tensor.item() cannot be called on meta tensors"
HOST_LIMITS = ("StubCalled",)  # exception classes of ours that say the host lacks a GPU-only module the runtime reached


def owner(frame) -> str | None:
    """"ours", "runtime", or None (a library or the standard library) for a frame: ours by our tree's path, the
    runtime's by the package its module belongs to (`vllm.model_executor...`), not by a folder's name on the way (the
    SGLang tier's venv is /work/venvs/sglang: its torch is no part of SGLang)."""
    if os.path.abspath(frame.f_code.co_filename).startswith(OURS):
        return "ours"
    module = frame.f_globals.get("__name__")
    return "runtime" if isinstance(module, str) and module.partition(".")[0] in RUNTIMES else None


def raised_by(error: BaseException) -> str:
    """"runtime" when the innermost frame of ours or a runtime's is the runtime's and nothing it was raised from
    (`__cause__`, or `__context__` unless suppressed) is ours; "ours" otherwise (no such frame: nothing shows the
    runtime refused). torch refusing a meta tensor is ours wherever raised: the generators build on and feed the meta
    device, no checkpoint or release does (Apertus's xIELU buffers once met vLLM's default_weight_loader so)."""
    if (_frame_owner(error) or "ours") == "ours":
        return "ours"
    seen = {id(error)}
    while (error := error.__cause__ or (None if error.__suppress_context__ else error.__context__)) is not None \
            and id(error) not in seen:
        if _frame_owner(error) == "ours":  # a link with no frame of either (torch's own, caught in torch) says nothing
            return "ours"
        seen.add(id(error))
    return "runtime"


def _frame_owner(error: BaseException) -> str | None:
    """Who raised this one exception, its chain aside (None: no frame of ours or a runtime's on its traceback)."""
    if type(error).__name__ in HOST_LIMITS:
        return "runtime"
    if isinstance(error, (NotImplementedError, RuntimeError)) and META in str(error):
        return "ours"
    found, tb = None, error.__traceback__
    lookup = isinstance(error, AttributeError)  # what a RAISED_FOR_THE_CALLER function answers for; any other is a bug
    while tb is not None:
        frame = tb.tb_frame
        if not lookup or frame.f_code.co_name not in frame.f_globals.get("RAISED_FOR_THE_CALLER", ()):
            found = owner(frame) or found
        tb = tb.tb_next
    return found


def reraise_ours(error: BaseException) -> None:
    """Raise `error` again where our own code raised it; return where the runtime's did (the caller records it)."""
    if raised_by(error) == "ours":
        raise error
