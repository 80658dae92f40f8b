"""How the pipeline reports progress; the CLI supplies a Rich implementation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Reporter:
    """Silent reporter (library use, ``--format json``). Subclasses draw progress."""

    @contextmanager
    def stage(self, title: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        """A named stage; yields ``advance(n)`` for stages with a known ``total``."""
        yield lambda n: None

    def log(self, message: str) -> None:
        """A line of progress information."""


def quiet_libraries(verbose: bool) -> None:
    """Send library logs, warnings and progress bars to the run's ``library.log``, or leave
    them on the terminal when ``verbose``."""
    import os

    from quantkit.util.library_log import LIBRARY_LOG

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not verbose:
        os.environ["TQDM_DISABLE"] = "1"  # compressed-tensors and accelerate draw their own bars
        try:
            import datasets

            datasets.disable_progress_bars()
        except ImportError:  # pragma: no cover
            pass
    LIBRARY_LOG.start(verbose)


class _DropProgressBars:
    """A stderr proxy that drops the tqdm bars some libraries draw unconditionally."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def write(self, text: str) -> int:
        bar = "\r" in text and ("it/s" in text or "s/it" in text or "%|" in text)
        if bar or text == "\n":  # a bar, or the newline tqdm writes when a bar closes
            return len(text)
        written = self._target.write(text)  # None from some wrappers (Ray workers' stderr)
        return len(text) if written is None else int(written)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


@contextmanager
def library_bars_hidden(verbose: bool) -> Iterator[None]:
    """Hide library progress bars on stderr for the duration (unless ``verbose``)."""
    import sys

    if verbose:
        yield
        return
    original = sys.stderr
    sys.stderr = _DropProgressBars(original)
    try:
        yield
    finally:
        sys.stderr = original


@contextmanager
def stdout_to_stderr(drop: bool = False) -> Iterator[None]:
    """Send what anything writes to file descriptor 1 (stdout: quantkit's data channel, e.g.
    ``--format json``) to stderr for the duration, or to /dev/null with ``drop``. For libraries
    that print banners and logs on stdout (GPTQModel, also when transformers loads a GPTQ
    checkpoint through it)."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    target = os.open(os.devnull, os.O_WRONLY) if drop else os.dup(2)
    os.dup2(target, 1)
    os.close(target)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextmanager
def native_stderr_captured(verbose: bool, source: str = "llama.cpp") -> Iterator[list[str]]:
    """Capture what native code (llama.cpp) writes to file descriptor 2, unless ``verbose``.

    Yields a list that holds the captured lines once the block ends (for error messages); they
    also go to the library log, marked with ``source``.
    """
    import os
    import sys
    import tempfile

    from quantkit.util.library_log import LIBRARY_LOG

    lines: list[str] = []
    if verbose:
        yield lines
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode("utf-8", "replace").splitlines())
            LIBRARY_LOG.write(source, lines)
