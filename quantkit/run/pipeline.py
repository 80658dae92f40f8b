"""The one place that strings a run together: recipe -> stages -> manifest, gate, reports.

``run_quantize`` builds a new run (resuming an interrupted one); ``bench_run`` and
``eval_run`` add or redo one stage of a finished run. All three run their stages through
``StageRunner`` under the run's lock and finalize the run the same way (``finalize``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue

from quantkit import __version__
from quantkit.errors import ArtifactError, OutputError, QuantkitError, UserInputError
from quantkit.inputs.recipe import Recipe
from quantkit.results.store import (
    RunRecord,
    RunUpdater,
    RunWriter,
    check_output,
    final_dir_of,
    find_resumable,
    new_run_id,
    partial_dir,
    remove_partial,
)
from quantkit.stages.context import RunContext, RunSettings, Tokens
from quantkit.stages.results import RunResults
from quantkit.util.faults import failpoint
from quantkit.util.library_log import LIBRARY_LOG
from quantkit.util.progress import Reporter, library_bars_hidden, quiet_libraries

if TYPE_CHECKING:
    from quantkit.backends.base import Backend, BackendOptions
    from quantkit.inputs.models import ModelSource
    from quantkit.inputs.specs import BenchSpec, LmEvalSpec
    from quantkit.inputs.tokens import TokenWindows
    from quantkit.results.gate import GateResult
    from quantkit.results.manifest import Manifest, ResumeInfo
    from quantkit.run.journal import Journal
    from quantkit.serving.endpoint import Endpoint
    from quantkit.serving.loadgen import LoadSpec
    from quantkit.serving.record import ServeSideName
    from quantkit.stages.base import Stage
    from quantkit.stages.results import StageResult


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
    name: str | None = None  # the run's display name (default: the recipe's)
    allow_implausible_baseline: bool = False  # go on past the baseline sanity guard
    shared_baseline: Path | None = None  # a sweep's baseline measurements (bench sides) to reuse


@dataclass
class RunResult:
    """A finished run: where it is, its manifest and its gate verdict (None: no gates)."""

    record: RunRecord
    gate: GateResult | None
    timings: dict[str, float] = field(default_factory=dict)


def stage_plan(recipe: Recipe, bench: bool, device: str) -> list[Stage[StageResult]]:
    """The stages of a quantize run: each registered stage's ``planned`` instances, built-ins in
    their registry order, then plug-ins' (the runner runs each after what it depends on)."""
    from quantkit.stages import STAGES
    from quantkit.stages.base import PlanInputs

    inputs = PlanInputs(recipe, bench, device)
    return [stage for kind in STAGES.ordered_names() for stage in STAGES.get(kind).planned(inputs)]


def run_quantize(request: QuantizeRequest, reporter: Reporter | None = None) -> RunResult:
    """Quantize, evaluate against the baseline, gate, and store one run."""
    with library_bars_hidden(request.verbose):
        return _run_quantize(request, reporter or Reporter())


def _preflight(request: QuantizeRequest, source: ModelSource, device: str) -> None:
    """Everything that can be refused before a folder is made: model fit, lm-eval task names."""
    from quantkit.inputs.models import text_config
    from quantkit.inputs.plan import check_quantization_fits, count_parameters

    backend = request.recipe.backend()
    backend.check_model(text_config(source.path))
    backend.check_weights(source.path)
    if request.recipe.evals:
        from quantkit.evals.lm_eval_runner import check_tasks

        for entry in request.recipe.evals:  # unknown task names fail now, not after quantization
            check_tasks(entry.lm_eval.tasks)
    check_quantization_fits(count_parameters(source.path) * (4 if device == "cpu" else 2), device)


@dataclass
class _Prepared:
    """What a quantize run knows before its folder is opened: everything checked."""

    source: ModelSource
    device: str
    identity: dict[str, JsonValue]
    name: str
    final_dir: Path
    tokens: Tokens
    windows: TokenWindows
    calibration: TokenWindows | None
    resolve_s: float


