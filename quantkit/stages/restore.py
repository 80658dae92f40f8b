"""The stage results of a finished run, rebuilt from its manifest (any schema), so that
``bench RUN`` and ``eval RUN`` run one stage and finalize the run like ``quantize`` does."""

from __future__ import annotations

from pathlib import Path

from pydantic import JsonValue

from quantkit.errors import RunNotFoundError
from quantkit.metrics import METRICS
from quantkit.results.manifest import Manifest
from quantkit.results.window_scores import WindowScores
from quantkit.stages import STAGES
from quantkit.stages.base import kind_of
from quantkit.stages.results import (
    BenchResult,
    EvaluateResult,
    LmEvalResult,
    QuantizeResult,
    ReferenceResult,
    RunResults,
    ServeBenchResult,
    ServeEvalResult,
    StageResult,
)


def _by_stage(values: dict[str, float], stage: str) -> dict[str, float]:
    """The values ``stage`` made (a metric whose plug-in is no longer installed belongs to none)."""
    stages = {name: METRICS.get(name.split(":", 1)[0]) for name in values}
    return {name: value for name, value in values.items() if (info := stages[name]) and info.stage == stage}


def _evaluate_result(manifest: Manifest, windows: WindowScores) -> EvaluateResult:
    """The evaluate stage's result as the manifest recorded it."""
    return EvaluateResult(
        metrics=_by_stage(manifest.metrics.values("quantized"), "evaluate"),
        window_scores=windows,
        runtime=manifest.eval.runtime or manifest.artifact.runtime,
        kld_estimator=manifest.eval.kld_estimator,
        tokenizer_check=manifest.eval.tokenizer_check,
        deployment=manifest.eval.deployment,
        seconds=manifest.timings.get("eval_s"),
    )


def restore(manifest: Manifest, run_dir: Path) -> tuple[RunResults, dict[str, dict[str, JsonValue]]]:
    """The run's stage results and their journal entries (completion time, file checksums):
    each parsed by its stage's own model from its stage record (schema 3), or rebuilt from the
    manifest's sections (schemas 1 and 2)."""
    records = manifest.stages
    if not records or any(record.result is None for record in records.values()):
        return _from_sections(manifest, run_dir)
    results = RunResults()
    entries: dict[str, dict[str, JsonValue]] = {}
    for name, record in records.items():
        assert record.result is not None
        results.put(name, STAGES.get(kind_of(name)).result_type.model_validate(record.result))
        if record.completed is not None:  # journaled: its files are checked before reuse
            entries[name] = record.model_dump(mode="json")
    return results, entries


def _from_sections(manifest: Manifest, run_dir: Path) -> tuple[RunResults, dict[str, dict[str, JsonValue]]]:
    """Stage results as manifests before schema 3 recorded them, in their own sections."""
    from quantkit.evals.lm_eval_runner import recovery
    from quantkit.results.gate import load_windows

    windows = load_windows(run_dir)
    if windows is None:
        raise RunNotFoundError(
            f"'{run_dir}' has no eval_windows.json (made by an older quantkit)", "run quantize again"
        )
    timings = manifest.timings
    baseline = manifest.metrics.values("baseline")
    quantized = manifest.metrics.values("quantized")
    restored: dict[str, StageResult] = {
        "reference": ReferenceResult(
            key=manifest.eval.reference_key,
            cached=manifest.eval.reference_cached,
            # the reference's own figures (baseline_metrics); bpb is the deployment score's
            baseline={k: v for k, v in _by_stage(baseline, "evaluate").items() if k != "bpb"},
            seconds=timings.get("reference_s"),
        ),
        "quantize": QuantizeResult(artifact=manifest.artifact, seconds=timings.get("quantize_s")),
        "evaluate": _evaluate_result(manifest, windows),
    }
    for index, section in enumerate(manifest.lm_eval or []):
        restored[f"lm_eval.{index}"] = LmEvalResult(
            section=section,
            recovered=recovery(section.baseline, section.artifact),
            # schema 1 kept one total: it is shown against the first entry
            seconds=timings.get("lm_eval_s") if index == 0 else 0.0,
        )
    if manifest.bench is not None:
        restored["bench"] = BenchResult(
            section=manifest.bench,
            baseline=_by_stage(baseline, "bench"),
            artifact=_by_stage(quantized, "bench"),
            notes=getattr(manifest.bench, "notes", []),
            seconds=timings.get("bench_s"),
        )
    if manifest.serve is not None:
        restored["serve_bench"] = ServeBenchResult.from_section(manifest.serve, timings.get("serve_bench_s"))
    if manifest.served_quality is not None:
        restored["serve_eval"] = ServeEvalResult(
            quality=manifest.served_quality, seconds=timings.get("serve_eval_s")
        )
    results = RunResults()
    entries: dict[str, dict[str, JsonValue]] = {}
    for name, result in restored.items():
        results.put(name, result)
        record = manifest.stages.get(name)
        if record is not None:
            entries[name] = record.model_dump(mode="json") | {"result": result.model_dump(mode="json")}
    return results, entries
