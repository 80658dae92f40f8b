"""The Typer app, assembled from one module per command group, and ``main()``."""

from __future__ import annotations

import os
import sys

import click
import typer

from quantkit import __version__
from quantkit.cli import gate, quantize, recipes, report
from quantkit.errors import QuantkitError

app = typer.Typer(
    name="quantkit",
    help="Quantize a causal LM (GPTQ, AWQ, GGUF, FP8), measure the quality delta, report and gate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("quantize")(quantize.quantize)
app.command("report")(report.report)
app.command("gate")(gate.gate)
app.add_typer(recipes.app, name="recipes")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"quantkit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version"
    ),
) -> None:
    """quantkit command line."""


def _fail(message: str, hint: str, code: int) -> int:
    from quantkit.cli.output import stderr

    stderr.print(f"[red]error:[/red] {message}", highlight=False, markup=True)
    if hint:
        stderr.print(f"[dim]hint:[/dim] {hint}", highlight=False)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map errors to one line, a hint and an exit code (2 input, 3 internal)."""
    debug = bool(os.environ.get("QUANTKIT_DEBUG"))
    try:
        result = app(args=argv, standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except QuantkitError as err:
        if debug:
            raise
        return _fail(err.message, err.hint, err.exit_code)
    except click.exceptions.Exit as err:
        return int(err.exit_code)
    except click.ClickException as err:
        return _fail(err.format_message(), "see --help", 2)
    except (KeyboardInterrupt, click.exceptions.Abort):
        return _fail("interrupted", "nothing partial was kept; run the command again", 130)
    except Exception as err:
        if debug:
            raise
        first = str(err).splitlines()[0] if str(err) else ""
        return _fail(
            f"internal error: {type(err).__name__}: {first}",
            "rerun with QUANTKIT_DEBUG=1 for the traceback",
            3,
        )


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
