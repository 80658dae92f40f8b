"""`quantkit bench RUN...`: measure (again) speed and memory of runs and their baseline."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from quantkit.cli.common import FormatOption, device_option, device_value
from quantkit.cli.output import OutputFormat, RichReporter, emit_json, stderr, stdout
from quantkit.device import DeviceChoice


def bench(
    runs: list[Path] = typer.Argument(..., help="run folders made by quantkit quantize", metavar="RUN"),
    price_per_hour: float | None = typer.Option(
        None, "--price-per-hour", help="USD per device-hour, for cost"
    ),
    repeats: int | None = typer.Option(None, "--repeats", help="timings per setting (median)"),
    device: DeviceChoice | None = device_option("the run's"),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Benchmark each run's artifact and its baseline side by side; update the run (manifest,
    gate verdict, reports)."""
    from rich.table import Table

    from quantkit.metrics import format_metric
    from quantkit.pipeline import bench_run
    from quantkit.recipe import validate_section
    from quantkit.specs import BenchSpec
    from quantkit.store import load_run

    records = [load_run(path) for path in runs]
    updates = {k: v for k, v in (("price_per_hour", price_per_hour), ("repeats", repeats)) if v is not None}
    flags = {"price_per_hour": "--price-per-hour", "repeats": "--repeats"}
    specs = [
        validate_section(
            BenchSpec, record.manifest.recipe.bench.model_dump(mode="json") | updates, "bench", flags
        )
        for record in records
    ]  # every flag is checked before anything is measured
    done = []
    for record, spec in zip(records, specs, strict=True):
        if output_format == OutputFormat.human:
            stderr.print(f"benchmarking {record.name} and its baseline")
        reporter = RichReporter() if output_format == OutputFormat.human else None
        done.append(bench_run(record, spec, device_value(device), reporter).record)
    if output_format == OutputFormat.json:
        emit_json(
            [
                {
                    "run": str(run.path),
                    "baseline": run.manifest.metrics.values("baseline"),
                    "quantized": run.manifest.metrics.values("quantized"),
                    "bench": None
                    if run.manifest.bench is None
                    else run.manifest.bench.model_dump(mode="json"),
                }
                for run in done
            ]
        )
        return
    names = (
        "prefill_tok_s",
        "decode_tok_s",
        "ttft_s",
        "peak_memory_bytes",
        "weights_memory_bytes",
        "cost_per_mtok_usd",
    )
    table = Table(title="speed and memory (medians; ratios vs baseline measured in the same run)")
    for column in (
        "run",
        "model",
        "prefill tok/s",
        "decode tok/s",
        "TTFT",
        "peak mem",
        "weights mem",
        "$/1M tok",
    ):
        table.add_column(column, justify="left" if column in ("run", "model") else "right")
    for run in done:
        for label in ("baseline", "quantized"):
            values = run.manifest.metrics.values(label)
            table.add_row(run.path.name, label, *(format_metric(name, values.get(name)) for name in names))
    stdout.print(table)
    for run in done:
        for note in getattr(run.manifest.bench, "notes", []):
            stderr.print(f"[yellow]note:[/yellow] {escape(run.path.name)}: {escape(note)}")
