"""The library log (issue #39): what libraries log goes to a file, and each run keeps the
imports' lines and its own, not another run's."""

from __future__ import annotations

import logging

import pytest

from quantkit.util.library_log import TERMINAL_NOTE, LibraryLog


@pytest.fixture
def log():
    library_log = LibraryLog()
    library_log.start(verbose=False)
    yield library_log
    library_log.start(verbose=True)  # handlers back as they were
    assert library_log.path is not None
    library_log.path.unlink(missing_ok=True)


def test_each_run_keeps_the_imports_lines_and_its_own(log: LibraryLog) -> None:
    library = logging.getLogger("some_library")
    library.warning("while importing")
    log.begin_run()
    library.warning("first run")
    log.write("llama.cpp", ["llama_model_loader: loaded meta data"])
    first = log.run_text()
    log.begin_run()
    library.warning("second run")
    second = log.run_text()
    assert first.startswith("== ") and second.startswith("== ")
    assert "WARNING some_library: while importing" in first and "while importing" in second
    assert "first run" in first and "llama.cpp: llama_model_loader: loaded meta data" in first
    assert "second run" not in first and "first run" not in second and "second run" in second


def test_a_library_with_its_own_stderr_handler_is_routed_to_the_log(
    log: LibraryLog, capsys: pytest.CaptureFixture[str]
) -> None:
    """Like AutoRound's logger (set up on import, after quantkit started the log): adopt()."""
    own = logging.getLogger("late_library")
    own.propagate = False
    own.addHandler(logging.StreamHandler())
    try:
        log.begin_run()
        log.adopt()
        own.warning("a late library's warning")
        assert "a late library's warning" not in capsys.readouterr().err
        assert "WARNING late_library: a late library's warning" in log.run_text()
        log.start(verbose=True)  # -v: its own handler again, on the terminal
        own.warning("shown")
        assert "shown" in capsys.readouterr().err and log.run_text().endswith(TERMINAL_NOTE)
    finally:
        own.handlers.clear()


def test_llm_compressors_json_records_are_read_as_text(log: LibraryLog) -> None:
    assert log.path is not None
    log.begin_run()
    record = '{"text": "2026-12-07 | WARNING | llmcompressor - No accelerator\\n", "record": {}}'
    with log.path.open("a") as sink:
        sink.write(record + "\n")
    assert "\n2026-12-07 | WARNING | llmcompressor - No accelerator\n" in log.run_text()
