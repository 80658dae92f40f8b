"""`quantkit bench RUN...`: measure (again) speed and memory of runs and their baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from quantkit.cli.common import FormatOption
from quantkit.cli.output import OutputFormat, emit_json, stderr, stdout


def bench(
    runs: list[Path] = typer.Argument(..., help="run folders made by quantkit quantize"),
    price_per_hour: float | None = typer.Option(
        None, "--price-per-hour", help="USD per device-hour, for cost"
    ),
    repeats: int | None = typer.Option(None, "--repeats", min=1, help="timings per setting (median)"),
    device: str | None = typer.Option(None, "--device", help="auto | cpu | cuda (default: the run's)"),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Benchmark each run's artifact and its baseline side by side; update the run's manifest."""
    from rich.table import Table

    from quantkit.bench_spec import BenchSpec
    from quantkit.device import resolve_device
    from quantkit.evals import perf
    from quantkit.evals.quality import with_info
    from quantkit.models import write_text_atomic
    from quantkit.store import MANIFEST, load_run

    results: list[dict[str, Any]] = []
    for path in runs:
        record = load_run(path)
        manifest = record.manifest
        spec = BenchSpec.model_validate(manifest.get("recipe", {}).get("bench") or {})
        updates = {
            k: v for k, v in (("price_per_hour", price_per_hour), ("repeats", repeats)) if v is not None
        }
        spec = spec.model_copy(update=updates)
        run_device = resolve_device(device or manifest.get("device", "auto"))
        if output_format == OutputFormat.human:
            stderr.print(f"benchmarking {record.name} and its baseline on {run_device}")
        artifact = manifest["artifact"]
        section = perf.measure_pair(
            Path(manifest["model"]["path"]), path / artifact["path"], artifact["runtime"], run_device, spec
        )
        base, quant = perf.metrics_from(section, spec)
        manifest["bench"] = section
        manifest.setdefault("metrics", {}).setdefault("baseline", {}).update(with_info(base))
        manifest["metrics"].setdefault("quantized", {}).update(with_info(quant))
        write_text_atomic(path / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        results.append({"run": str(path), "baseline": base, "quantized": quant})
    if output_format == OutputFormat.json:
        emit_json(results)
        return
    table = Table(title="speed and memory (medians; ratios vs baseline measured in the same run)")
    for column in (
        "run",
        "model",
        "prefill tok/s",
        "decode tok/s",
        "TTFT s",
        "peak mem MB",
        "weights MB",
        "$/1M tok",
    ):
        table.add_column(column, justify="left" if column in ("run", "model") else "right")
    for item in results:
        for label, values in (("baseline", item["baseline"]), ("quantized", item["quantized"])):
            cost = values.get("cost_per_mtok_usd")
            table.add_row(
                Path(item["run"]).name,
                label,
                f"{values['prefill_tok_s']:.1f}",
                f"{values['decode_tok_s']:.1f}",
                f"{values['ttft_s']:.3f}",
                f"{values['peak_memory_bytes'] / 1e6:.0f}",
                f"{values['weights_memory_bytes'] / 1e6:.0f}",
                "—" if cost is None else f"{cost:.3f}",
            )
    stdout.print(table)