def _run_quantize(request: QuantizeRequest, reporter: Reporter) -> RunResult:
    total_start = time.perf_counter()
    backend = request.recipe.backend()
    backend.check_dependencies()  # a missing engine is refused before the model is resolved
    quiet_libraries(request.verbose)
    LIBRARY_LOG.begin_run()
    prepared = _prepare(request, backend, reporter)
    partial = partial_dir(prepared.final_dir)
    if request.restart and partial.is_dir() and not remove_partial(partial):
        raise OutputError(
            f"another quantkit process is writing '{prepared.final_dir}'", "wait for it to finish"
        )
    writer = RunWriter(prepared.final_dir, overwrite=request.overwrite)
    try:
        fingerprint = _fingerprint(prepared.identity, prepared.source, prepared.calibration, prepared.windows)
        journal = writer.open_journal(prepared.identity, fingerprint | _inputs_fingerprint(backend))
    except BaseException:
        writer.release()  # an earlier run's kept stages are left exactly as they were
        raise
    settings = RunSettings(
        verbose=request.verbose,
        trust_remote_code=request.trust_remote_code,
        allow_implausible_baseline=request.allow_implausible_baseline,
        shared_baseline=request.shared_baseline,
    )
    ctx = RunContext(
        request.recipe, prepared.source, prepared.device, backend, writer, journal, reporter,
        prepared.tokens, RunResults(), settings,
    )  # fmt: skip
    try:
        manifest = _stages_and_manifest(ctx, request, prepared, total_start)
        path = writer.commit()
    except BaseException as err:
        if journal.holds_work() and not (isinstance(err, QuantkitError) and err.final):
            writer.release()
            reporter.log(
                f"kept the completed stages in {writer.tmp_dir}: run the same command again to resume"
            )
        else:
            writer.abort()
        raise
    return RunResult(
        record=RunRecord(path=path, manifest=manifest), gate=manifest.gate, timings=manifest.timings
    )


def _prepare(request: QuantizeRequest, backend: Backend[BackendOptions], reporter: Reporter) -> _Prepared:
    """Resolve the model and device, refuse what cannot run, pick the folder, tokenize."""
    from quantkit.device import resolve_device
    from quantkit.inputs.models import resolve_model

    recipe = request.recipe
    device = resolve_device(request.device or recipe.device)
    model_spec = request.model or recipe.model
    with reporter.stage("resolving the model"):
        start = time.perf_counter()
        source = resolve_model(model_spec, trust_remote_code=request.trust_remote_code)
        resolve_s = round(time.perf_counter() - start, 3)
    _preflight(request, source, device)
    identity: dict[str, JsonValue] = {
        "recipe": recipe.model_dump(mode="json"),
        "model": model_spec,
        "device": device,
        "out": None if request.out is None else str(request.out.resolve()),
    }
    name = request.name or recipe.name
    final_dir = _final_dir(request, identity, name)
    inputs = backend.inputs()  # an external artifact: never written to, and its size counts
    needed = max(source.disk_bytes(), sum(path.stat().st_size for path in inputs))
    # the artifact is never larger than the source weights; 10% on top for tokenizer, reports
    check_output(
        final_dir, request.overwrite, protected=[source.path, *inputs], required_bytes=int(1.1 * needed)
    )
    tokens = Tokens(recipe, source, backend.requires_calibration(), request.trust_remote_code)
    with reporter.stage("tokenizing evaluation text"):
        windows = tokens.eval_windows()
    calibration = None
    if tokens.needs_calibration:
        with reporter.stage("tokenizing calibration text"):
            calibration = tokens.calibration_windows()
    _check_gguf_tokenizer(source, tokens)
    backend.check_vocabulary(tokens.tokenizer(), windows.ids.ravel().tolist())
    return _Prepared(source, device, identity, name, final_dir, tokens, windows, calibration, resolve_s)


