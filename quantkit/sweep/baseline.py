"""The baseline work of a sweep, done once per (model, device, precision, eval windows) before fan-out:
the reference (top-k log-probs), the lm-eval baseline and the baseline bench. Every run then
finds them: the reference and lm-eval results in the cache (a copy of the reference in the
sweep folder for workers with a cache of their own), the bench sides in the sweep folder."""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from quantkit.inputs.models import ModelSource
from quantkit.stages.context import Tokens
from quantkit.stages.reference import BaselineInputs
from quantkit.sweep.record import BaselineRecord
from quantkit.sweep.spec import PlannedRun
from quantkit.util.progress import Reporter

if TYPE_CHECKING:
    from quantkit.evals.reference import Reference


@dataclass
class PreparedRun:
    """A planned run with its model resolved and its baseline identified."""

    planned: PlannedRun
    source: ModelSource
    inputs: BaselineInputs
    reference_key: str
    bench: bool


def bench_enabled(flag: bool | None, planned: PlannedRun) -> bool:
    """``--bench/--no-bench``, else the recipe's ``bench.enabled`` unless QUANTKIT_NO_BENCH."""
    if flag is not None:
        return flag
    return planned.recipe.bench.enabled and not os.environ.get("QUANTKIT_NO_BENCH")


def prepare(
    runs: list[PlannedRun], bench: bool | None, trust_remote_code: bool, reporter: Reporter
) -> list[PreparedRun]:
    """Resolve each run's model and device and the key of its baseline reference."""
    from quantkit.device import resolve_device
    from quantkit.inputs.models import resolve_model

    sources: dict[str, ModelSource] = {}
    prepared = []
    for planned in runs:
        spec = planned.model or planned.recipe.model or "smollm2-135m"
        if spec not in sources:
            with reporter.stage(f"resolving {spec}"):
                sources[spec] = resolve_model(spec, trust_remote_code=trust_remote_code)
        source = sources[spec]
        device = resolve_device(planned.recipe.device)
        tokens = Tokens(planned.recipe, source, False, trust_remote_code)
        inputs = BaselineInputs(planned.recipe, source, device, tokens, trust_remote_code)
        prepared.append(
            PreparedRun(planned, source, inputs, inputs.reference_key(), bench_enabled(bench, planned))
        )
    return prepared


def compute_baselines(
    prepared: list[PreparedRun], folder: Path, reporter: Reporter, allow_implausible: bool
) -> list[BaselineRecord]:
    """Each distinct baseline of the sweep, computed (or found cached) once."""
    groups: dict[str, list[PreparedRun]] = {}
    for run in prepared:
        groups.setdefault(run.reference_key, []).append(run)
    folder.mkdir(parents=True, exist_ok=True)
    return [_baseline(members, folder, reporter, allow_implausible) for members in groups.values()]


def _baseline(
    members: list[PreparedRun], folder: Path, reporter: Reporter, allow_implausible: bool
) -> BaselineRecord:
    from quantkit.evals import reference as ref
    from quantkit.stages.reference import ensure_reference

    first = members[0]
    inputs = first.inputs
    reference, seconds = ensure_reference(inputs, reporter)
    _guard(inputs, reference, allow_implausible)
    copy = folder / ref.cache_path(reference.key).name
    if not copy.is_file():
        shutil.copyfile(ref.cache_path(reference.key), copy.with_name(f".{copy.name}.tmp"))
        copy.with_name(f".{copy.name}.tmp").replace(copy)
    record = BaselineRecord(
        reference_key=reference.key,
        model=first.planned.model or first.planned.recipe.model,
        model_path=str(first.source.path),
        device=inputs.device,
        dtype=inputs.dtype,
        runs=[run.planned.run_id for run in members],
        reference_computed=seconds is not None,
        reference_s=seconds,
        host=socket.gethostname(),
    )
    _bench(members, folder, reporter, record)
    record.lm_eval_computed = _lm_eval(members, reporter)
    return record


def _guard(inputs: BaselineInputs, reference: Reference, allow: bool) -> None:
    """The baseline sanity guard, before any run starts (each run applies it again)."""
    from quantkit.evals.plausibility import check_baseline, plausibility
    from quantkit.evals.quality import baseline_metrics, scored_positions, targets

    windows = inputs.tokens.eval_windows()
    positions = scored_positions(inputs.recipe.eval.score, windows.seq_len)
    check = plausibility(baseline_metrics(reference.at(positions), targets(windows, positions)))
    if check is not None:
        check_baseline(check, allow)


