"""Render a Comparison as Markdown, JSON, HTML or Rich tables (one table per baseline group)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from quantkit.report.table import NOTE, TEXT_KEYS, Comparison, Group, format_cell

if TYPE_CHECKING:
    from rich.console import RenderableType


def _markdown_table(comparison: Comparison, group: Group) -> list[str]:
    columns = comparison.columns()
    header = "| " + " | ".join(title for _, title in columns) + " |"
    rule = "|" + "|".join("---" if key in TEXT_KEYS else "---:" for key, _ in columns) + "|"
    lines = [header, rule]
    for row in group.rows:
        cells = [format_cell(key, row.get(key)).replace("|", "\\|") for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def to_markdown(comparison: Comparison) -> str:
    """GitHub-flavoured Markdown tables (for PR comments and step summaries)."""
    lines = ["# quantkit comparison", ""]
    for group in comparison.groups:
        if len(comparison.groups) > 1:
            lines += [f"## {group.title()}", ""]
        lines += [*_markdown_table(comparison, group), ""]
    if comparison.warnings:
        lines += [*[f"> warning: {text}" for text in comparison.warnings], ""]
    lines += [NOTE, ""]
    return "\n".join(lines)


def to_json(comparison: Comparison) -> str:
    return json.dumps(comparison.to_json(), indent=2) + "\n"


def to_html(comparison: Comparison) -> str:
    """A self-contained HTML page: tables, warnings and inline SVG plots per group."""
    from quantkit.report.html import to_html as _to_html

    return _to_html(comparison)


def to_rich(
    comparison: Comparison, width: int | None = None, columns: list[str] | None = None, wide: bool = False
) -> RenderableType:
    """Rich tables for the terminal, one per baseline group: laid out to ``width`` (a terminal's)
    or with the chosen ``columns`` (``quantkit.report.terminal``); every column when ``wide`` or
    when there is no terminal to fit (piped output)."""
    from rich.console import Group as RichGroup
    from rich.markup import escape
    from rich.table import Table

    if not wide and (width is not None or columns is not None):
        from quantkit.report.terminal import fitted

        return fitted(comparison, width or 1_000_000, columns)

    tables = []
    every = comparison.columns()
    for group in comparison.groups:
        title = "quantkit: quantized vs baseline"
        if len(comparison.groups) > 1:
            title += f" — {group.title()}"
        table = Table(title=escape(title), show_lines=False)
        for key, heading in every:
            table.add_column(heading, justify="left" if key in TEXT_KEYS else "right")
        for index, row in enumerate(group.rows):
            style = "bold" if index == 0 else None
            table.add_row(*[escape(format_cell(key, row.get(key))) for key, _ in every], style=style)
        tables.append(table)
    return RichGroup(*tables)
