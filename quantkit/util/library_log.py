"""Where library output goes: ``library.log`` in each run, or the terminal with ``-v``.

Without ``-v``, what libraries log (Python ``logging`` and ``warnings``, transformers' own
handler, loguru from llm-compressor and compressed-tensors), what native code (llama.cpp)
prints and what a benchmark worker wrote to its stderr go to one file per process. Each run
keeps its part of it as ``library.log``: what was logged before the process's first run began
(imports) and during the run. Progress bars are dropped, in a log as on the terminal.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

LOG_NAME = "library.log"
TERMINAL_NOTE = "library output went to the terminal (-v)\n"
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_LOGURU_FORMAT = "{time:YYYY-MM-DD HH:mm:ss,SSS} {level} {name}: {message}"
# llm-compressor configures loguru from these when it is imported (llmcompressor/logger.py):
# no console sink, and its records (compressed-tensors' too: one loguru logger) to the log
_LLMCOMPRESSOR_ENV = ("LLM_COMPRESSOR_LOG_LEVEL", "LLM_COMPRESSOR_LOG_FILE", "LLM_COMPRESSOR_LOG_FILE_LEVEL")


class LibraryLog:
    """The process's library log: routes library output to a file, or leaves it on the terminal."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.verbose = True  # until start(): libraries print as they do by default
        self._handler: logging.Handler | None = None
        self._loguru_sink: int | None = None
        self._taken: list[tuple[logging.Logger, logging.Handler]] = []
        self._imports_end: int | None = None
        self._run_start = 0

    def start(self, verbose: bool) -> None:
        """Send library output to the log, or (``verbose``) to the terminal."""
        self.verbose = verbose
        if verbose:
            self._to_terminal()
        else:
            self._to_file()

    def begin_run(self) -> int:
        """Mark where the current run's part of the log begins; returns the mark."""
        size = self._size()
        if self._imports_end is None:
            self._imports_end = size
        self._run_start = size
        return size

    def write(self, source: str, lines: list[str]) -> None:
        """Append lines some code wrote outside Python's logging (native code, a subprocess)."""
        if self.verbose or self.path is None or not lines:
            return
        with self.path.open("a", encoding="utf-8") as sink:
            sink.writelines(f"{source}: {line}\n" for line in lines)

    def run_text(self, since: int | None = None) -> str:
        """A run's part of the log, under a line naming the command: the imports' lines, then
        what was logged since its mark (default: the latest ``begin_run``)."""
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        program = Path(sys.argv[0]).name
        command = " ".join(["quantkit" if program == "__main__.py" else program, *sys.argv[1:]])
        header = f"== {command} ({stamp})\n"
        if self.verbose or self.path is None:
            return header + TERMINAL_NOTE
        data = self.path.read_bytes()
        imports_end = self._imports_end or 0
        imports = data[:imports_end]
        run = data[max(self._run_start if since is None else since, imports_end) :]
        lines = [_plain(line) for line in (imports + run).decode("utf-8", "replace").splitlines()]
        return header + "".join(f"{line}\n" for line in lines or ["(no library output)"])

    def adopt(self) -> None:
        """Route the loggers of a library imported since ``start`` (its own stderr handler,
        not propagating: AutoRound's) to the log too."""
        if not self.verbose and self._handler is not None:
            self._take_over_stream_handlers()

    def _size(self) -> int:
        return 0 if self.path is None or not self.path.exists() else self.path.stat().st_size

    def _to_file(self) -> None:
        if self.path is None:
            handle, name = tempfile.mkstemp(prefix="quantkit-libraries-", suffix=".log")
            os.close(handle)
            self.path = Path(name)
            atexit.register(self.path.unlink, missing_ok=True)
        if self._handler is None:
            self._handler = logging.FileHandler(self.path, encoding="utf-8")
            self._handler.setFormatter(logging.Formatter(_FORMAT))
            logging.getLogger().addHandler(self._handler)
        logging.captureWarnings(True)  # warnings.warn() goes through logging ("py.warnings")
        os.environ.update(
            {
                "LLM_COMPRESSOR_LOG_LEVEL": "",  # no console sink
                "LLM_COMPRESSOR_LOG_FILE": str(self.path),
                "LLM_COMPRESSOR_LOG_FILE_LEVEL": "INFO",
            }
        )
        from loguru import logger

        logger.remove()  # loguru's stderr sink, or llm-compressor's stdout one if it was imported
        self._loguru_sink = logger.add(str(self.path), level="INFO", format=_LOGURU_FORMAT)
        _transformers_bars(shown=False)
        import torch  # noqa: F401  (torch sets up its loggers' stderr handlers when imported)

        self._take_over_stream_handlers()

    def _take_over_stream_handlers(self) -> None:
        """Libraries that log to stderr through a handler of their own and do not propagate
        (torch, transformers, datasets): their records go to the log instead."""
        assert self._handler is not None
        for library_logger in list(logging.root.manager.loggerDict.values()):
            if not isinstance(library_logger, logging.Logger) or library_logger.propagate:
                continue
            for handler in list(library_logger.handlers):
                if type(handler) is logging.StreamHandler:
                    library_logger.removeHandler(handler)
                    self._taken.append((library_logger, handler))
            if self._handler not in library_logger.handlers and any(
                taken is library_logger for taken, _ in self._taken
            ):
                library_logger.addHandler(self._handler)

    def _to_terminal(self) -> None:
        for library_logger, handler in self._taken:
            if self._handler is not None:
                library_logger.removeHandler(self._handler)
            library_logger.addHandler(handler)
        self._taken = []
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None
        logging.captureWarnings(False)
        for name in _LLMCOMPRESSOR_ENV:
            os.environ.pop(name, None)
        if self._loguru_sink is not None:
            from loguru import logger

            # every sink: ours, or llm-compressor's file sink to the log if its import
            # replaced ours (removing ours by id would then fail)
            logger.remove()
            self._loguru_sink = None
            logger.add(sys.stderr, level="INFO")
        if "transformers" in sys.modules:
            _transformers_bars(shown=True)


def _transformers_bars(shown: bool) -> None:
    """transformers draws its bars (loading weights) unless told not to."""
    import transformers

    if shown:
        transformers.utils.logging.enable_progress_bar()
    else:
        transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_warning()


def _plain(line: str) -> str:
    """llm-compressor's loguru file sink writes JSON records: their text, as a console shows it."""
    if not line.startswith('{"text": '):
        return line
    try:
        return str(json.loads(line)["text"]).rstrip("\n")
    except (ValueError, KeyError):
        return line


LIBRARY_LOG = LibraryLog()
