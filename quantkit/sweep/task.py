"""One run of a sweep as a self-contained task: what a worker (this process, a subprocess or
a Ray worker on another machine) needs to run it, and what it reports back.

The task re-validates its recipe where it runs, writes its progress to a status file in the
sweep folder (the driver polls those for its view), and never raises for a run that failed:
the failure is its outcome. A worker that dies mid-run leaves the run's journal behind, and
the same task run again resumes from the stages it completed.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from quantkit.util.progress import Reporter

RunState = Literal["queued", "running", "done", "failed"]


class RunTask(BaseModel):
    """Everything a worker needs to run one point of a sweep."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    name: str
    recipe_ref: str
    overrides: list[str]
    model: str | None
    out: str  # the run folder (absolute: workers may run elsewhere)
    status_path: str
    shared_baseline: str  # the sweep's baseline folder (bench sides, the reference's copy)
    reference_key: str
    bench: bool
    overwrite: bool = False  # the run folder holds a damaged earlier run of this point: replace it
    cache_dir: str | None = None  # the driver's cache, when workers share it
    threads: int | None = None  # torch threads (a CPU worker's share of the cores)
    verbose: bool = False
    trust_remote_code: bool = False
    allow_implausible_baseline: bool = False


class RunOutcome(BaseModel):
    """How one run ended (``exit_code`` as the quantize command's: 0, 1 gate failed, 2, 3)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    state: RunState
    exit_code: int
    path: str | None = None
    error: str | None = None
    hint: str | None = None
    kld: float | None = None
    gate_passed: bool | None = None
    host: str = ""
    node: str = ""  # the Ray node it ran on (empty elsewhere)
    pid: int = 0
    seconds: float = 0.0


class RunStatus(BaseModel):
    """A run's progress as its worker last wrote it."""

    state: RunState
    stage: str = ""
    kld: float | None = None
    host: str = ""
    pid: int = 0
    updated: float = 0.0


def write_status(path: Path, status: RunStatus) -> None:
    from quantkit.util.fileio import write_text_atomic

    write_text_atomic(path, status.model_dump_json())


def read_status(path: Path) -> RunStatus | None:
    try:
        return RunStatus.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class StatusReporter(Reporter):
    """Writes the current stage of a run to its status file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def update(self, state: RunState, stage: str, kld: float | None = None) -> None:
        status = RunStatus(
            state=state, stage=stage, kld=kld, host=socket.gethostname(), pid=os.getpid(), updated=time.time()
        )
        write_status(self.path, status)

    @contextmanager
    def stage(self, title: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        self.update("running", title)
        yield lambda n: None


def _seed_reference(task: RunTask) -> None:
    """Put the sweep's reference into this worker's cache (a node with a cache of its own)."""
    import shutil

    from quantkit.evals.reference import cache_path

    target = cache_path(task.reference_key)
    copy = Path(task.shared_baseline) / target.name
    if not target.is_file() and copy.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(copy, partial)
        partial.replace(target)


def execute(task: RunTask) -> RunOutcome:
    """Run one point of a sweep here; its failure is returned, not raised (except Ctrl-C)."""
    from quantkit.errors import QuantkitError

    start = time.perf_counter()
    if task.cache_dir:
        os.environ["QUANTKIT_CACHE"] = task.cache_dir
    reporter = StatusReporter(Path(task.status_path))
    reporter.update("running", "starting")
    stamp = RunOutcome(
        run_id=task.run_id, state="failed", exit_code=3, host=socket.gethostname(), pid=os.getpid()
    )
    try:
        outcome = stamp.model_copy(update=_execute(task, reporter))
    except QuantkitError as err:
        outcome = stamp.model_copy(
            update={"exit_code": err.exit_code, "error": err.message, "hint": err.hint}
        )
    except Exception as err:  # an internal error of one run must not stop the sweep
        import traceback

        first = str(err).splitlines()[0] if str(err) else ""
        trace = Path(task.status_path).with_suffix(".traceback.txt")
        trace.write_text(traceback.format_exc(), encoding="utf-8")
        outcome = stamp.model_copy(
            update={
                "error": f"internal error: {type(err).__name__}: {first}",
                "hint": f"the traceback is in {trace}",
            }
        )
    outcome.seconds = round(time.perf_counter() - start, 3)
    reporter.update(outcome.state, "done" if outcome.state == "done" else "failed", outcome.kld)
    return outcome


def _execute(task: RunTask, reporter: StatusReporter) -> dict[str, object]:
    from quantkit.inputs.recipe import load_recipe_and_base
    from quantkit.run.pipeline import QuantizeRequest, run_quantize

    if task.threads is not None:
        import torch

        torch.set_num_threads(task.threads)
    _seed_reference(task)
    recipe, _ = load_recipe_and_base(task.recipe_ref, task.overrides)
    request = QuantizeRequest(
        recipe=recipe,
        model=task.model,
        out=Path(task.out),
        overwrite=task.overwrite,
        verbose=task.verbose,
        bench=task.bench,
        name=task.name,
        trust_remote_code=task.trust_remote_code,
        allow_implausible_baseline=task.allow_implausible_baseline,
        shared_baseline=Path(task.shared_baseline),
    )
    result = run_quantize(request, reporter)
    gate = result.gate
    return {
        "state": "done",
        "exit_code": 0 if gate is None or gate.passed else 1,
        "path": str(result.record.path),
        "kld": result.record.metric("kld_mean"),
        "gate_passed": None if gate is None else gate.passed,
    }


def main(argv: list[str]) -> int:
    """``python -m quantkit.sweep.task TASK_JSON``: run the task, print its outcome as JSON."""
    import sys

    task = RunTask.model_validate_json(argv[0])
    outcome = execute(task)
    sys.stdout.write(outcome.model_dump_json() + "\n")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
