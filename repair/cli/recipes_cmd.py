"""`ckpt-repair recipes`: list the built-in recipes (or print one as TOML-ready data)."""

from __future__ import annotations

import json

import click


@click.command()
@click.argument("name", required=False)
def recipes(name: str | None) -> None:
    """List the built-in recipes; with NAME, show that recipe's rules."""
    from repair.planning.recipe import builtin_recipes

    found = builtin_recipes()
    if name:
        if name not in found:
            from repair.errors import UsageError

            raise UsageError(f"no built-in recipe {name!r}; `ckpt-repair recipes` lists them")
        click.echo(json.dumps(found[name].as_dict(), indent=2))
        return
    for key, recipe in found.items():
        click.echo(f"{key:<36} {recipe.description}")
