"""One output sink: data to stdout (human table or JSON), progress and logs to stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from quantkit.util.progress import Reporter

if TYPE_CHECKING:
    from rich.progress import ProgressColumn

    from quantkit.report.table import Comparison


class OutputFormat(str, Enum):
    human = "human"
    json = "json"


# When piped (CI logs, files) tables keep their natural width: a run's path or a scheme name
# is never cut or wrapped. In a terminal, the terminal's width.
stdout = Console(width=None if sys.stdout.isatty() else 1000)
stderr = Console(stderr=True, soft_wrap=True)


def terminal_width() -> int | None:
    """The terminal's width when stdout is one (tables are then laid out to fit it); None when
    piped, where tables keep every column at their natural width."""
    return stdout.width if stdout.is_terminal else None


def print_warnings(warnings: list[str]) -> None:
    """A comparison's warnings on stderr, each on a line of its own."""
    from rich.markup import escape

    for warning in warnings:  # wrapped at word boundaries in a terminal, whole lines when piped
        stderr.print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=not stderr.is_terminal)


def print_notes(notes: list[str]) -> None:
    """Notes (e.g. a deprecated name read) on stderr."""
    from rich.markup import escape

    for note in notes:
        stderr.print(f"[yellow]note:[/yellow] {escape(note)}", soft_wrap=not stderr.is_terminal)


@dataclass(frozen=True)
class TableView:
    """How a command shows its comparison in a terminal: fitted to the width (default), the
    ``--columns`` chosen, or ``--wide`` (every column)."""

    columns: list[str] | None = None
    wide: bool = False

    @classmethod
    def from_flags(cls, columns: str | None, wide: bool) -> TableView:
        """From ``--columns`` and ``--wide``; an unknown column is refused before anything runs."""
        from quantkit.report.terminal import parse_columns

        return cls(parse_columns(columns), wide)


def print_comparison(comparison: Comparison, view: TableView) -> None:
    """The comparison table on stdout as ``view`` asks, then its warnings on stderr."""
    from quantkit.report import render

    stdout.print(render.to_rich(comparison, terminal_width(), view.columns, view.wide))
    print_warnings(comparison.warnings)


def emit_json(data: object) -> None:
    """Machine-readable output on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class RichReporter(Reporter):
    """Progress on stderr (human mode only): bars in a terminal; when stderr is piped (CI
    logs), plain lines with elapsed time and an estimate of what remains, at most every
    ``QUANTKIT_PROGRESS_INTERVAL`` seconds (default 10), and a line a minute for long stages
    that cannot count their steps."""

    def __init__(self, interval_s: float | None = None) -> None:
        import os

        self.interval_s = (
            interval_s
            if interval_s is not None
            else float(os.environ.get("QUANTKIT_PROGRESS_INTERVAL", "10"))
        )

    @contextmanager
    def stage(self, title: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        if not stderr.is_terminal:
            with self._lines(title, total) as advance:
                yield advance
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        columns: list[ProgressColumn] = [SpinnerColumn(), TextColumn("{task.description}")]
        if total:
            columns += [BarColumn(), MofNCompleteColumn()]
        columns.append(TimeElapsedColumn())
        with Progress(*columns, console=stderr, transient=True) as progress:
            task = progress.add_task(title, total=total)
            yield lambda n: progress.advance(task, n)
        stderr.print(f"[green]✓[/green] {escape(title)}")

    @contextmanager
    def _lines(self, title: str, total: int | None) -> Iterator[Callable[[int], None]]:
        import threading
        import time

        start = time.monotonic()
        state = {"done": 0, "printed": start}
        stop = threading.Event()
        stderr.print(escape(f"▶ {title}" + (f" ({total} steps)" if total else "")))

        def advance(n: int) -> None:
            state["done"] += n
            now = time.monotonic()
            finished = bool(total) and state["done"] >= (total or 0)
            if now - state["printed"] < self.interval_s and not finished:
                return
            state["printed"] = now
            elapsed = now - start
            line = (
                f"  {title}: {state['done']}"
                + (f"/{total}" if total else "")
                + f", {_duration(elapsed)} elapsed"
            )
            if total and 0 < state["done"] < total:
                line += f", ~{_duration(elapsed / state['done'] * (total - state['done']))} left"
            stderr.print(escape(line))

        def heartbeat() -> None:
            while not stop.wait(max(60.0, self.interval_s)):
                if time.monotonic() - state["printed"] >= max(60.0, self.interval_s):
                    state["printed"] = time.monotonic()
                    elapsed = _duration(time.monotonic() - start)
                    stderr.print(escape(f"  {title}: still running, {elapsed} elapsed"))

        ticker = threading.Thread(target=heartbeat, daemon=True)
        ticker.start()
        try:
            yield advance
        finally:
            stop.set()
            ticker.join()
        stderr.print(escape(f"✓ {title} ({_duration(time.monotonic() - start)})"))

    def log(self, message: str) -> None:
        stderr.print(f"  [dim]{escape(message)}[/dim]")
