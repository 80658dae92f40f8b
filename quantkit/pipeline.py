"""The one place that strings the steps together: recipe -> quantize -> evaluate -> store."""

from __future__ import annotations

import datetime as dt
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit import __version__
from quantkit.backends.base import Artifact, QuantizeJob
from quantkit.errors import OutputError
from quantkit.faults import failpoint
from quantkit.gate import GateResult, evaluate_gate
from quantkit.journal import Journal, fingerprint_digest
from quantkit.progress import Reporter, library_bars_hidden, quiet_libraries
from quantkit.recipe import Recipe
from quantkit.registry import get_backend
from quantkit.store import (
    MANIFEST,
    MANIFEST_SCHEMA,
    RunRecord,
    RunWriter,
    check_output,
    final_dir_of,
    find_resumable,
    new_run_id,
    partial_dir,
    remove_partial,
)


@dataclass
class QuantizeRequest:
    """What the user asked for on top of the recipe."""

    recipe: Recipe
    model: str | None = None
    out: Path | None = None
    runs_dir: Path | None = None
    overwrite: bool = False
    device: str | None = None
    trust_remote_code: bool = False
    verbose: bool = False
    bench: bool | None = None  # None: the recipe's bench.enabled, unless QUANTKIT_NO_BENCH is set
    restart: bool = False  # discard an interrupted run of the same command instead of resuming it


@dataclass
class RunResult:
    """A finished run: where it is, its manifest and its gate verdict (None: no gates)."""

    record: RunRecord
    gate: GateResult | None
    timings: dict[str, float] = field(default_factory=dict)


class _Timer:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def measure(self, name: str, start: float) -> None:
        self.timings[name] = round(time.perf_counter() - start, 3)


def _config(path: Path) -> dict[str, Any]:
    import json

    data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return data.get("text_config", data) if isinstance(data, dict) else {}


def _reference(
    source: Any,
    windows: Any,
    recipe: Recipe,
    device: str,
    journal: Journal,
    reporter: Reporter,
    timer: _Timer,
) -> tuple[Any, bool]:
    """Load the cached baseline reference or compute it once with the baseline model."""
    from quantkit.evals import reference as ref
    from quantkit.runtimes.hf import HFRuntime

    key = ref.reference_key(source.fingerprint(), windows, recipe.eval.top_k, device)
    recorded = "reference" in journal.stages
    verified = journal.completed("reference") is not None  # False: the cached file changed
    if not verified:
        journal.forget("evaluate")  # scored against a reference this run can no longer vouch for
    cached = ref.load_cached(key) if verified or not recorded else None
    if cached is not None:
        reporter.log(f"baseline reference: cached ({key[:12]})")
        if not verified:
            journal.complete("reference", {"key": key}, [ref.cache_path(key)])
        return cached, True
    failpoint("before.reference")
    start = time.perf_counter()
    with reporter.stage("baseline reference", total=len(windows.ids)) as advance:
        runtime = HFRuntime(source.path, device, trust_remote_code=False)
        reference = ref.compute(
            runtime.log_probs, windows, recipe.eval.top_k, recipe.eval.batch_size, key, advance
        )
        runtime.close()
    journal.complete("reference", {"key": key}, [ref.save(reference)])
    timer.measure("reference_s", start)
    return reference, False


def run_quantize(request: QuantizeRequest, reporter: Reporter | None = None) -> RunResult:
    """Quantize, evaluate against the baseline, gate, and store one run."""
    with library_bars_hidden(request.verbose):
        return _run_quantize(request, reporter)


