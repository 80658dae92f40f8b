"""`quantkit recipes list|show|validate`."""

from __future__ import annotations

from pathlib import Path

import typer

from quantkit.cli.common import FormatOption, help_markup
from quantkit.cli.output import OutputFormat, emit_json, stderr, stdout

app = typer.Typer(
    help="List, show and validate recipes.", no_args_is_help=True, rich_markup_mode=help_markup()
)


@app.command("list")
def list_recipes(output_format: OutputFormat = FormatOption) -> None:
    """List the shipped recipes."""
    from rich.table import Table

    from quantkit.inputs.recipe import load_recipe
    from quantkit.paths import recipes_dir

    rows = []
    for path in sorted(recipes_dir().glob("*.yaml")):
        recipe = load_recipe(path)
        rows.append(
            {"name": path.stem, "method": recipe.method, "description": recipe.description, "path": str(path)}
        )
    if output_format == OutputFormat.json:
        emit_json(rows)
        return
    table = Table(title="recipes")
    for column in ("name", "method", "description"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row["method"], row["description"])
    stdout.print(table)


@app.command("show")
def show(
    recipe: str = typer.Argument(..., help="recipe file or shipped name"),
    overrides: list[str] = typer.Option([], "--set", "-s", help="override a field: key.sub=value"),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Print a recipe fully resolved (defaults filled in, overrides applied)."""
    from quantkit.inputs.recipe import load_recipe

    resolved = load_recipe(recipe, overrides)
    if output_format == OutputFormat.json:
        emit_json(resolved.model_dump(mode="json"))
    else:
        typer.echo(resolved.to_yaml(), nl=False)


@app.command("validate")
def validate(
    recipes: list[Path] = typer.Argument(..., help="recipe files to check", metavar="RECIPE"),
    overrides: list[str] = typer.Option([], "--set", "-s", help="override a field: key.sub=value"),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Validate recipe files; exit 2 on the first invalid one."""
    from quantkit.inputs.recipe import load_recipe

    valid = []
    for path in recipes:
        resolved = load_recipe(path, overrides)
        stderr.print(f"[green]✓[/green] {path}: {resolved.name} ({resolved.method}) is valid")
        valid.append({"path": str(path), "name": resolved.name, "method": resolved.method})
    if output_format == OutputFormat.json:
        emit_json(valid)
