"""After the stages: the run's manifest, gate verdict and own reports, from the stage results.

``quantize``, ``bench RUN`` and ``eval RUN`` all end here, so after any of them the
manifest, the stage checksums, the gate verdict and ``report.md``/``report.json`` agree.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quantkit import __version__
from quantkit.device import dtype_bits
from quantkit.results.manifest import (
    MANIFEST_SCHEMA,
    BaselineInfo,
    EnvironmentInfo,
    EvalInfo,
    Manifest,
    MetricsRecord,
    ModelInfo,
    ResumeInfo,
    Seeds,
    StageRecord,
    WindowsInfo,
    with_info,
)
from quantkit.serving.record import cost_per_task
from quantkit.util.library_log import LIBRARY_LOG, LOG_NAME

if TYPE_CHECKING:
    from pathlib import Path

    from quantkit.inputs.models import ModelSource
    from quantkit.results.gate import GateResult
    from quantkit.stages.context import RunContext


@dataclass
class RunHeader:
    """What a run records beside its stage results: identity, inputs and environment."""

    run_id: str
    name: str
    created: str
    calibration: WindowsInfo | None
    eval_windows: WindowsInfo
    environment: EnvironmentInfo
    resume: ResumeInfo | None = None
    timings: dict[str, float] = field(default_factory=dict)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def model_info(source: ModelSource) -> ModelInfo:
    return ModelInfo(
        spec=source.spec,
        kind=source.kind,
        path=str(source.path),
        architecture=source.architecture,
        fingerprint=source.fingerprint(),
        disk_bytes=source.disk_bytes(),
        parameters=source.parameters(),
    )


def _metrics(ctx: RunContext) -> tuple[dict[str, float], dict[str, float]]:
    """(baseline, quantized) metric values from every stage that ran, and those derived from
    several stages' (the mean task recovery, the served cost of a successful task)."""
    baseline: dict[str, float] = {}
    quantized: dict[str, float] = {}
    for _, result in ctx.results.items():
        sides = result.metric_values()
        baseline |= sides.baseline
        quantized |= sides.artifact
    tasks = [value for name, value in quantized.items() if name.startswith("task_recovery_pct:")]
    if tasks:
        quantized["task_recovery_pct"] = sum(tasks) / len(tasks)
    return baseline, quantized | cost_per_task(quantized)


def _timings(ctx: RunContext, header: RunHeader) -> dict[str, float]:
    """The header's timings plus each stage's (summed where several stages share a key)."""
    timings = dict(header.timings)
    stages: dict[str, float] = {}
    for _, result in ctx.results.items():
        for key, seconds in result.timings().items():
            stages[key] = stages.get(key, 0.0) + seconds
    return timings | {key: round(seconds, 3) for key, seconds in stages.items()}


def _stage_fields(ctx: RunContext) -> dict[str, object]:
    """The manifest fields the stages fill, merged: mappings key by key, lists in stage order."""
    merged: dict[str, object] = {}
    for _, result in ctx.results.items():
        for key, value in result.manifest_fields().items():
            earlier = merged.get(key)
            if isinstance(earlier, dict) and isinstance(value, dict):
                merged[key] = earlier | value
            elif isinstance(earlier, list) and isinstance(value, list):
                merged[key] = earlier + value
            else:
                merged[key] = value
    return merged


def _stage_records(ctx: RunContext) -> dict[str, StageRecord]:
    """Every stage's record: the journal's completion and checksums, and its result (a stage
    that failed without failing the run has a result and no completion)."""
    checksums = ctx.journal.checksums()
    records = {name: StageRecord.model_validate(record) for name, record in checksums.items()}
    for name, result in ctx.results.items():
        record = records.setdefault(name, StageRecord())
        record.result = result.model_dump(mode="json")
    return records


def gate_verdict(ctx: RunContext) -> GateResult | None:
    """The recipe's gates over the run's metrics (None when it sets no threshold)."""
    from quantkit.evals.plausibility import artifact_check
    from quantkit.results.gate import evaluate_gate

    if ctx.recipe.gates.is_empty():
        return None
    baseline, quantized = _metrics(ctx)
    windows = ctx.results.window_scores()
    return evaluate_gate(ctx.recipe.gates, dict(quantized), windows, artifact_check(baseline, quantized))


def _baseline_check(baseline: dict[str, float]) -> str | None:
    from quantkit.evals.plausibility import plausibility

    check = plausibility(baseline)
    return None if check is None else check.verdict()


def _eval_info(ctx: RunContext, header: RunHeader, found: object, baseline: dict[str, float]) -> EvalInfo:
    """The eval section: the windows, the recipe's eval settings and what the stages recorded."""
    recorded = dict(found) if isinstance(found, dict) else {}
    sampled = recorded.get("kld_estimator") == "sampled-tail"
    return EvalInfo.model_validate(
        header.eval_windows.model_dump()
        | {
            "top_k": ctx.recipe.eval.top_k,
            "tail_samples": ctx.recipe.eval.tail_samples if sampled else 0,
            "score": ctx.recipe.eval.score,
            "baseline_check": _baseline_check(baseline),
        }
        | recorded
    )


def build_manifest(ctx: RunContext, header: RunHeader) -> Manifest:
    """The manifest of the run in ``ctx`` after its stages."""
    baseline, quantized = _metrics(ctx)
    fields = _stage_fields(ctx)
    dtype = ctx.dtype  # resolved: what the reference was computed in
    calibration = header.calibration
    calibration_seed = ctx.recipe.calibration.seed if calibration and ctx.recipe.calibration else None
    return Manifest.model_validate(
        fields
        | {
            "schema_version": MANIFEST_SCHEMA,
            "status": "complete",
            "kind": ctx.backend.run_kind,
            "run_id": header.run_id,
            "name": header.name,
            "created": header.created,
            "quantkit_version": __version__,
            "recipe": ctx.recipe,
            "model": model_info(ctx.source),
            "device": ctx.device,
            "seeds": Seeds(run=ctx.recipe.seed, calibration=calibration_seed),
            "calibration": calibration,
            "eval": _eval_info(ctx, header, fields.get("eval"), baseline),
            "baseline": BaselineInfo(dtype=dtype, weight_bits=dtype_bits(dtype)),
            "metrics": MetricsRecord(baseline=with_info(baseline), quantized=with_info(quantized)),
            "gate": gate_verdict(ctx),
            "timings": _timings(ctx, header),
            "stages": _stage_records(ctx),
            "resume": header.resume,
            "environment": header.environment,
        }
    )


def write_run_files(ctx: RunContext, manifest: Manifest) -> list[Path]:
    """manifest.json, recipe.yaml, eval_windows.json and the run's report.md/json."""
    from quantkit.report import render, table
    from quantkit.results.store import RunRecord

    run = ctx.run
    windows = ctx.results.window_scores()
    written = [
        run.write_text("recipe.yaml", ctx.recipe.to_yaml()),
        run.write_json("eval_windows.json", windows.model_dump(mode="json")),
    ]
    comparison = table.build([RunRecord(path=run.folder, manifest=manifest)])
    written.append(run.write_text("report.md", render.to_markdown(comparison)))
    written.append(run.write_text("report.json", render.to_json(comparison)))
    earlier = run.folder / LOG_NAME  # a run updated by eval or bench keeps its earlier parts
    previous = earlier.read_text(encoding="utf-8") if earlier.is_file() else ""
    written.append(run.write_text(LOG_NAME, previous + LIBRARY_LOG.run_text()))
    written.append(run.write_text("manifest.json", manifest.model_dump_json(indent=2) + "\n"))  # last
    return written
