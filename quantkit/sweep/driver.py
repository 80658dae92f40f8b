"""A sweep from spec to report: expand, check, compute the baselines once, fan the runs out
through an executor, keep the sweep manifest current, write one report.

The sweep folder::

    sweep.json          the spec, its expansion, the baselines, each run's state
    baseline/           the reference's copy and the baseline bench sides, shared by the runs
    runs/<run-id>/      each run, as ``quantkit quantize --out`` makes it
    status/<run-id>.json  each run's progress, written by its worker
    report.md .json .html
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from quantkit.errors import OutputError, UserInputError
from quantkit.results.store import RunRecord
from quantkit.sweep.executors.base import Executor
from quantkit.sweep.record import SweepManifest, SweepRun
from quantkit.sweep.spec import PlannedRun, SweepSpec
from quantkit.sweep.task import RunOutcome, RunStatus, RunTask
from quantkit.util.progress import Reporter

if TYPE_CHECKING:
    from quantkit.report.table import Comparison

LOCK = ".sweep.lock"
REPORTS = {"report.md": "to_markdown", "report.json": "to_json", "report.html": "to_html"}


class SweepView(Protocol):
    """What the driver tells the user: the pre-phase as a Reporter, then each run's state."""

    reporter: Reporter

    def start(self, runs: list[SweepRun], executor: str) -> None: ...

    def update(self, run_id: str, status: RunStatus) -> None: ...

    def finished(self, run: SweepRun) -> None: ...

    def close(self) -> None: ...


class SilentView:
    """No output (``--format json``, library use)."""

    def __init__(self) -> None:
        self.reporter: Reporter = Reporter()

    def start(self, runs: list[SweepRun], executor: str) -> None:
        return None

    def update(self, run_id: str, status: RunStatus) -> None:
        return None

    def finished(self, run: SweepRun) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass
class SweepRequest:
    spec: SweepSpec
    out: Path | None = None
    bench: bool | None = None
    verbose: bool = False
    trust_remote_code: bool = False
    allow_implausible_baseline: bool = False


@dataclass
class SweepResult:
    folder: Path
    manifest: SweepManifest
    records: list[RunRecord] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """3 if a run hit an internal error, else 2 if one was refused, else 1 if a gate failed."""
        codes = {run.exit_code for run in self.manifest.runs if run.exit_code}
        for code in (3, 2, 1):
            if code in codes:
                return code
        return 3 if codes else 0


def sweep_folder(request: SweepRequest) -> Path:
    """``--out``, or ``runs/sweeps/<name>`` (a Ray sweep needs an absolute, shared path)."""
    from quantkit.paths import runs_dir

    out = request.out if request.out is not None else runs_dir() / "sweeps" / request.spec.name
    if request.spec.executor == "ray" and not out.is_absolute():
        raise UserInputError(
            f"a Ray sweep writes where every node can read, but '{out}' is a relative path",
            "pass --out /shared/path/to/sweep (a folder on storage all nodes mount)",
        )
    return out.resolve()


def run_sweep(request: SweepRequest, view: SweepView | None = None) -> SweepResult:
    """Run every point of the sweep (keeping the finished ones of an earlier invocation)."""
    from quantkit.sweep.executors import EXECUTORS
    from quantkit.sweep.spec import expand

    view = view or SilentView()
    spec = request.spec
    planned = expand(spec)  # every recipe validated before anything else
    folder = sweep_folder(request)
    executor = EXECUTORS.get(spec.executor)(spec, folder)
    executor.check()
    _check_folder(folder)
    start = time.perf_counter()
    from quantkit.util.progress import library_bars_hidden, quiet_libraries

    quiet_libraries(request.verbose)
    with _locked(folder), library_bars_hidden(request.verbose):
        return _run(request, planned, folder, executor, view, start)


def _check_folder(folder: Path) -> None:
    from quantkit.sweep.record import SWEEP_MANIFEST

    if folder.is_file():
        raise OutputError(f"'{folder}' is a file", "give a folder for the sweep with --out")
    foreign = folder.is_dir() and any(folder.iterdir()) and not (folder / SWEEP_MANIFEST).is_file()
    if foreign and not (folder / LOCK).is_file():
        raise OutputError(
            f"'{folder}' exists and is not a sweep folder",
            "give a new or an earlier sweep's --out folder",
        )