def _run_quantize(request: QuantizeRequest, reporter: Reporter | None) -> RunResult:
    from quantkit.calibration import calibration_windows, eval_windows
    from quantkit.device import resolve_device
    from quantkit.environment import environment
    from quantkit.models import folder_bytes, resolve_model

    reporter = reporter or Reporter()
    recipe = request.recipe
    total_start = time.perf_counter()
    timer = _Timer()
    backend_cls = get_backend(recipe.method)
    options = backend_cls.Options.model_validate(recipe.options)

    quiet_libraries(request.verbose)
    device = resolve_device(request.device or recipe.device)
    model_spec = request.model or recipe.model
    with reporter.stage("resolving the model"):
        start = time.perf_counter()
        source = resolve_model(model_spec, trust_remote_code=request.trust_remote_code)
        timer.measure("model_resolve_s", start)
    backend_cls.check_model(options, _config(source.path))
    if recipe.evals:
        from quantkit.evals.lm_eval_runner import check_tasks

        for entry in recipe.evals:  # unknown task names fail now, not after quantization
            check_tasks(entry.lm_eval.tasks)
    from quantkit.plan import check_quantization_fits, count_parameters

    check_quantization_fits(count_parameters(source.path) * (4 if device == "cpu" else 2), device)
    identity = {
        "recipe": recipe.model_dump(mode="json"),
        "model": model_spec,
        "device": device,
        "out": None if request.out is None else str(request.out.resolve()),
    }
    final_dir = _final_dir(request, identity)
    # the artifact is never larger than the source weights; 10% on top for tokenizer, reports
    check_output(
        final_dir, request.overwrite, protected=[source.path], required_bytes=int(1.1 * source.disk_bytes())
    )

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.path, trust_remote_code=request.trust_remote_code)
    with reporter.stage("tokenizing evaluation text"):
        windows = eval_windows(recipe.eval, tokenizer)
    calibration = None
    if backend_cls.requires_calibration(options) and recipe.calibration is not None:
        with reporter.stage("tokenizing calibration text"):
            calibration = calibration_windows(recipe.calibration, tokenizer)

    if request.restart and partial_dir(final_dir).is_dir() and not remove_partial(partial_dir(final_dir)):
        raise OutputError(f"another quantkit process is writing '{final_dir}'", "wait for it to finish")
    writer = RunWriter(final_dir, overwrite=request.overwrite)
    try:
        journal = writer.open_journal(identity, _fingerprint(identity, source, device, calibration, windows))
    except BaseException:
        writer.release()  # an earlier run's kept stages are left exactly as they were
        raise
    try:
        if journal.stages:
            reporter.log(f"resuming {final_dir.name}: {', '.join(journal.stages)} done before")
        reference, reference_cached = _reference(source, windows, recipe, device, journal, reporter, timer)
        artifact = _quantize(
            backend_cls,
            options,
            source,
            writer,
            journal,
            device,
            recipe,
            calibration,
            request,
            reporter,
            timer,
        )
        metrics, window_scores = _evaluate(
            artifact, windows, reference, recipe, device, journal, reporter, timer
        )
        from quantkit.evals.quality import baseline_metrics, with_info

        base_metrics = baseline_metrics(reference)
        lm_eval_section = None
        if recipe.evals:
            lm_eval_section, recovered = _lm_eval(
                source, artifact, device, recipe, writer, journal, reporter, timer
            )
            metrics |= recovered
        bench_section = None
        if _bench_enabled(request):
            bench_section, base_bench, quant_bench = _bench(
                source.path, artifact, device, recipe, journal, reporter, timer
            )
            base_metrics |= base_bench
            metrics |= quant_bench

        failpoint("before.manifest")
        gate = None if recipe.gates.is_empty() else evaluate_gate(recipe.gates, dict(metrics), window_scores)
        timer.timings["total_s"] = round(time.perf_counter() - total_start, 3)
        artifact_bytes = folder_bytes(artifact.path)
        manifest: dict[str, Any] = {
            "schema_version": MANIFEST_SCHEMA,
            "status": "complete",
            "run_id": final_dir.name,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "quantkit_version": __version__,
            "recipe": recipe.model_dump(mode="json"),
            "model": {
                "spec": source.spec,
                "kind": source.kind,
                "path": str(source.path),
                "architecture": source.architecture,
                "fingerprint": source.fingerprint(),
                "disk_bytes": source.disk_bytes(),
            },
            "device": device,
            "seeds": {
                "run": recipe.seed,
                "calibration": None if calibration is None else calibration.source["seed"],
            },
            "calibration": None if calibration is None else calibration.describe(),
            "eval": windows.describe()
            | {
                "top_k": recipe.eval.top_k,
                "reference_key": reference.key,
                "reference_cached": reference_cached,
            },
            "baseline": {
                "dtype": "float32" if device == "cpu" else "bfloat16",
                "weight_bits": 32 if device == "cpu" else 16,
            },
            "artifact": {
                "path": "artifact",
                "format": artifact.format,
                "runtime": artifact.runtime,
                "scheme": artifact.scheme,
                "weight_bits": artifact.weight_bits,
                "disk_bytes": artifact_bytes,
                "details": artifact.details,
            },
            "metrics": {
                "baseline": with_info(base_metrics),
                "quantized": with_info(metrics),
            },
            "gate": None if gate is None else gate.to_dict(),
            "bench": bench_section,
            "lm_eval": lm_eval_section,
            "timings": timer.timings,
            "stages": journal.checksums(),
            "resume": {
                "fingerprint_sha256": fingerprint_digest(journal.fingerprint),
                "fingerprint": journal.fingerprint,
                "resumed_stages": journal.resumed,
            },
            "environment": environment(device),
        }
        writer.write_text("recipe.yaml", recipe.to_yaml())
        writer.write_json("eval_windows.json", window_scores)
        writer.write_json(MANIFEST, manifest)
        _write_reports(writer, manifest)
        path = writer.commit()
    except BaseException:
        if journal.holds_work():
            writer.release()
            reporter.log(
                f"kept the completed stages in {writer.tmp_dir}: run the same command again to resume"
            )
        else:
            writer.abort()
        raise
    return RunResult(record=RunRecord(path=path, manifest=manifest), gate=gate, timings=timer.timings)