def _stages_and_manifest(
    ctx: RunContext, request: QuantizeRequest, prepared: _Prepared, total_start: float
) -> Manifest:
    """Run (or resume) every stage, then write the manifest, recipe and reports."""
    from quantkit.results.manifest import WindowsInfo
    from quantkit.run.finalize import RunHeader, build_manifest, now, write_run_files
    from quantkit.stages.runner import StageRunner
    from quantkit.util.environment import environment

    journal, calibration = ctx.journal, prepared.calibration
    if journal.stages:
        ctx.reporter.log(f"resuming {prepared.final_dir.name}: {', '.join(journal.stages)} done before")
    runner = StageRunner(ctx)
    for stage in stage_plan(request.recipe, _bench_enabled(request), prepared.device):
        runner.run(stage)
    failpoint("before.manifest")
    header = RunHeader(
        run_id=prepared.final_dir.name,
        name=prepared.name,
        created=now(),
        calibration=None if calibration is None else WindowsInfo.model_validate(calibration.describe()),
        eval_windows=WindowsInfo.model_validate(prepared.windows.describe()),
        environment=environment(prepared.device),
        resume=_resume_info(journal),
        timings={
            "model_resolve_s": prepared.resolve_s,
            "total_s": round(time.perf_counter() - total_start, 3),
        },
    )
    manifest = build_manifest(ctx, header)
    write_run_files(ctx, manifest)
    return manifest


def _check_gguf_tokenizer(source: ModelSource, tokens: Tokens) -> None:
    """A model converted from a GGUF tokenizes this run's own texts as llama.cpp does, or the
    run is refused (the built-in texts were checked at conversion)."""
    gguf = source.gguf()
    texts = tokens.own_texts() if gguf is not None else {}
    if gguf is not None and texts:
        from quantkit.inputs.gguf_source import check_tokenizer

        check_tokenizer(tokens.tokenizer(), gguf, texts)


def _resume_info(journal: Journal) -> ResumeInfo:
    from quantkit.results.manifest import ResumeInfo
    from quantkit.run.journal import fingerprint_digest

    return ResumeInfo(
        fingerprint_sha256=fingerprint_digest(journal.fingerprint),
        fingerprint=journal.fingerprint,
        resumed_stages=list(journal.resumed),
    )


def _final_dir(request: QuantizeRequest, identity: dict[str, JsonValue], name: str) -> Path:
    """``--out``, or the run folder of an interrupted run of the same command, or a new id."""
    from quantkit.paths import runs_dir

    if request.out is not None:
        return request.out
    folder = request.runs_dir or runs_dir()
    resumable = find_resumable(folder, identity)  # with --restart it is discarded, id kept
    if resumable is not None:
        return final_dir_of(resumable)
    return folder / new_run_id(name)


def _fingerprint(
    identity: dict[str, JsonValue],
    source: ModelSource,
    calibration: TokenWindows | None,
    windows: TokenWindows,
) -> dict[str, JsonValue]:
    """Everything a resumed run must share with the interrupted one."""
    from quantkit.util.environment import library_versions

    libraries: dict[str, JsonValue] = dict(library_versions())
    return {
        "quantkit": __version__,
        "recipe": identity["recipe"],
        "model": source.fingerprint(),
        "device": identity["device"],
        "calibration_hash": None if calibration is None else calibration.hash,
        "eval_hash": windows.hash,
        "libraries": libraries,
    }


def _inputs_fingerprint(backend: Backend[BackendOptions]) -> dict[str, JsonValue]:
    inputs = backend.input_fingerprint()
    return {"inputs": inputs} if inputs else {}


def _bench_enabled(request: QuantizeRequest) -> bool:
    import os

    if request.bench is not None:
        return request.bench
    return request.recipe.bench.enabled and not os.environ.get("QUANTKIT_NO_BENCH")


# --- finished runs: one more stage -------------------------------------------------------------


def bench_run(
    record: RunRecord,
    spec: BenchSpec,
    device: str | None,
    reporter: Reporter | None = None,
    verbose: bool = False,
) -> RunResult:
    """Benchmark a finished run again with ``spec`` (on ``device``, default the run's)."""
    from quantkit.device import resolve_device
    from quantkit.stages.bench import BenchStage

    recipe = record.manifest.recipe.model_copy(update={"bench": spec})
    stage = BenchStage(spec, resolve_device(device or record.manifest.device))
    return _update_run(record, recipe, stage, reporter or Reporter(), verbose)


def serve_bench_run(
    record: RunRecord,
    endpoint: Endpoint,
    spec: LoadSpec,
    side: ServeSideName,
    price_per_hour: float | None,
    reporter: Reporter | None = None,
) -> RunResult:
    """Measure the server at ``endpoint`` under ``spec`` as the run's ``side`` (the artifact, or
    the baseline served the same way); the other side's measurement is kept."""
    from quantkit.stages.serve_bench import ServeBenchStage

    stage = ServeBenchStage(endpoint, spec, side, price_per_hour)
    return _update_run(record, record.manifest.recipe, stage, reporter or Reporter())


