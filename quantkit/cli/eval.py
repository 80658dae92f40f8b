"""`quantkit eval RUN --tasks ...`: lm-eval task accuracy and recovery for stored runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import JsonValue

from quantkit.cli.common import FormatOption, device_option, device_value
from quantkit.cli.output import OutputFormat, RichReporter, emit_json, stderr, stdout
from quantkit.device import DeviceChoice

if TYPE_CHECKING:
    from quantkit.manifest import TaskResult


def eval_tasks(
    runs: list[Path] = typer.Argument(..., help="run folders made by quantkit quantize", metavar="RUN"),
    tasks: str = typer.Option("quantkit_cloze", "--tasks", "-t", help="comma-separated lm-eval task names"),
    num_fewshot: int | None = typer.Option(None, "--num-fewshot"),
    limit: float | None = typer.Option(None, "--limit", help="documents per task (or a fraction < 1)"),
    batch_size: int = typer.Option(8, "--batch-size"),
    device: DeviceChoice | None = device_option("the run's"),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Run lm-eval tasks on each run's artifact and its baseline; update the run (manifest,
    recovery over all its lm-eval entries, gate verdict, reports)."""
    from rich.table import Table

    from quantkit.evals.lm_eval_runner import check_tasks
    from quantkit.pipeline import eval_run
    from quantkit.recipe import validate_section
    from quantkit.specs import LmEvalSpec
    from quantkit.store import load_run

    records = [load_run(path) for path in runs]
    for record in records:  # a damaged GGUF is refused before any task runs
        if record.manifest.artifact.runtime == "llamacpp":
            from quantkit.runtimes.llamacpp import check_gguf, gguf_file

            check_gguf(gguf_file(record.path / record.manifest.artifact.path))
    amount = None if limit is None else (int(limit) if limit >= 1 else limit)
    flags = {
        "tasks": "--tasks",
        "num_fewshot": "--num-fewshot",
        "limit": "--limit",
        "batch_size": "--batch-size",
    }
    names: list[JsonValue] = [t.strip() for t in tasks.split(",") if t.strip()]
    raw: dict[str, JsonValue] = {
        "tasks": names,
        "num_fewshot": num_fewshot,
        "limit": amount,
        "batch_size": batch_size,
    }
    spec = validate_section(LmEvalSpec, raw, "lm_eval", flags)
    check_tasks(spec.tasks)
    from quantkit.evals.lm_eval_runner import recovery

    done = []
    for record in records:
        if output_format == OutputFormat.human:
            stderr.print(f"lm-eval {', '.join(spec.tasks)} on {record.name} and its baseline")
        reporter = RichReporter() if output_format == OutputFormat.human else None
        result = eval_run(record, spec, device_value(device), reporter)
        section = next(entry for entry in result.record.manifest.lm_eval or [] if entry.settings == spec)
        done.append((result.record, section, recovery(section.baseline, section.artifact)))
    if output_format == OutputFormat.json:
        emit_json(
            [
                {
                    "run": str(run.path),
                    "baseline": {
                        task: entry.model_dump(mode="json") for task, entry in section.baseline.items()
                    },
                    "artifact": {
                        task: entry.model_dump(mode="json") for task, entry in section.artifact.items()
                    },
                    "recovery_pct": recovered,
                    "task_recovery_pct": run.manifest.metric("task_recovery_pct"),
                }
                for run, section, recovered in done
            ]
        )
        return
    table = Table(title="lm-eval: quantized vs baseline")
    for column in ("run", "task", "metric", "baseline", "quantized", "recovery %"):
        table.add_column(column, justify="left" if column in ("run", "task", "metric") else "right")

    def shown(entry: TaskResult | None) -> str:
        if entry is None:
            return "—"
        return f"{entry.value:.4f}" + ("" if entry.stderr is None else f" ± {entry.stderr:.4f}")

    for run, section, recovered in done:
        for task, entry in section.baseline.items():
            table.add_row(
                run.path.name,
                task,
                entry.metric,
                shown(entry),
                shown(section.artifact.get(task)),
                f"{recovered.get(task, float('nan')):.1f}",
            )
    stdout.print(table)
