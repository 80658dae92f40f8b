"""`quantkit eval RUN --tasks ...`: lm-eval task accuracy and recovery for stored runs;
`quantkit eval --baseline MODEL ARTIFACT...`: any artifact scored against a baseline."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import JsonValue

from quantkit.cli.common import (
    AllowImplausibleOption,
    ColumnsOption,
    FormatOption,
    VerboseOption,
    WideOption,
    device_option,
    device_value,
)
from quantkit.cli.output import OutputFormat, RichReporter, TableView, emit_json, stderr, stdout
from quantkit.device import DeviceChoice
from quantkit.errors import UserInputError

if TYPE_CHECKING:
    from quantkit.inputs.specs import LmEvalSpec
    from quantkit.results.manifest import TaskResult
    from quantkit.results.store import RunRecord

DEFAULT_TASKS = "quantkit_cloze"


def eval_tasks(
    targets: list[Path] = typer.Argument(
        ...,
        help="run folders made by quantkit quantize; with --baseline: GGUF files, HF folders or runs",
        metavar="RUN|ARTIFACT",
    ),
    baseline: str | None = typer.Option(
        None,
        "--baseline",
        "-b",
        help="score each ARTIFACT against this unquantized model (HF folder, hub id, .gguf, smollm2-135m)",
    ),
    tasks: str | None = typer.Option(
        None, "--tasks", "-t", help=f"comma-separated lm-eval task names (RUN default: {DEFAULT_TASKS})"
    ),
    num_fewshot: int | None = typer.Option(None, "--num-fewshot"),
    limit: float | None = typer.Option(None, "--limit", help="documents per task (or a fraction < 1)"),
    batch_size: int = typer.Option(8, "--batch-size"),
    recipe: str | None = typer.Option(
        None, "--recipe", "-r", help="with --baseline: take eval settings, gates and bench from this recipe"
    ),
    overrides: list[str] = typer.Option([], "--set", "-s", help="with --baseline: override a recipe field"),
    out: Path | None = typer.Option(None, "--out", "-o", help="with --baseline and one ARTIFACT: run folder"),
    names: list[str] = typer.Option(
        [], "--name", help="with --baseline: an ARTIFACT's display name (once per ARTIFACT, in order)"
    ),
    bench: bool = typer.Option(False, "--bench/--no-bench", help="with --baseline: measure speed and memory"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out folder"),
    device: DeviceChoice | None = device_option("the run's"),
    allow_implausible_baseline: bool = AllowImplausibleOption,
    endpoint: str | None = typer.Option(
        None, "--endpoint", help="score each RUN through this OpenAI-compatible server serving its artifact"
    ),
    served_model: str | None = typer.Option(None, "--served-model", help="with --endpoint: model name"),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="OPENAI_API_KEY", help="with --endpoint: the server's API key"
    ),
    top_logprobs: int | None = typer.Option(
        None, "--top-logprobs", help="with --endpoint: log-probs asked per position (default 20, vLLM's cap)"
    ),
    output_format: OutputFormat = FormatOption,
    wide: bool = WideOption,
    columns: str | None = ColumnsOption,
    verbose: bool = VerboseOption,
) -> None:
    """Run lm-eval tasks on each run's artifact and its baseline, updating the run; or, with
    --baseline, evaluate artifacts quantkit did not make (a run of kind external each)."""
    if endpoint is not None:
        from quantkit.cli.eval_endpoint import eval_endpoint

        if baseline is not None or tasks is not None:
            raise UserInputError(
                "--endpoint scores the runs' eval windows; it takes no --baseline or --tasks",
                "quantkit eval RUN --endpoint URL",
            )
        eval_endpoint(targets, endpoint, served_model, api_key, top_logprobs, output_format)
        return
    if baseline is None:
        external = _external_only(recipe, overrides, out, names, bench, allow_implausible_baseline)
        external += [("--wide", wide), ("--columns", columns)]
        given = [flag for flag, value in external if value]
        if given:
            raise UserInputError(f"{given[0]} needs --baseline", "quantkit eval --baseline MODEL ARTIFACT...")
    view = TableView.from_flags(columns, wide)
    records = _load_runs(targets) if baseline is None else []  # damaged runs first, then flags
    spec = _lm_eval_spec(tasks if tasks is not None or baseline is not None else DEFAULT_TASKS,
                         num_fewshot, limit, batch_size)  # fmt: skip
    if baseline is not None:
        from quantkit.cli.eval_external import ExternalEvalRequest, evaluate_external

        request = ExternalEvalRequest(
            baseline=baseline,
            artifacts=targets,
            recipe=recipe,
            overrides=overrides,
            lm_eval=spec,
            out=out,
            names=names,
            bench=bench,
            overwrite=overwrite,
            device=device_value(device),
            allow_implausible_baseline=allow_implausible_baseline,
            verbose=verbose,
        )
        evaluate_external(request, output_format, view)
        return
    assert spec is not None
    _eval_runs(records, spec, device_value(device), output_format, verbose)


def _external_only(
    recipe: str | None, overrides: list[str], out: Path | None, names: list[str], bench: bool, allow: bool
) -> list[tuple[str, object]]:
    return [
        ("--recipe", recipe),
        ("--set", overrides),
        ("--out", out),
        ("--name", names),
        ("--bench", bench),
        ("--allow-implausible-baseline", allow),
    ]


def _lm_eval_spec(
    tasks: str | None, num_fewshot: int | None, limit: float | None, batch_size: int
) -> LmEvalSpec | None:
    """The lm-eval settings from the flags (None: no tasks asked for), task names checked."""
    if tasks is None:
        return None
    from quantkit.evals.lm_eval_runner import check_tasks
    from quantkit.inputs.recipe import validate_section
    from quantkit.inputs.specs import LmEvalSpec

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
    return spec


def _load_runs(runs: list[Path]) -> list[RunRecord]:
    """The finished runs; a damaged one (or a damaged GGUF in one) is refused before any task."""
    from quantkit.results.store import load_run
    from quantkit.runtimes import runtime_class

    records = [load_run(path) for path in runs]
    for record in records:
        artifact = record.manifest.artifact
        runtime_class(artifact.runtime).check_artifact(record.path / artifact.path)
    return records


def _eval_runs(
    records: list[RunRecord], spec: LmEvalSpec, device: str | None, output_format: OutputFormat, verbose: bool
) -> None:
    from rich.table import Table

    from quantkit.evals.lm_eval_runner import recovery
    from quantkit.run.pipeline import eval_run

    done = []
    for record in records:
        if output_format == OutputFormat.human:
            stderr.print(f"lm-eval {', '.join(spec.tasks)} on {record.name} and its baseline")
        reporter = RichReporter() if output_format == OutputFormat.human else None
        result = eval_run(record, spec, device, reporter, verbose)
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