def _final_dir(request: QuantizeRequest, identity: dict[str, Any]) -> Path:
    """``--out``, or the run folder of an interrupted run of the same command, or a new id."""
    from quantkit.paths import runs_dir

    if request.out is not None:
        return request.out
    folder = request.runs_dir or runs_dir()
    resumable = find_resumable(folder, identity)  # with --restart it is discarded, id kept
    if resumable is not None:
        return final_dir_of(resumable)
    return folder / new_run_id(request.recipe.name)


def _fingerprint(
    identity: dict[str, Any], source: Any, device: str, calibration: Any, windows: Any
) -> dict[str, Any]:
    """Everything a resumed run must share with the interrupted one."""
    from importlib import metadata

    from quantkit.environment import library_versions

    libraries = library_versions()
    for name in ("llama-cpp-python", "lm-eval"):
        try:
            libraries[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            libraries[name] = None
    return {
        "quantkit": __version__,
        "recipe": identity["recipe"],
        "model": source.fingerprint(),
        "device": device,
        "calibration_hash": None if calibration is None else calibration.hash,
        "eval_hash": windows.hash,
        "libraries": libraries,
    }


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def _quantize(
    backend_cls: Any,
    options: Any,
    source: Any,
    writer: RunWriter,
    journal: Journal,
    device: str,
    recipe: Recipe,
    calibration: Any,
    request: QuantizeRequest,
    reporter: Reporter,
    timer: _Timer,
) -> Artifact:
    """The artifact: verified from an earlier attempt, or made from scratch."""
    done = journal.completed("quantize", exact=writer.artifact_dir)
    if done is not None:
        reporter.log(f"quantization: resumed ({len(journal.stages['quantize']['files'])} files verified)")
        timer.timings["quantize_s"] = done["seconds"]
        return Artifact(path=writer.artifact_dir, **done["artifact"])
    shutil.rmtree(writer.artifact_dir, ignore_errors=True)  # never build on a half-written one
    journal.forget("evaluate", "lm_eval", "bench")  # they measured the artifact being replaced
    failpoint("before.quantize")
    start = time.perf_counter()
    layers = _config(source.path).get("num_hidden_layers")
    total = int(layers) if isinstance(layers, int) and layers > 0 else None
    with reporter.stage(f"quantizing with {recipe.method}", total=total) as advance:
        progress = [0]

        def on_layer(index: int) -> None:  # layer `index` started: the ones before it are done
            failpoint("quantize.layer", index)
            if total and index > progress[0]:
                advance(min(index, total) - progress[0])
                progress[0] = min(index, total)

        job = QuantizeJob(
            model_path=source.path,
            options=options,
            out_dir=writer.artifact_dir,
            device=device,
            seed=recipe.seed,
            calibration=calibration,
            trust_remote_code=request.trust_remote_code,
            verbose=request.verbose,
            log=reporter.log,
            on_layer=on_layer,
        )
        artifact: Artifact = backend_cls().quantize(job)
        if total:
            advance(total - progress[0])
        (artifact.path / "quantkit-recipe.yaml").write_text(recipe.to_yaml(), encoding="utf-8")
    timer.measure("quantize_s", start)
    described = {
        "format": artifact.format,
        "runtime": artifact.runtime,
        "scheme": artifact.scheme,
        "weight_bits": artifact.weight_bits,
        "details": artifact.details,
    }
    journal.complete(
        "quantize", {"artifact": described, "seconds": timer.timings["quantize_s"]}, _files(artifact.path)
    )
    return artifact


def _evaluate(
    artifact: Artifact,
    windows: Any,
    reference: Any,
    recipe: Recipe,
    device: str,
    journal: Journal,
    reporter: Reporter,
    timer: _Timer,
) -> tuple[dict[str, float], dict[str, Any]]:
    from quantkit.evals.quality import baseline_metrics, per_window, score, summarize
    from quantkit.runtimes import open_runtime

    done = journal.completed("evaluate")
    if done is not None:
        timer.timings["eval_s"] = done["seconds"]
        return done["metrics"], done["window_scores"]
    failpoint("before.evaluate")
    start = time.perf_counter()
    with reporter.stage("evaluating the artifact", total=len(windows.ids)) as advance:
        runtime = open_runtime(artifact.runtime, artifact.path, device, context_length=windows.seq_len)
        scores = score(runtime.log_probs, windows, reference, recipe.eval.batch_size, advance)
        runtime.close()
    timer.measure("eval_s", start)
    metrics = summarize(scores, baseline_metrics(reference)["ppl"])
    window_scores = per_window(scores, reference)
    journal.complete(
        "evaluate", {"metrics": metrics, "window_scores": window_scores, "seconds": timer.timings["eval_s"]}
    )
    return metrics, window_scores


def _lm_eval(
    source: Any,
    artifact: Artifact,
    device: str,
    recipe: Recipe,
    writer: RunWriter,
    journal: Journal,
    reporter: Reporter,
    timer: _Timer,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """lm-eval tasks on the baseline (cached) and the artifact; average recovery as a metric.
    Each ``evals`` entry is its own stage (``lm_eval.N``), so a resume keeps finished ones."""
    from quantkit.evals import lm_eval_runner as runner

    samples = writer.tmp_dir / "lm_eval"
    sections: list[dict[str, Any]] = []
    recovered: dict[str, float] = {}
    seconds = 0.0
    for index, entry in enumerate(recipe.evals):
        spec = entry.lm_eval
        stage = f"lm_eval.{index}"
        logs_dir = samples if index == 0 else samples / f"entry-{index}"
        done = journal.completed(stage)
        if done is None:
            for task in spec.tasks:  # a half-written log of an interrupted attempt
                (logs_dir / f"{task}.jsonl").unlink(missing_ok=True)
            failpoint("before.lm_eval", index)
            start = time.perf_counter()
            manager = runner.check_tasks(spec.tasks)
            with reporter.stage(f"lm-eval {', '.join(spec.tasks)}: baseline"):
                base, cached = runner.baseline(source.path, source.fingerprint(), spec, manager, device)
            with reporter.stage(f"lm-eval {', '.join(spec.tasks)}: artifact"):
                quant = runner.evaluate(artifact.runtime, artifact.path, spec, manager, device, logs_dir)
            section = {
                "settings": spec.model_dump(mode="json"),
                "baseline": base,
                "baseline_cached": cached,
                "artifact": quant,
            }
            done = {
                "section": section,
                "recovered": runner.recovery(base, quant),
                "seconds": round(time.perf_counter() - start, 3),
            }
            logs = [logs_dir / f"{task}.jsonl" for task in spec.tasks]
            journal.complete(stage, done, [log for log in logs if log.is_file()])
        sections.append(done["section"])
        recovered |= done["recovered"]
        seconds += done["seconds"]
    timer.timings["lm_eval_s"] = round(seconds, 3)
    metrics = {f"task_recovery_pct:{task}": value for task, value in recovered.items()}
    if recovered:
        metrics["task_recovery_pct"] = sum(recovered.values()) / len(recovered)
    return sections, metrics


def _bench_enabled(request: QuantizeRequest) -> bool:
    import os

    if request.bench is not None:
        return request.bench
    return request.recipe.bench.enabled and not os.environ.get("QUANTKIT_NO_BENCH")


def _bench(
    model_path: Path,
    artifact: Artifact,
    device: str,
    recipe: Recipe,
    journal: Journal,
    reporter: Reporter,
    timer: _Timer,
) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """Speed and memory of baseline and artifact; a failure is recorded, not fatal (and is
    retried by a resume)."""
    from quantkit.errors import QuantkitError
    from quantkit.evals import perf

    done = journal.completed("bench")
    if done is not None:
        timer.timings["bench_s"] = done["seconds"]
        return done["section"], done["baseline"], done["artifact"]
    failpoint("before.bench")
    start = time.perf_counter()
    with reporter.stage("benchmarking speed and memory (baseline, artifact)"):
        try:
            section = perf.measure_pair(model_path, artifact.path, artifact.runtime, device, recipe.bench)
        except QuantkitError as err:
            reporter.log(f"benchmark failed: {err.message}")
            return {"error": err.message}, {}, {}
    timer.measure("bench_s", start)
    base, quant = perf.metrics_from(section, recipe.bench)
    journal.complete(
        "bench",
        {"section": section, "baseline": base, "artifact": quant, "seconds": timer.timings["bench_s"]},
    )
    return section, base, quant


def _write_reports(writer: RunWriter, manifest: dict[str, Any]) -> None:
    from quantkit.report import render, table

    comparison = table.build([RunRecord(path=writer.final_dir, manifest=manifest)])
    writer.write_text("report.md", render.to_markdown(comparison))
    writer.write_text("report.json", render.to_json(comparison))
