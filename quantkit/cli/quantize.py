"""`quantkit quantize`: recipe -> calibrate -> quantize -> evaluate -> store -> report."""

from __future__ import annotations

from pathlib import Path

import typer

from quantkit.cli.common import FormatOption
from quantkit.cli.output import OutputFormat, RichReporter, emit_json, stderr, stdout

DEFAULT_RECIPE = "fp8-dynamic"


def quantize(
    recipe: str = typer.Argument(DEFAULT_RECIPE, help="recipe file, or the name of a shipped recipe"),
    model: str | None = typer.Option(None, "--model", "-m", help="HF folder, hub id, or smollm2-135m"),
    out: Path | None = typer.Option(None, "--out", "-o", help="run folder to create (default runs/<id>)"),
    overrides: list[str] = typer.Option([], "--set", "-s", help="override a recipe field: key.sub=value"),
    device: str | None = typer.Option(None, "--device", help="auto | cpu | cuda (default: the recipe's)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out folder"),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", help="allow model code from the folder"
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show library logs"),
    bench: bool | None = typer.Option(
        None, "--bench/--no-bench", help="measure speed and memory (default: the recipe's bench.enabled)"
    ),
    restart: bool = typer.Option(
        False, "--restart", help="discard an interrupted run of this command instead of resuming it"
    ),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Quantize a model from a recipe, evaluate it against the baseline and store the run."""
    from quantkit.pipeline import QuantizeRequest, run_quantize
    from quantkit.recipe import load_recipe
    from quantkit.report import render, table

    if device is not None and device not in ("auto", "cpu", "cuda"):
        raise typer.BadParameter(f"'{device}' is not one of auto, cpu, cuda", param_hint="--device")
    resolved = load_recipe(recipe, overrides)
    human = output_format == OutputFormat.human
    if human:
        stderr.print(f"[bold]quantkit[/bold] recipe [cyan]{resolved.name}[/cyan] ({resolved.method})")
    request = QuantizeRequest(
        recipe=resolved,
        model=model,
        out=out,
        overwrite=overwrite,
        device=device,
        trust_remote_code=trust_remote_code,
        verbose=verbose,
        bench=bench,
        restart=restart,
    )
    result = run_quantize(request, RichReporter() if human else None)
    comparison = table.build([result.record])
    if human:
        stdout.print(render.to_rich(comparison))
        stderr.print(f"run saved to [bold]{result.record.path}[/bold]")
        if result.gate is not None:
            for check in result.gate.checks:
                colour = "green" if check.passed else "red"
                stderr.print(f"  gate [{colour}]{check.describe()}[/{colour}]")
    else:
        emit_json({"run": str(result.record.path), "manifest": result.record.manifest})
    if result.gate is not None and not result.gate.passed:
        raise typer.Exit(1)
