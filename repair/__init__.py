"""ckpt-repair: streaming weight surgery for quantized LLM checkpoints.

Python API: `plan = repair.plan(src, recipe)` (inspectable, nothing written), then
`repair.run(plan, out)`. Both are imported lazily so `import repair` stays cheap.
"""

from repair.version import __version__  # noqa: F401  (repair.__version__)


def plan(*args, **kwargs):
    from repair.api import plan as _plan

    return _plan(*args, **kwargs)


def run(*args, **kwargs):
    from repair.api import run as _run

    return _run(*args, **kwargs)


def __getattr__(name):
    if name in ("Recipe", "load_recipe", "builtin_recipes"):
        from repair.planning import recipe

        return getattr(recipe, name)
    raise AttributeError(name)
