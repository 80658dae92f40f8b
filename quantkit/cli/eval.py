"""`quantkit eval RUN --tasks ...`: lm-eval task accuracy and recovery for stored runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from quantkit.cli.common import FormatOption
from quantkit.cli.output import OutputFormat, emit_json, stderr, stdout


def eval_tasks(
    runs: list[Path] = typer.Argument(..., help="run folders made by quantkit quantize"),
    tasks: str = typer.Option("quantkit_cloze", "--tasks", "-t", help="comma-separated lm-eval task names"),
    num_fewshot: int | None = typer.Option(None, "--num-fewshot", min=0),
    limit: float | None = typer.Option(None, "--limit", min=0, help="documents per task (or a fraction < 1)"),
    batch_size: int = typer.Option(8, "--batch-size", min=1),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Run lm-eval tasks on each run's artifact and its baseline; store recovery in the manifest."""
    from rich.table import Table

    from quantkit.device import resolve_device
    from quantkit.evals import lm_eval_runner as runner
    from quantkit.evals.quality import with_info
    from quantkit.lm_eval_spec import LmEvalSpec
    from quantkit.models import fingerprint, write_text_atomic
    from quantkit.progress import library_bars_hidden, quiet_libraries
    from quantkit.store import MANIFEST, load_run

    quiet_libraries(False)
    records = [load_run(path) for path in runs]
    for record in records:  # a damaged GGUF is refused before any task runs
        artifact = record.manifest["artifact"]
        if artifact["runtime"] == "llamacpp":
            from quantkit.runtimes.llamacpp import check_gguf, gguf_file

            check_gguf(gguf_file(record.path / artifact["path"]))
    amount = None if limit is None else (int(limit) if limit >= 1 else limit)
    spec = LmEvalSpec(
        tasks=[t.strip() for t in tasks.split(",") if t.strip()],
        num_fewshot=num_fewshot,
        limit=amount,
        batch_size=batch_size,
    )
    manager = runner.check_tasks(spec.tasks)
    results: list[dict[str, Any]] = []
    for record in records:
        manifest = record.manifest
        device = resolve_device(manifest.get("device", "auto"))
        model_path = Path(manifest["model"]["path"])
        if output_format == OutputFormat.human:
            stderr.print(f"lm-eval {', '.join(spec.tasks)} on {record.name} and its baseline")
        artifact = manifest["artifact"]
        with library_bars_hidden(False):
            base, cached = runner.baseline(model_path, fingerprint(model_path), spec, manager, device)
            samples = record.path / "lm_eval"
            quant = runner.evaluate(
                artifact["runtime"], record.path / artifact["path"], spec, manager, device, samples
            )
        recovered = runner.recovery(base, quant)
        section = {"settings": spec.model_dump(mode="json"), "baseline": base, "baseline_cached": cached}
        manifest["lm_eval"] = [*(manifest.get("lm_eval") or []), section | {"artifact": quant}]
        metrics = {f"task_recovery_pct:{task}": value for task, value in recovered.items()}
        if recovered:
            metrics["task_recovery_pct"] = sum(recovered.values()) / len(recovered)
        manifest.setdefault("metrics", {}).setdefault("quantized", {}).update(with_info(metrics))
        write_text_atomic(record.path / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        results.append(
            {"run": str(record.path), "baseline": base, "artifact": quant, "recovery_pct": recovered}
        )
    if output_format == OutputFormat.json:
        emit_json(results)
        return
    table = Table(title="lm-eval: quantized vs baseline")
    for column in ("run", "task", "metric", "baseline", "quantized", "recovery %"):
        table.add_column(column, justify="left" if column in ("run", "task", "metric") else "right")
    for item in results:
        for task, entry in item["baseline"].items():
            quantized = item["artifact"].get(task, {})

            def shown(value: Any, error: Any) -> str:
                return "—" if value is None else f"{value:.4f}" + ("" if error is None else f" ± {error:.4f}")

            table.add_row(
                Path(item["run"]).name,
                task,
                entry["metric"],
                shown(entry["value"], entry["stderr"]),
                shown(quantized.get("value"), quantized.get("stderr")),
                f"{item['recovery_pct'].get(task, float('nan')):.1f}",
            )
    stdout.print(table)