@contextmanager
def _locked(folder: Path) -> Iterator[IO[str]]:
    import fcntl

    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / LOCK).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise OutputError(
            f"another quantkit sweep is running in '{folder}'", "wait for it to finish"
        ) from None
    try:
        yield handle
    except BaseException:
        if created and _only_lock(folder):  # refused before any work: leave nothing behind
            (folder / LOCK).unlink(missing_ok=True)
            folder.rmdir()
        raise
    finally:
        handle.close()


def _only_lock(folder: Path) -> bool:
    return [path.name for path in folder.iterdir()] == [LOCK]


def _run(
    request: SweepRequest,
    planned: list[PlannedRun],
    folder: Path,
    executor: Executor,
    view: SweepView,
    start: float,
) -> SweepResult:
    from quantkit.run.finalize import now
    from quantkit.sweep.record import write_manifest

    manifest, bench = _baselines(request, planned, folder, executor, view)
    tasks = _tasks(request, manifest.runs, bench, folder, executor.threads())
    (folder / "runs").mkdir(exist_ok=True)
    write_manifest(folder, manifest)
    view.start(manifest.runs, executor.describe())
    by_id = {run.run_id: run for run in manifest.runs}

    def done(outcome: RunOutcome) -> None:
        run = by_id[outcome.run_id]
        run.take(outcome)
        manifest.updated = now()
        write_manifest(folder, manifest)
        view.finished(run)

    fan_out = time.perf_counter()
    with _polling(folder / "status", [task.run_id for task in tasks], view):
        try:
            executor.run(tasks, done)
        finally:
            view.close()
    manifest.timings["runs_s"] = round(time.perf_counter() - fan_out, 3)
    manifest.timings["total_s"] = round(time.perf_counter() - start, 3)
    manifest.updated = now()
    write_manifest(folder, manifest)
    result = SweepResult(folder, manifest, _records(folder, manifest))
    write_reports(result)
    return result


def _baselines(
    request: SweepRequest, planned: list[PlannedRun], folder: Path, executor: Executor, view: SweepView
) -> tuple[SweepManifest, list[bool]]:
    """The baselines' references and bench sides, made once; the sweep's manifest for them
    (a changed spec is refused against the folder's earlier manifest); each run's bench flag."""
    from quantkit.paths import cache_dir
    from quantkit.run.finalize import now
    from quantkit.sweep.baseline import BaselineJob
    from quantkit.sweep.record import read_manifest

    old = read_manifest(folder)
    job = BaselineJob(
        runs=planned,
        bench=request.bench,
        folder=str(folder / "baseline"),
        trust_remote_code=request.trust_remote_code,
        allow_implausible_baseline=request.allow_implausible_baseline,
        cache_dir=str(cache_dir()),
    )
    if old is not None:  # refuse a changed spec before any baseline work
        _check_comparable(old, [_entry(item, "") for item in planned], by_key=False)
    baseline_start = time.perf_counter()
    outcome = executor.baselines(job, view.reporter)
    outcome.raise_error()
    runs = [_entry(item, key) for item, key in zip(planned, outcome.reference_keys, strict=True)]
    if old is not None:
        _check_comparable(old, runs, by_key=True)
    manifest = SweepManifest(
        name=request.spec.name,
        created=old.created if old is not None else now(),
        updated=now(),
        spec=request.spec.model_dump(mode="json"),
        executor=executor.describe(),
        runs=runs,
        baselines=outcome.baselines,
    )
    manifest.timings["baseline_s"] = round(time.perf_counter() - baseline_start, 3)
    return manifest, outcome.bench


