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
from quantkit.library_log import LIBRARY_LOG, LOG_NAME
from quantkit.manifest import (
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
from quantkit.stages.results import (
    BenchResult,
    EvaluateResult,
    QuantizeResult,
    ReferenceResult,
    ServeBenchResult,
    ServeEvalResult,
    StageResult,
)

if TYPE_CHECKING:
    from pathlib import Path

    from quantkit.gate import GateResult
    from quantkit.models import ModelSource
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
    """(baseline, quantized) metric values from every stage that ran."""
    from quantkit.evals.lm_eval_runner import recovery_metrics

    results = ctx.results
    baseline = dict(results.require("reference", ReferenceResult).baseline)
    evaluation = results.require("evaluate", EvaluateResult)
    quantized = dict(evaluation.metrics)
    if evaluation.deployment is not None:  # bits per byte: the baseline's on the same text
        baseline["bpb"] = evaluation.deployment.baseline_bpb
    recovered: dict[str, float] = {}
    for entry in results.lm_eval():
        recovered |= entry.recovered
    quantized |= recovery_metrics(recovered)
    bench = results.get("bench", BenchResult)
    if bench is not None:
        baseline |= bench.baseline
        quantized |= bench.artifact
    serve = results.get("serve_bench", ServeBenchResult)
    if serve is not None:
        baseline |= serve.baseline
        quantized |= serve.artifact | cost_per_task(quantized | serve.artifact)
    served = results.get("serve_eval", ServeEvalResult)
    if served is not None:
        quantized |= served.quality.metrics
    return baseline, quantized


def _timings(ctx: RunContext, header: RunHeader) -> dict[str, float]:
    results = ctx.results
    timings = dict(header.timings)
    reference = results.require("reference", ReferenceResult)
    if reference.seconds is not None and not reference.cached:
        timings["reference_s"] = reference.seconds
    pairs: list[tuple[str, StageResult | None]] = [
        ("quantize_s", results.get("quantize", QuantizeResult)),
        ("eval_s", results.get("evaluate", EvaluateResult)),
        ("bench_s", results.get("bench", BenchResult)),
        ("serve_bench_s", results.get("serve_bench", ServeBenchResult)),
        ("serve_eval_s", results.get("serve_eval", ServeEvalResult)),
    ]
    for key, result in pairs:
        if result is not None and result.seconds is not None:
            timings[key] = result.seconds
    entries = results.lm_eval()
    if entries:
        timings["lm_eval_s"] = round(sum(entry.seconds or 0.0 for entry in entries), 3)
    return timings


def gate_verdict(ctx: RunContext) -> GateResult | None:
    """The recipe's gates over the run's metrics (None when it sets no threshold)."""
    from quantkit.evals.plausibility import artifact_check
    from quantkit.gate import evaluate_gate

    if ctx.recipe.gates.is_empty():
        return None
    baseline, quantized = _metrics(ctx)
    windows = ctx.results.require("evaluate", EvaluateResult).window_scores
    return evaluate_gate(ctx.recipe.gates, dict(quantized), windows, artifact_check(baseline, quantized))


def _baseline_check(baseline: dict[str, float]) -> str | None:
    from quantkit.evals.plausibility import plausibility

    check = plausibility(baseline)
    return None if check is None else check.verdict()


def build_manifest(ctx: RunContext, header: RunHeader) -> Manifest:
    """The manifest of the run in ``ctx`` after its stages."""
    results = ctx.results
    reference = results.require("reference", ReferenceResult)
    evaluation = results.require("evaluate", EvaluateResult)
    bench = results.get("bench", BenchResult)
    serve = results.get("serve_bench", ServeBenchResult)
    served = results.get("serve_eval", ServeEvalResult)
    lm_entries = results.lm_eval()
    baseline, quantized = _metrics(ctx)
    dtype = ctx.dtype  # resolved: what the reference was computed in
    calibration = header.calibration
    return Manifest(
        schema_version=MANIFEST_SCHEMA,
        status="complete",
        kind=ctx.backend.run_kind,
        run_id=header.run_id,
        name=header.name,
        created=header.created,
        quantkit_version=__version__,
        recipe=ctx.recipe,
        model=model_info(ctx.source),
        device=ctx.device,
        seeds=Seeds(
            run=ctx.recipe.seed,
            calibration=None
            if calibration is None or ctx.recipe.calibration is None
            else ctx.recipe.calibration.seed,
        ),
        calibration=calibration,
        eval=EvalInfo(
            **header.eval_windows.model_dump(),
            top_k=ctx.recipe.eval.top_k,
            reference_key=reference.key,
            reference_cached=reference.cached,
            runtime=evaluation.runtime,
            tail_samples=ctx.recipe.eval.tail_samples if evaluation.kld_estimator == "sampled-tail" else 0,
            kld_estimator=evaluation.kld_estimator,
            score=ctx.recipe.eval.score,
            baseline_check=_baseline_check(baseline),
            tokenizer_check=evaluation.tokenizer_check,
            deployment=evaluation.deployment,
        ),
        baseline=BaselineInfo(dtype=dtype, weight_bits=dtype_bits(dtype)),
        artifact=results.require("quantize", QuantizeResult).artifact,
        metrics=MetricsRecord(baseline=with_info(baseline), quantized=with_info(quantized)),
        gate=gate_verdict(ctx),
        bench=None if bench is None else bench.section,
        lm_eval=[entry.section for entry in lm_entries] or None,
        serve=None if serve is None else serve.section,
        served_quality=None if served is None else served.quality,
        timings=_timings(ctx, header),
        stages={name: StageRecord.model_validate(record) for name, record in ctx.journal.checksums().items()},
        resume=header.resume,
        environment=header.environment,
    )


def write_run_files(ctx: RunContext, manifest: Manifest) -> list[Path]:
    """manifest.json, recipe.yaml, eval_windows.json and the run's report.md/json."""
    from quantkit.report import render, table
    from quantkit.store import RunRecord

    run = ctx.run
    windows = ctx.results.require("evaluate", EvaluateResult).window_scores
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
