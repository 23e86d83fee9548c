"""Whose code raised an exception a generator caught: the runtime's (a fact it may record) or ours (a bug it must not).

The generators (tools/vllm_profile.py and its helpers, tools/sglang_*.py) ask a runtime's own code and record its
refusals as facts ("unprofiled: ...", a load refusal, a field not confirmed). An exception raised by our own code
(tools/, repair/, tests/: a stand-in, a shim, a name computed wrong) is no such fact: recorded, it would read as the
runtime's reason. `reraise_ours(e)` at every broad `except` raises it again, traceback whole, so the generator stops.

The frame that decides is the innermost one in either our tree or a runtime package (vllm, sglang, transformers,
as installed); library frames between (torch, importlib, the standard library) are passed over: torch raising inside
vLLM's layer is vLLM's, torch raising inside our stand-in is ours. A module a runtime imports and this host lacks
(`No module named 'cutlass'`) is raised at the runtime's import line: the runtime's, a host limit it states.
Two of our raises stand for what the host would do without us, and are passed over too: a function a module lists in
its RAISED_FOR_THE_CALLER (a stand-in's attribute lookup, the remote-config learner's config lacking a field: the
AttributeError vLLM's read would meet anyway, at vLLM's line), and a GPU-only stand-in reached (HOST_LIMITS: the host
has no such kernel, tools/sglang_stubs.py StubCalled).
Imports nothing from ``repair``.
"""

from __future__ import annotations

import os

TOOLS = os.path.dirname(os.path.abspath(__file__))
OURS = tuple(os.path.join(os.path.dirname(TOOLS), part) + os.sep for part in ("repair", "tests")) + (TOOLS + os.sep,)
RUNTIMES = ("vllm", "sglang", "transformers")
HOST_LIMITS = ("StubCalled",)  # exception classes of ours that say the host lacks a GPU-only module the runtime reached


def owner(filename: str) -> str | None:
    """"ours", "runtime", or None (a library or the standard library) for the file a frame runs."""
    path = os.path.abspath(filename)
    if path.startswith(OURS):
        return "ours"
    folders = path.split(os.sep)[:-1]
    return "runtime" if any(part in RUNTIMES for part in folders) else None


def raised_by(error: BaseException) -> str:
    """"runtime" when the innermost frame of ours or a runtime's is the runtime's; "ours" otherwise (no such frame:
    nothing shows the runtime refused)."""
    if type(error).__name__ in HOST_LIMITS:
        return "runtime"
    found, tb = None, error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name not in frame.f_globals.get("RAISED_FOR_THE_CALLER", ()):
            found = owner(frame.f_code.co_filename) or found
        tb = tb.tb_next
    return found or "ours"


def reraise_ours(error: BaseException) -> None:
    """Raise `error` again where our own code raised it; return where the runtime's did (the caller records it)."""
    if raised_by(error) == "ours":
        raise error