def _bench(members: list[PreparedRun], folder: Path, reporter: Reporter, record: BaselineRecord) -> None:
    """The baseline's bench side (transformers), once per distinct bench setting."""
    from quantkit.evals import perf

    shared = perf.SharedSides(folder)
    start = time.perf_counter()
    seen: set[str] = set()
    for run in members:
        if not run.bench:
            continue
        target = perf.BenchTarget(run.source.path, "hf", run.inputs.dtype)
        settings = perf.worker_settings(target, run.inputs.device, run.planned.recipe.bench)
        key = settings.model_dump_json()
        if key in seen:
            continue
        seen.add(key)
        with reporter.stage("benchmarking the baseline (once for the sweep)"):
            _, measured = shared.measure(settings)
        if measured:
            record.bench_sides_measured += 1
        else:
            record.bench_sides_reused += 1
    if seen:
        record.bench_s = round(time.perf_counter() - start, 3)


def _lm_eval(members: list[PreparedRun], reporter: Reporter) -> int:
    """lm-eval baselines of the runs' ``evals`` entries, cached for the runs to find."""
    from quantkit.runtimes.base import RuntimeSettings

    computed = 0
    seen: set[str] = set()
    for run in members:
        for entry in run.planned.recipe.evals:
            key = entry.lm_eval.model_dump_json()
            if key in seen:
                continue
            seen.add(key)
            from quantkit.evals import lm_eval_runner as runner

            runner.check_tasks(entry.lm_eval.tasks)
            settings = RuntimeSettings(
                device=run.inputs.device,
                trust_remote_code=run.inputs.trust_remote_code,
                dtype=run.inputs.dtype,
            )
            with reporter.stage(f"lm-eval {', '.join(entry.lm_eval.tasks)}: baseline (once for the sweep)"):
                _, cached = runner.baseline(
                    run.source.path, run.source.fingerprint(), settings, entry.lm_eval
                )
            computed += not cached
    return computed


class BaselineJob(BaseModel):
    """The sweep's baseline phase as a task: run by the driver (local executor) or as a Ray
    task on a worker with the runs' resources (a head without a GPU computes nothing)."""

    model_config = ConfigDict(extra="forbid")

    runs: list[PlannedRun]
    bench: bool | None
    folder: str
    trust_remote_code: bool = False
    allow_implausible_baseline: bool = False
    cache_dir: str | None = None
    threads: int | None = None  # torch threads (a CPU worker's share of the cores)


class BaselineOutcome(BaseModel):
    """The baselines, each run's reference key and bench flag; or the error that stopped it."""

    model_config = ConfigDict(extra="forbid")

    baselines: list[BaselineRecord] = Field(default_factory=list)
    reference_keys: list[str] = Field(default_factory=list)
    bench: list[bool] = Field(default_factory=list)
    error: str | None = None
    hint: str = ""
    exit_code: int = 0

    def raise_error(self) -> None:
        """Raise the error the phase stopped with, as the CLI would show it there."""
        from quantkit.errors import QuantkitError

        if self.error is None:
            return
        err = QuantkitError(self.error, self.hint)
        err.exit_code = self.exit_code
        raise err


def run_baseline_job(job: BaselineJob, reporter: Reporter) -> BaselineOutcome:
    """Resolve every run's model and baseline, and compute each baseline once."""
    from quantkit.errors import QuantkitError

    if job.cache_dir:
        os.environ["QUANTKIT_CACHE"] = job.cache_dir
    if job.threads is not None:
        import torch

        torch.set_num_threads(job.threads)
    try:
        prepared = prepare(job.runs, job.bench, job.trust_remote_code, reporter)
        baselines = compute_baselines(prepared, Path(job.folder), reporter, job.allow_implausible_baseline)
    except QuantkitError as err:
        return BaselineOutcome(error=err.message, hint=err.hint, exit_code=err.exit_code)
    return BaselineOutcome(
        baselines=baselines,
        reference_keys=[run.reference_key for run in prepared],
        bench=[run.bench for run in prepared],
    )
