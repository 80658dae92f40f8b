"""The local executor: runs on this machine, one at a time on the CPU (in this process), or
one per visible GPU at once (each in a process of its own, pinned to its GPU)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import ClassVar

from quantkit.device import cpu_threads
from quantkit.sweep.baseline import BaselineJob, BaselineOutcome, run_baseline_job
from quantkit.sweep.spec import SweepSpec
from quantkit.sweep.task import RunOutcome, RunTask, execute
from quantkit.util.progress import Reporter


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class LocalExecutor:
    name: ClassVar[str] = "local"

    def __init__(self, spec: SweepSpec, folder: Path) -> None:
        self.spec = spec
        self.folder = folder
        self.gpus = _gpu_count() if spec.device != "cpu" else 0
        self.jobs = spec.jobs or max(1, self.gpus)

    def check(self) -> None:
        return None

    def describe(self) -> str:
        if self.jobs == 1:
            return "local: one run at a time, in this process"
        where = f"pinned to {self.gpus} GPU(s)" if self.gpus else f"{self.threads()} CPU thread(s) each"
        return f"local: {self.jobs} runs at once, each in its own process, {where}"

    def threads(self) -> int | None:
        if self.jobs == 1 or self.gpus:
            return None
        return max(1, cpu_threads() // self.jobs)

    def baselines(self, job: BaselineJob, reporter: Reporter) -> BaselineOutcome:
        return run_baseline_job(job, reporter)  # here, in the driver (it sees the runs' GPUs)

    def run(self, tasks: list[RunTask], done: Callable[[RunOutcome], None]) -> None:
        if self.jobs == 1:
            for task in tasks:
                done(execute(task))
            return
        slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.jobs):
            slots.put(slot)
        with ThreadPoolExecutor(self.jobs) as pool:
            futures = [pool.submit(self._in_process_of_its_own, task, slots) for task in tasks]
            for future in as_completed(futures):
                done(future.result())

    def _in_process_of_its_own(self, task: RunTask, slots: queue.Queue[int]) -> RunOutcome:
        slot = slots.get()
        try:
            env = dict(os.environ)
            if self.gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(slot % self.gpus)
            return run_in_subprocess(task, env)
        finally:
            slots.put(slot)


def run_in_subprocess(task: RunTask, env: dict[str, str]) -> RunOutcome:
    """Run ``task`` in a fresh Python process; a process that dies is a failed run."""
    command = [sys.executable, "-m", "quantkit.sweep.task", task.model_dump_json()]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode == 0 and lines:
        return RunOutcome.model_validate_json(lines[-1])
    how = f"signal {-result.returncode}" if result.returncode < 0 else f"exit code {result.returncode}"
    last = (result.stderr.strip().splitlines() or [""])[-1]
    return RunOutcome(
        run_id=task.run_id,
        state="failed",
        exit_code=3,
        error=f"the run's process died ({how}){': ' + last if last else ''}",
        hint="run the sweep again: the run resumes from its completed stages",
    )
