"""Processes sharing one cache (two terminals, sweep workers on one machine, pytest workers): an
entry another process is making is waited for and reused, not made twice or replaced under a
reader. Threads stand in for processes: each opens the lock file itself, and flock excludes
open file descriptions, not processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest


def _together(call: object, times: int = 2) -> list[object]:
    """Run ``call`` in ``times`` threads started together; their results."""
    results: list[object] = [None] * times
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = call()  # type: ignore[operator]
        except BaseException as err:  # re-raised below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def test_a_gguf_model_converted_by_another_process_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quantkit.inputs import gguf_source, models

    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF not really")
    calls: list[Path] = []

    def convert(path: Path, target: Path, **_: object) -> Path:
        calls.append(target)
        time.sleep(0.5)  # long enough for the other caller to find no folder yet
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"weights")
        return target

    monkeypatch.setattr(gguf_source, "convert_gguf", convert)
    folders = _together(lambda: models.gguf_model_path(source))
    assert len(calls) == 1  # the second caller waited and reused the first's folder
    assert folders[0] == folders[1] == calls[0]


def test_a_reference_computed_by_another_process_is_reused(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import write_tiny_recipe

    from quantkit.inputs.models import resolve_model
    from quantkit.inputs.recipe import load_recipe
    from quantkit.runtimes.hf import HFRuntime
    from quantkit.stages.context import Tokens
    from quantkit.stages.reference import BaselineInputs, ensure_reference
    from quantkit.util.progress import Reporter

    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path / "cache"))
    recipe = load_recipe(write_tiny_recipe(tmp_path, tiny_model))
    source = resolve_model(str(tiny_model))
    loads: list[Path] = []
    load = HFRuntime.load.__func__  # type: ignore[attr-defined]

    def counted(cls: type[HFRuntime], path: Path, settings: object) -> HFRuntime:
        loads.append(path)
        time.sleep(0.5)
        return load(cls, path, settings)

    monkeypatch.setattr(HFRuntime, "load", classmethod(counted))

    def reference() -> tuple[object, float | None]:
        inputs = BaselineInputs(recipe, source, "cpu", Tokens(recipe, source, False, False))
        return ensure_reference(inputs, Reporter())

    results = _together(reference)
    assert len(loads) == 1  # computed once
    seconds = sorted((r[1] is None) for r in results)  # type: ignore[index]
    assert seconds == [False, True]  # one computed it, the other found it cached
