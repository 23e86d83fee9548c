"""What the page offers to choose, asked of the library: the targets it knows (newest first) and the
recipes (fix for the chosen target, the default repair, or a built-in recipe by name)."""

from __future__ import annotations

from dataclasses import replace

from repair.errors import UsageError
from repair.planning.recipe import DEFAULT, Recipe, builtin_recipes
from repair.targets.profiles import target_choices

FOR_TARGET = "fix for the chosen targets"
DEFAULT_REPAIR = "the default repair (hub fix without --target)"


def targets() -> list[str]:
    return list(target_choices())


def recipes() -> list[str]:
    return [FOR_TARGET, DEFAULT_REPAIR, *builtin_recipes()]


def recipe_for(choice: str | None, target: str | None) -> Recipe:
    """The Recipe a choice names; the same Recipe `hub fix --target T` or `--recipe NAME` builds."""
    if choice in (None, "", FOR_TARGET):
        return replace(DEFAULT, target=target) if target else DEFAULT
    if choice == DEFAULT_REPAIR:
        return DEFAULT
    found = builtin_recipes()
    if choice not in found:
        raise UsageError(f"no built-in recipe {choice!r}; choose one the page lists")
    return found[choice]


def cli_options(choice: str | None, target: str | None) -> list[str]:
    """The `hub fix` options that make the same fix (shown on the page, so a user can re-run it)."""
    if choice in (None, "", FOR_TARGET):
        return ["--target", target] if target else []
    return [] if choice == DEFAULT_REPAIR else ["--recipe", choice]
