"""The executor interface: run a sweep's tasks somewhere and report each outcome."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Protocol

from quantkit.sweep.baseline import BaselineJob, BaselineOutcome
from quantkit.sweep.spec import SweepSpec
from quantkit.sweep.task import RunOutcome, RunTask
from quantkit.util.progress import Reporter


class Executor(Protocol):
    """Runs tasks; ``done`` is called once per task, in the driver's thread, as each ends."""

    name: ClassVar[str]

    def __init__(self, spec: SweepSpec, folder: Path) -> None: ...

    def check(self) -> None:
        """Refuse what cannot work (an address that does not answer) before anything is made."""

    def describe(self) -> str:
        """One line for the sweep manifest and the view (where runs go, how many at once)."""

    def threads(self) -> int | None:
        """Torch threads per run on the CPU (None: leave torch's default)."""

    def baselines(self, job: BaselineJob, reporter: Reporter) -> BaselineOutcome:
        """Run the baseline phase where the runs will run (same device and resources)."""

    def run(self, tasks: list[RunTask], done: Callable[[RunOutcome], None]) -> None: ...
