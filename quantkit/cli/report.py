"""`quantkit report RUN...`: the comparison table, written as Markdown, JSON and/or HTML."""

from __future__ import annotations

from pathlib import Path

import typer

from quantkit.cli.common import ColumnsOption, FormatOption, WideOption
from quantkit.cli.output import OutputFormat, TableView, emit_json, print_comparison, stderr
from quantkit.errors import OutputError

_WRITERS = {
    ".md": "to_markdown",
    ".markdown": "to_markdown",
    ".json": "to_json",
    ".html": "to_html",
    ".htm": "to_html",
}


def report(
    runs: list[Path] = typer.Argument(..., help="run folders made by quantkit quantize", metavar="RUN"),
    outputs: list[Path] = typer.Option(
        [], "--output", "-o", help="write the report: .md, .json or .html (repeatable)"
    ),
    output_format: OutputFormat = FormatOption,
    wide: bool = WideOption,
    columns: str | None = ColumnsOption,
) -> None:
    """Compare runs against their baseline."""
    from quantkit.report import render, table
    from quantkit.results.store import load_run
    from quantkit.util.fileio import write_text_atomic

    for target in outputs:
        if target.suffix.lower() not in _WRITERS:
            raise OutputError(
                f"cannot write a report as '{target.suffix or target.name}'",
                "use a .md, .json or .html file name",
            )
    view = TableView.from_flags(columns, wide)
    records = [load_run(path) for path in runs]
    comparison = table.build(records)
    for target in outputs:
        writer = getattr(render, _WRITERS[target.suffix.lower()])
        try:
            write_text_atomic(target, writer(comparison))
        except OSError as err:
            raise OutputError(f"cannot write '{target}' ({err.strerror})", "pick another path") from None
        stderr.print(f"wrote {target}")
    if output_format == OutputFormat.json:
        emit_json(comparison.to_json())
        return
    print_comparison(comparison, view)
