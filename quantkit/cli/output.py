"""One output sink: data to stdout (human table or JSON), progress and logs to stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any

from rich.console import Console

from quantkit.progress import Reporter


class OutputFormat(str, Enum):
    human = "human"
    json = "json"


# When piped (CI logs, files) tables keep their natural width: a run's path or a scheme name
# is never cut or wrapped. In a terminal, the terminal's width.
stdout = Console(width=None if sys.stdout.isatty() else 1000)
stderr = Console(stderr=True, soft_wrap=True)


def emit_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


class RichReporter(Reporter):
    """Stage lines and progress bars on stderr (human mode only)."""

    @contextmanager
    def stage(self, title: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
        if total:
            columns += [BarColumn(), MofNCompleteColumn()]
        columns.append(TimeElapsedColumn())
        with Progress(*columns, console=stderr, transient=True) as progress:
            task = progress.add_task(title, total=total)
            yield lambda n: progress.advance(task, n)
        stderr.print(f"[green]✓[/green] {title}")

    def log(self, message: str) -> None:
        stderr.print(f"  [dim]{message}[/dim]")
