"""Options shared by several commands."""

from __future__ import annotations

import shutil
from typing import Literal

import typer

from quantkit.cli.output import OutputFormat
from quantkit.device import DeviceChoice

FormatOption = typer.Option(
    OutputFormat.human, "--format", "-f", help="human: tables and progress; json: data on stdout"
)

AllowImplausibleOption = typer.Option(
    False,
    "--allow-implausible-baseline",
    help="go on when the baseline fails the sanity guard (ppl not below the unigram ppl, or top-1 "
    "not above the commonest token's share, on the eval text)",
)


WideOption = typer.Option(False, "--wide", help="every column of the table, at its natural width")
ColumnsOption = typer.Option(
    None, "--columns", help="the table's columns, comma-separated (e.g. name,scheme,kld_mean,gate)"
)
VerboseOption = typer.Option(
    False, "--verbose", "-v", help="library logs on the terminal (otherwise in the run's library.log)"
)


def device_option(default_help: str) -> DeviceChoice | None:
    """``--device auto|cpu|cuda`` (typer refuses anything else as a usage error, exit 2)."""
    return typer.Option(None, "--device", help=f"auto | cpu | cuda (default: {default_help})")


def device_value(choice: DeviceChoice | None) -> str | None:
    return None if choice is None else choice.value


# Typer's rich help puts options in a table whose name column it cuts with "…" when the
# terminal is narrow ("--allow-implausible…" at 80 columns); click's plain help wraps the
# description instead and keeps every option name whole.
_RICH_HELP_MIN_WIDTH = 110


def help_markup() -> Literal["rich"] | None:
    """Typer's ``rich_markup_mode``: rich panels in a wide terminal, click's plain help (every
    option name whole) below ``_RICH_HELP_MIN_WIDTH`` columns."""
    return "rich" if shutil.get_terminal_size().columns >= _RICH_HELP_MIN_WIDTH else None
