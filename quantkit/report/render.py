"""Render a Comparison as Markdown, JSON, HTML or a Rich table."""

from __future__ import annotations

import json
from typing import Any

from quantkit.report.table import TEXT_KEYS, Comparison, format_cell


def to_markdown(comparison: Comparison) -> str:
    """GitHub-flavoured Markdown table (for PR comments and step summaries)."""
    columns = comparison.columns()
    header = "| " + " | ".join(title for _, title in columns) + " |"
    rule = "|" + "|".join("---" if key in TEXT_KEYS else "---:" for key, _ in columns) + "|"
    lines = ["# quantkit comparison", "", header, rule]
    for row in comparison.rows:
        cells = [format_cell(key, row.get(key)).replace("|", "\\|") for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    if comparison.warnings:
        lines += ["", *[f"> warning: {text}" for text in comparison.warnings]]
    lines += [
        "",
        "Δppl and KLD are against the unquantized baseline on identical token windows; "
        "KLD is KL(baseline ‖ quantized) in nats per token.",
        "",
    ]
    return "\n".join(lines)


def to_json(comparison: Comparison) -> str:
    return json.dumps(comparison.to_json(), indent=2) + "\n"


def to_html(comparison: Comparison) -> str:
    """A self-contained HTML page: table, warnings and two inline SVG plots."""
    from quantkit.report.html import to_html as _to_html

    return _to_html(comparison)


def to_rich(comparison: Comparison) -> Any:
    """A Rich Table for the terminal."""
    from rich.table import Table

    table = Table(title="quantkit: quantized vs baseline", show_lines=False)
    columns = comparison.columns()
    for key, title in columns:
        table.add_column(title, justify="left" if key in TEXT_KEYS else "right")
    for index, row in enumerate(comparison.rows):
        style = "bold" if index == 0 else None
        table.add_row(*[format_cell(key, row.get(key)) for key, _ in columns], style=style)
    return table
