"""Options shared by several commands."""

from __future__ import annotations

import typer

from quantkit.cli.output import OutputFormat

FormatOption = typer.Option(
    OutputFormat.human, "--format", "-f", help="human: tables and progress; json: data on stdout"
)
