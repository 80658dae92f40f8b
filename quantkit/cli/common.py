"""Options shared by several commands."""

from __future__ import annotations

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


def device_option(default_help: str) -> DeviceChoice | None:
    """``--device auto|cpu|cuda`` (typer refuses anything else as a usage error, exit 2)."""
    return typer.Option(None, "--device", help=f"auto | cpu | cuda (default: {default_help})")


def device_value(choice: DeviceChoice | None) -> str | None:
    return None if choice is None else choice.value
