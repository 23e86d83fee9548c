"""The options `fix` and `hub fix` share, declared once.

Each command derives its click options from SHARED (`@shared("target")`, in the order its help
lists them) and gathers their values into one FixOptions, which builds the Recipe the same way
for both commands.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import click

from repair.execute.parallel import MAX_JOBS

SHARED: dict[str, tuple[tuple[str, ...], dict]] = {
    "target_spec": (("--target", "target_spec"), {"default": None, "help": "Fix for vllm==X.Y.Z, sglang==X.Y.Z, trtllm==X.Y.Z or bf16; several, comma-separated: one output for all (default: the handshake repair)."}),
    "recipe_path": (("--recipe", "recipe_path"), {"default": None, "help": "A recipe file, a built-in recipe name, or an earlier repair_report.json."}),
    "original": (("--original",), {"default": None, "help": "The original BF16 model (a local folder or a Hub repo id): BF16 modules are taken from it."}),
    "requantize": (("--requantize",), {"default": None, "help": "Comma-separated modules to pack afresh from --original (ModelOpt-exact)."}),
    "force": (("--force",), {"is_flag": True, "help": "Use --original even if it does not reproduce the checkpoint's packed bytes."}),
    "dry_run": (("--dry-run",), {"is_flag": True, "help": "Print the plan and write nothing."}),
    "as_json": (("--json", "as_json"), {"is_flag": True, "help": "Print the plan / result as JSON."}),
    "quiet": (("--quiet", "-q"), {"is_flag": True, "help": "Print the summary and errors only (no plan, no progress bar)."}),
    "verbose": (("--verbose", "-v"), {"is_flag": True, "help": "List every module of the plan (default: alike changes grouped)."}),
    "jobs": (("--jobs", "-j"), {"type": click.IntRange(min=1, max=MAX_JOBS), "default": None,
                                "help": "Tensors to dequantize/requantize at once (default: one per core); the output is the same."}),
}


def shared(name: str, **overrides):
    """The click option for one shared setting (a command may reword its help, e.g. for what it does not write)."""
    decls, settings = SHARED[name]
    return click.option(*decls, **{**settings, **overrides})


@dataclass(frozen=True)
class FixOptions:
    """The shared settings' values, as one command line gave them."""

    target_spec: str | None = None
    recipe_path: str | None = None
    original: str | None = None
    requantize: str | None = None
    force: bool = False
    dry_run: bool = False
    as_json: bool = False
    quiet: bool = False
    verbose: bool = False
    jobs: int | None = None

    @property
    def detail(self) -> str:
        """How much text: "quiet" (the summary and errors), "verbose" (every module), else "normal"."""
        return "quiet" if self.quiet else "verbose" if self.verbose else "normal"

    @classmethod
    def take(cls, values: dict) -> "FixOptions":
        """Pop the shared settings out of a command's keyword arguments."""
        return cls(**{name: values.pop(name) for name in SHARED if name in values})  # a command may not declare every one

    def recipe(self):
        """--recipe (else the default), with --target and --requantize applied on top."""
        from repair.planning.recipe import DEFAULT, load_recipe

        recipe = load_recipe(Path(self.recipe_path)) if self.recipe_path else DEFAULT
        if self.target_spec:
            recipe = replace(recipe, target=self.target_spec)
        if self.requantize:
            recipe = replace(recipe, requantize=recipe.requantize + tuple(m.strip() for m in self.requantize.split(",") if m.strip()))
        return recipe
