"""`quantkit quantize`: recipe -> calibrate -> quantize -> evaluate -> store -> report."""

from __future__ import annotations

from pathlib import Path

import typer

from quantkit.cli.common import (
    AllowImplausibleOption,
    ColumnsOption,
    FormatOption,
    VerboseOption,
    WideOption,
    device_option,
    device_value,
)
from quantkit.cli.output import (
    OutputFormat,
    RichReporter,
    TableView,
    emit_json,
    print_comparison,
    print_notes,
    stderr,
)
from quantkit.device import DeviceChoice

DEFAULT_RECIPE = "fp8-dynamic"


def quantize(
    recipe: str = typer.Argument(DEFAULT_RECIPE, help="recipe file, or the name of a shipped recipe"),
    model: str | None = typer.Option(
        None, "--model", "-m", help="HF folder, hub id, .gguf file (or org/name:file.gguf), or smollm2-135m"
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="run folder to create (default runs/<id>)"),
    overrides: list[str] = typer.Option([], "--set", "-s", help="override a recipe field: key.sub=value"),
    device: DeviceChoice | None = device_option("the recipe's"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out folder"),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", help="allow model code from the folder"
    ),
    verbose: bool = VerboseOption,
    bench: bool | None = typer.Option(
        None, "--bench/--no-bench", help="measure speed and memory (default: the recipe's bench.enabled)"
    ),
    restart: bool = typer.Option(
        False, "--restart", help="discard an interrupted run of this command instead of resuming it"
    ),
    allow_implausible_baseline: bool = AllowImplausibleOption,
    output_format: OutputFormat = FormatOption,
    wide: bool = WideOption,
    columns: str | None = ColumnsOption,
) -> None:
    """Quantize a model from a recipe, evaluate it against the baseline and store the run."""
    from rich.markup import escape

    from quantkit.inputs.recipe import load_recipe_and_base, run_name
    from quantkit.report import table
    from quantkit.run.pipeline import QuantizeRequest, run_quantize

    view = TableView.from_flags(columns, wide)
    resolved, base = load_recipe_and_base(recipe, overrides)
    print_notes(base.gates.deprecation_notes())
    human = output_format == OutputFormat.human
    if human:
        stderr.print(f"[bold]quantkit[/bold] recipe [cyan]{escape(resolved.name)}[/cyan] ({resolved.method})")
    request = QuantizeRequest(
        recipe=resolved,
        model=model,
        out=out,
        overwrite=overwrite,
        device=device_value(device),
        trust_remote_code=trust_remote_code,
        verbose=verbose,
        bench=bench,
        restart=restart,
        name=run_name(resolved, base),
        allow_implausible_baseline=allow_implausible_baseline,
    )
    result = run_quantize(request, RichReporter() if human else None)
    comparison = table.build([result.record])
    if human:
        print_comparison(comparison, view)
        stderr.print(f"run saved to [bold]{escape(str(result.record.path))}[/bold]")
        if result.gate is not None:
            for check in result.gate.checks:
                colour = "green" if check.passed else "red"
                stderr.print(f"  gate [{colour}]{escape(check.describe())}[/{colour}]")
    else:
        emit_json(
            {"run": str(result.record.path), "manifest": result.record.manifest.model_dump(mode="json")}
        )
    if result.gate is not None and not result.gate.passed:
        raise typer.Exit(1)
