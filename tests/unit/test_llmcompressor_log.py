"""llm-compressor's hooks leave loguru to the library log: before, they removed every sink and,
after each run, added a stderr sink for the rest of the process, so later library warnings
reached the terminal and missed the run's library.log."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from quantkit.backends import llmcompressor_run
from quantkit.util.library_log import LibraryLog


def test_after_an_llm_compressor_run_loguru_warnings_still_go_to_the_log(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from loguru import logger

    log = LibraryLog()
    log.start(verbose=False)
    try:
        log.begin_run()
        job = SimpleNamespace(verbose=False, on_layer=lambda layer: None)
        with llmcompressor_run._llmcompressor_hooks(job, torch.nn.Linear(2, 2)):  # type: ignore[arg-type]
            pass
        logger.warning("a warning after the run")
        assert "a warning after the run" not in capfd.readouterr().err
        assert "a warning after the run" in log.run_text()
    finally:
        log.start(verbose=True)
        assert log.path is not None
        log.path.unlink(missing_ok=True)
