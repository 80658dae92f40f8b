"""`quantkit sweep`: many recipes (and grid points) against one baseline, one report."""

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
from quantkit.cli.output import OutputFormat, TableView, emit_json, print_comparison, stderr
from quantkit.device import DeviceChoice


def sweep(
    items: list[str] = typer.Argument(
        ..., help="a sweep file, or recipes (names or files)", metavar="SWEEP|RECIPE..."
    ),
    models: list[str] = typer.Option([], "--model", "-m", help="model(s) to sweep (repeatable)"),
    grid: list[str] = typer.Option([], "--grid", "-g", help="key=v1,v2: one run per value (repeatable)"),
    overrides: list[str] = typer.Option(
        [], "--set", "-s", help="override a field of every recipe: key=value"
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="the sweep folder (default runs/sweeps/<name>)"
    ),
    name: str | None = typer.Option(
        None, "--name", help="the sweep's name (default: the file's, or 'sweep')"
    ),
    ray: str | None = typer.Option(
        None, "--ray", help="run on a Ray cluster: auto, HOST:PORT, ray://HOST:10001, or local"
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", "-j", min=1, help="local runs at once (default: one per GPU)"
    ),
    device: DeviceChoice | None = device_option("each recipe's"),
    bench: bool | None = typer.Option(None, "--bench/--no-bench", help="measure speed and memory"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="allow model code"),
    verbose: bool = VerboseOption,
    allow_implausible_baseline: bool = AllowImplausibleOption,
    output_format: OutputFormat = FormatOption,
    wide: bool = WideOption,
    columns: str | None = ColumnsOption,
) -> None:
    """Quantize and evaluate many recipes against one baseline; one folder, one report."""
    from rich.markup import escape

    from quantkit.cli.sweep_view import RichSweepView
    from quantkit.sweep.driver import SilentView, SweepRequest, run_sweep, sweep_comparison
    from quantkit.sweep.spec import SweepFlags, spec_from_command

    view = TableView.from_flags(columns, wide)
    flags = SweepFlags(models, grid, overrides, name, ray, jobs, device_value(device))
    spec = spec_from_command(items, flags)
    request = SweepRequest(
        spec=spec,
        out=out,
        bench=bench,
        verbose=verbose,
        trust_remote_code=trust_remote_code,
        allow_implausible_baseline=allow_implausible_baseline,
    )
    human = output_format == OutputFormat.human
    result = run_sweep(request, RichSweepView() if human else SilentView())
    if human:
        print_comparison(sweep_comparison(result), view)
        counts = result.manifest.counts()
        stderr.print(
            f"sweep saved to [bold]{escape(str(result.folder))}[/bold]: {counts['done']} done, "
            f"{counts['failed']} failed; {counts['baselines']} baseline(s), "
            f"{counts['references_computed']} reference(s) and {counts['baseline_bench_sides_measured']} "
            "baseline bench(es) computed for it"
        )
        for run in result.manifest.runs:
            if run.state == "failed":
                stderr.print(f"  [red]failed[/red] {escape(run.name)}: {escape(run.error or '')}")
            elif run.gate_passed is False:
                stderr.print(f"  [red]gate failed[/red] {escape(run.name)}")
    else:
        emit_json({"sweep": str(result.folder), "manifest": result.manifest.model_dump(mode="json")})
    if result.exit_code:
        raise typer.Exit(result.exit_code)
