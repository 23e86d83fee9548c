"""`ckpt-repair demo`: build the bug, show it, fix it, show it fixed — on a tiny built-in example."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from repair.arch.gemma4_assistant import BF16_HANDSHAKE
from repair.demo.examples import write_assistant
from repair.execute.writer import execute
from repair.doctor.inspection import inspect_checkpoint
from repair.io.checkpoint import open_checkpoint
from repair.planning.build import make_plan
from repair.planning.recipe import Recipe
from repair.planning.text import plan_as_text


def run_demo(workdir: Path | None, say: Callable[[str], None]) -> Path:
    """Write a broken tiny NVFP4 Gemma 4 assistant, repair it, and narrate each step; returns the fixed folder."""
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ckpt-repair-demo-"))
    broken = write_assistant(root / "broken-assistant")
    say(f"1. Built a tiny NVFP4 Gemma 4 assistant the way the buggy export did: {broken}")
    say(_handshake_lines(inspect_checkpoint(open_checkpoint(broken))))
    plan = make_plan(open_checkpoint(broken), Recipe())
    say("2. The repair plan:\n" + plan_as_text(plan))
    fixed = execute(plan, root / "fixed-assistant", progress=False, options={"recipe": "default"}).out
    say(f"3. Wrote {fixed}")
    say(_handshake_lines(inspect_checkpoint(open_checkpoint(fixed))))
    again = make_plan(open_checkpoint(fixed), Recipe())
    say("4. Fixing the fixed folder again is a no-op: " + ("yes" if again.is_noop else "NO (bug)"))
    prefixed = write_assistant(root / "prefixed-assistant", broken=False, exclusion_prefix="model.")
    say(f"5. Also built {prefixed}: pre/post_projection kept BF16 and excluded as model.pre_projection and "
        "model.post_projection, which vLLM matches and SGLang 0.5.23 does not (sglang#36596); try "
        f"`ckpt-repair doctor {prefixed} --target vllm==0.32.0,sglang==0.5.23`")
    return fixed


def _handshake_lines(result) -> str:
    lines = []
    for view in result.modules:
        if view.module.name in BF16_HANDSHAKE:
            ok = view.module.precision == "bf16" and view.declared == "excluded"
            lines.append(
                f"   {view.module.name}: stored {view.module.precision} {list(view.module.stored_shape)}, "
                f"declared {view.declared} -> {'OK' if ok else 'WRONG: the family keeps it BF16 and runtimes expect that'}"
            )
    return "\n".join(lines)
