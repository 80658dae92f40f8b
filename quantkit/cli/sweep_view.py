"""The sweep's Rich view: a line per run (queued / its current stage / done / failed, with
its KLD when known) and an overall bar; plain lines when stderr is not a terminal."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from rich.markup import escape

from quantkit.cli.output import RichReporter, stderr
from quantkit.sweep.record import SweepRun
from quantkit.sweep.task import RunStatus
from quantkit.util.progress import Reporter

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live
    from rich.progress import Progress, TaskID

COLOURS = {"queued": "dim", "running": "cyan", "done": "green", "failed": "red"}


class RichSweepView:
    def __init__(self) -> None:
        self.reporter: Reporter = RichReporter()
        self._rows: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._progress: Progress | None = None
        self._bar: TaskID | None = None

    def start(self, runs: list[SweepRun], executor: str) -> None:
        stderr.print(f"[bold]sweep[/bold]: {len(runs)} runs, {escape(executor)}")
        for run in runs:
            state = "done" if run.kept else run.state
            stage = "kept (finished before, checksums verified)" if run.kept else ""
            self._rows[run.run_id] = [run.name, state, stage, _kld(run.kld)]
        if not stderr.is_terminal:
            return
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(
            TextColumn("runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=stderr
        )
        finished = sum(row[1] in ("done", "failed") for row in self._rows.values())
        self._bar = progress.add_task("runs", total=len(runs), completed=finished)
        self._progress = progress
        live = Live(self._render(), console=stderr, refresh_per_second=4, transient=False)
        live.start()
        self._live = live

    def _render(self) -> RenderableType:
        from rich.console import Group
        from rich.table import Table

        table = Table(show_header=True, header_style="bold", box=None)
        for heading in ("run", "state", "stage", "KLD"):
            table.add_column(heading, justify="right" if heading == "KLD" else "left")
        with self._lock:
            for name, state, stage, kld in self._rows.values():
                colour = COLOURS.get(state, "white")
                table.add_row(escape(name), f"[{colour}]{state}[/{colour}]", escape(stage), kld)
        return Group(table, self._progress) if self._progress is not None else table

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def update(self, run_id: str, status: RunStatus) -> None:
        with self._lock:
            row = self._rows[run_id]
            changed = (row[1], row[2]) != (status.state, status.stage)
            row[1], row[2] = status.state, status.stage + (f" ({status.host})" if status.host else "")
        if self._live is None and changed and status.state == "running":
            stderr.print(escape(f"  {row[0]}: {status.stage}"))
        self._refresh()

    def finished(self, run: SweepRun) -> None:
        with self._lock:
            row = self._rows[run.run_id]
            row[1], row[3] = run.state, _kld(run.kld)
            row[2] = (run.error or "") if run.state == "failed" else f"{run.seconds or 0:.0f} s"
        if self._progress is not None and self._bar is not None:
            self._progress.advance(self._bar)
        if self._live is None:
            colour = COLOURS[run.state]
            detail = f": {run.error}" if run.error else f", KLD {_kld(run.kld)}"
            stderr.print(f"[{colour}]{run.state}[/{colour}] {escape(run.name + detail)}")
        self._refresh()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def _kld(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"
