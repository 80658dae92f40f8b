"""The Typer app, assembled from one module per command group, and ``main()``."""

from __future__ import annotations

import os
import sys

import typer

from quantkit import __version__
from quantkit.cli import (
    backends,
    bench,
    eval,
    gate,
    plan,
    quantize,
    recipes,
    report,
    runs,
    search,
    serve,
    sweep,
)
from quantkit.cli.common import help_markup
from quantkit.errors import QuantkitError

app = typer.Typer(
    name="quantkit",
    help="Quantize a causal LM (GPTQ, AWQ, GGUF, FP8), measure the quality delta, report and gate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=help_markup(),
)
app.command("quantize")(quantize.quantize)
app.command("report")(report.report)
app.command("gate")(gate.gate)
app.command("bench")(bench.bench)
app.command("plan")(plan.plan)
app.command("eval")(eval.eval_tasks)
app.command("sweep")(sweep.sweep)
app.command("sensitivity")(search.sensitivity)
app.command("search")(search.search)
app.command("serve")(serve.serve)
app.add_typer(recipes.app, name="recipes")
app.add_typer(backends.app, name="backends")
app.add_typer(runs.app, name="runs")


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


RESUME_HINT = (
    "run the same command again: it resumes from any completed stage that was kept "
    "(quantkit runs list shows them, quantkit runs clean removes them)"
)
SWEEP_HINT = "run the same command again: finished runs are kept, the interrupted one resumes"
UPDATE_HINT = "the run was left as it was (it is rewritten only at the end): run the same command again"
RERUN_HINT = "nothing was changed: run the same command again"


def interrupted_hint(argv: list[str]) -> str:
    """What an interrupted command leaves: only quantize keeps stages to resume from."""
    command = next((arg for arg in argv if not arg.startswith("-")), "")
    if command == "quantize":
        return RESUME_HINT
    if command == "sweep":
        return SWEEP_HINT
    return UPDATE_HINT if command in ("bench", "eval") else RERUN_HINT


def _fail(message: str, hint: str, code: int) -> int:
    """Print an error as one line plus a hint (plain text: robust even mid-progress-bar)."""
    first_line = message.strip().splitlines()[0] if message.strip() else "failed"
    sys.stderr.write(f"error: {first_line}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    sys.stderr.flush()
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map errors to one line, a hint and an exit code (2 input, 3 internal)."""
    debug = bool(os.environ.get("QUANTKIT_DEBUG"))
    hint = interrupted_hint(sys.argv[1:] if argv is None else argv)
    try:
        result = app(args=argv, standalone_mode=False)
        code = int(result) if isinstance(result, int) else 0
        if code == 130:  # typer turns Ctrl-C into exit code 130
            return _fail("interrupted", hint, 130)
        return code
    except QuantkitError as err:
        if debug:
            raise
        return _fail(err.message, err.hint, err.exit_code)
    except typer.Exit as err:
        return int(err.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        return _fail("interrupted", hint, 130)
    except Exception as err:
        if _is_usage_error(err):  # typer's (vendored click) usage errors: bad flag, command...
            message = err.format_message()  # type: ignore[attr-defined]
            return _fail(message, "see quantkit --help", 2) if message else 2  # empty: help shown
        if debug:
            raise
        first = str(err).splitlines()[0] if str(err) else ""
        return _fail(
            f"internal error: {type(err).__name__}: {first}",
            "rerun with QUANTKIT_DEBUG=1 for the traceback",
            3,
        )


def _is_usage_error(err: Exception) -> bool:
    return callable(getattr(err, "format_message", None)) and isinstance(getattr(err, "exit_code", None), int)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