def serve_eval_run(
    record: RunRecord, endpoint: Endpoint, top_k: int | None, reporter: Reporter | None = None
) -> RunResult:
    """Score the run's eval windows through ``endpoint`` (serving its artifact) against its
    cached reference, after the server's alignment self-check."""
    from quantkit.stages.serve_eval import ServeEvalStage

    return _update_run(
        record, record.manifest.recipe, ServeEvalStage(endpoint, top_k), reporter or Reporter()
    )


def eval_run(
    record: RunRecord,
    spec: LmEvalSpec,
    device: str | None,
    reporter: Reporter | None = None,
    verbose: bool = False,
) -> RunResult:
    """Run lm-eval tasks on a finished run: a new ``evals`` entry, or the same entry again."""
    from quantkit.inputs.specs import EvalEntry
    from quantkit.stages.lm_eval import LmEvalStage

    manifest = record.manifest
    if device is not None and device != manifest.device:
        raise UserInputError(
            f"this run was evaluated on {manifest.device}; its tasks must run there too",
            f"drop --device, or quantize again with --device {device}",
        )
    entries = list(manifest.recipe.evals)
    index = next((i for i, entry in enumerate(entries) if entry.lm_eval == spec), len(entries))
    if index == len(entries):
        entries.append(EvalEntry(lm_eval=spec))
    recipe = manifest.recipe.model_copy(update={"evals": entries})
    with library_bars_hidden(verbose):
        return _update_run(record, recipe, LmEvalStage(index, spec), reporter or Reporter(), verbose)


def _update_run(
    record: RunRecord, recipe: Recipe, stage: Stage[StageResult], reporter: Reporter, verbose: bool = False
) -> RunResult:
    """Run ``stage`` on the finished run in ``record`` (again, if it ran before) and rewrite
    its manifest, recipe and reports, under the run's lock."""
    from quantkit.inputs.models import ModelSource
    from quantkit.results.manifest import EvalInfo, WindowsInfo
    from quantkit.run.finalize import RunHeader, build_manifest, write_run_files
    from quantkit.run.journal import Journal
    from quantkit.stages.restore import restore
    from quantkit.stages.runner import StageRunner

    manifest = record.manifest
    model = manifest.model
    source = ModelSource.recorded(model.spec, model.path, model.kind, model.architecture)
    if source.fingerprint() != model.fingerprint:
        raise UserInputError(
            f"the baseline model '{model.path}' changed since this run was made",
            "its numbers would not compare: quantize again",
        )
    quiet_libraries(verbose)
    LIBRARY_LOG.begin_run()
    updater = RunUpdater(record.path)
    try:
        results, entries = restore(manifest, record.path)
        journal = Journal(record.path, {}, {}, persist=False)
        journal.stages = entries
        if "quantize" in entries and journal.completed("quantize", exact=updater.artifact_dir) is None:
            raise ArtifactError(
                f"run '{record.path}' is damaged: its artifact no longer matches the checksums recorded",
                "copy the run folder again, or quantize again",
            )
        tokens = Tokens(recipe, source, needs_calibration=False, trust_remote_code=False)
        ctx = RunContext(
            recipe, source, manifest.device, recipe.backend(), updater, journal, reporter, tokens, results
        )
        StageRunner(ctx).run(stage, force=True)
        kept = {
            key: value for key, value in manifest.timings.items() if key in ("model_resolve_s", "total_s")
        }
        header = RunHeader(
            run_id=manifest.run_id,
            name=manifest.display_name,
            created=manifest.created,
            calibration=manifest.calibration,
            eval_windows=WindowsInfo.model_validate(
                manifest.eval.model_dump(exclude=set(EvalInfo.model_fields) - set(WindowsInfo.model_fields))
            ),
            environment=manifest.environment,
            resume=manifest.resume,
            timings=kept,
        )
        updated = build_manifest(ctx, header)
        write_run_files(ctx, updated)
    finally:
        updater.release()
    return RunResult(record=RunRecord(record.path, updated), gate=updated.gate, timings=updated.timings)