def _tasks(
    request: SweepRequest, runs: list[SweepRun], bench: list[bool], folder: Path, threads: int | None
) -> list[RunTask]:
    """A task for every run not already finished and verified in the folder (those are kept)."""
    from quantkit.paths import cache_dir
    from quantkit.sweep.record import verified_run

    tasks: list[RunTask] = []
    status_dir = folder / "status"
    status_dir.mkdir(exist_ok=True)
    for run, benched in zip(runs, bench, strict=True):
        run_dir = folder / "runs" / run.run_id
        if verified_run(run_dir):
            _keep(run, run_dir)
            continue
        (status_dir / f"{run.run_id}.json").unlink(missing_ok=True)
        tasks.append(
            RunTask(
                run_id=run.run_id,
                name=run.name,
                recipe_ref=run.recipe_ref,
                overrides=run.overrides,
                model=run.model,
                out=str(run_dir),
                status_path=str(status_dir / f"{run.run_id}.json"),
                shared_baseline=str(folder / "baseline"),
                reference_key=run.reference_key,
                bench=benched,
                overwrite=run_dir.exists(),  # not verified: damaged, redone in its place
                cache_dir=str(cache_dir()),
                threads=threads,
                verbose=request.verbose,
                trust_remote_code=request.trust_remote_code,
                allow_implausible_baseline=request.allow_implausible_baseline,
            )
        )
    return tasks


def _entry(planned: PlannedRun, reference_key: str) -> SweepRun:
    return SweepRun(
        run_id=planned.run_id,
        name=planned.name,
        recipe_ref=planned.recipe_ref,
        overrides=planned.overrides,
        model=planned.model,
        recipe=planned.recipe.model_dump(mode="json"),
        reference_key=reference_key,
    )


def _keep(run: SweepRun, run_dir: Path) -> None:
    """A run finished by an earlier invocation and intact: reused as it is."""
    from quantkit.results.store import load_run

    record = load_run(run_dir)
    gate = record.manifest.gate
    run.state, run.kept, run.path = "done", True, str(run_dir)
    run.exit_code = 0 if gate is None or gate.passed else 1
    run.kld, run.gate_passed = record.metric("kld_mean"), None if gate is None else gate.passed


def _check_comparable(old: SweepManifest, runs: list[SweepRun], by_key: bool) -> None:
    """Refuse a changed spec whose kept runs would not compare with the new ones (``by_key``:
    the runs' baselines are known, so new runs must share one with the old)."""
    earlier = {run.run_id: run for run in old.runs}
    for run in runs:
        before = earlier.get(run.run_id)
        if before is not None and (before.recipe != run.recipe or before.model != run.model):
            changed = sorted(
                key
                for key in set(before.recipe) | set(run.recipe)
                if before.recipe.get(key) != run.recipe.get(key)
            ) or ["model"]
            raise UserInputError(
                f"the sweep changed since the runs in this folder were made: run '{run.name}' now has "
                f"a different {', '.join(changed)}",
                "give a new --out folder for the new sweep (the old runs stay comparable in their own)",
            )
    keys = {run.reference_key for run in old.runs} if by_key else set()
    for run in runs:
        if run.run_id not in earlier and keys and run.reference_key not in keys:
            raise UserInputError(
                f"run '{run.name}' would be measured against another baseline than this sweep's runs "
                "(its model, device or eval settings differ)",
                "give the new run the sweep's eval settings, or a new --out folder",
            )


@contextmanager
def _polling(status_dir: Path, run_ids: list[str], view: SweepView) -> Iterator[None]:
    """Feed the view from the status files the workers write, twice a second."""
    from quantkit.sweep.task import read_status

    stop = threading.Event()
    seen: dict[str, float] = {}

    def poll() -> None:
        while not stop.wait(0.5):
            for run_id in run_ids:
                status = read_status(status_dir / f"{run_id}.json")
                if status is not None and status.updated != seen.get(run_id):
                    seen[run_id] = status.updated
                    view.update(run_id, status)

    thread = threading.Thread(target=poll, name="sweep-status", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _records(folder: Path, manifest: SweepManifest) -> list[RunRecord]:
    from quantkit.results.store import load_run

    return [load_run(Path(run.path)) for run in manifest.runs if run.state == "done" and run.path]


def write_reports(result: SweepResult) -> None:
    """One report over the sweep's runs (one baseline row per baseline), failed runs named."""
    from quantkit.report import render
    from quantkit.util.fileio import write_text_atomic

    comparison = sweep_comparison(result)
    for name, writer in REPORTS.items():
        write_text_atomic(result.folder / name, getattr(render, writer)(comparison))


def sweep_comparison(result: SweepResult) -> Comparison:
    from quantkit.report import table

    comparison = table.build(result.records)
    for run in result.manifest.runs:
        if run.state == "failed":
            comparison.warnings.append(f"run '{run.name}' failed: {run.error}")
    return comparison
