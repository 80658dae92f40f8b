"""`quantkit backends list|info`: the registered methods and their typed options."""

from __future__ import annotations

import typer

from quantkit.cli.common import FormatOption, help_markup
from quantkit.cli.output import OutputFormat, emit_json, stdout

app = typer.Typer(
    help="List quantization backends and show their options.",
    no_args_is_help=True,
    rich_markup_mode=help_markup(),
)


@app.command("list")
def list_backends(output_format: OutputFormat = FormatOption) -> None:
    """List the registered quantization methods."""
    from rich.table import Table

    from quantkit.backends import backend_names, get_backend

    rows = []
    for name in backend_names():
        backend = get_backend(name)
        rows.append(
            {"name": name, "library": backend.library, "runtime": backend.runtime, "summary": backend.summary}
        )
    if output_format == OutputFormat.json:
        emit_json(rows)
        return
    table = Table(title="backends")
    for column in ("name", "library", "runtime", "summary"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row["library"], row["runtime"], row["summary"])
    stdout.print(table)


@app.command("info")
def info(
    name: str = typer.Argument(..., help="backend name, e.g. fp8"), output_format: OutputFormat = FormatOption
) -> None:
    """Show a backend's options (their JSON schema) and defaults."""
    from rich.table import Table

    from quantkit.backends import get_backend

    backend = get_backend(name)
    schema = backend.options_model.model_json_schema()
    if output_format == OutputFormat.json:
        emit_json({"name": name, "summary": backend.summary, "options_schema": schema})
        return
    stdout.print(f"[bold]{name}[/bold]: {backend.summary}")
    doc = (backend.options_model.__doc__ or "").strip()
    if doc:
        stdout.print(" ".join(doc.split()))
    defaults = backend.options_model().model_dump(mode="json")
    table = Table(title="options")
    for column in ("option", "type", "default", "choices"):
        table.add_column(column)
    for field, spec in schema.get("properties", {}).items():
        choices = ", ".join(map(str, spec.get("enum", [])))
        kind = spec.get("type") or ("enum" if choices else "")
        table.add_row(field, str(kind), repr(defaults.get(field)), choices)
    stdout.print(table)
