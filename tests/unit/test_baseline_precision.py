"""The baseline precision rule (quantkit.device) and where it reaches: the transformers
runtime, the bench worker and the lm-eval baseline cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.device import baseline_dtype
from quantkit.errors import UserInputError
from quantkit.inputs.recipe import validate_recipe
from quantkit.runtimes.base import RuntimeSettings


def test_auto_is_float32_on_the_cpu_and_bfloat16_on_cuda_and_an_explicit_dtype_wins() -> None:
    assert (baseline_dtype("cpu"), baseline_dtype("cuda")) == ("float32", "bfloat16")
    assert (baseline_dtype("cpu", "auto"), baseline_dtype("cuda", "auto")) == ("float32", "bfloat16")
    assert baseline_dtype("cpu", "bfloat16") == "bfloat16"
    assert baseline_dtype("cuda", "float32") == "float32"
    assert baseline_dtype("cpu", "float16") == "float16"
    with pytest.raises(UserInputError, match="unknown baseline dtype 'fp17'"):
        baseline_dtype("cpu", "fp17")


def test_the_recipe_section_defaults_to_auto_and_refuses_unknown_fields() -> None:
    assert validate_recipe({"name": "x", "method": "fp8"}).baseline.dtype == "auto"
    with pytest.raises(UserInputError) as err:
        validate_recipe({"name": "x", "method": "fp8", "baseline": {"dtyp": "float32"}})
    assert "baseline.dtyp" in err.value.message and "dtype" in err.value.hint


def test_runtime_settings_resolve_the_compute_dtype() -> None:
    assert RuntimeSettings(device="cpu").compute_dtype == "float32"
    assert RuntimeSettings(device="cuda").compute_dtype == "bfloat16"
    assert RuntimeSettings(device="cpu", dtype="bfloat16").compute_dtype == "bfloat16"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_bench_worker_loads_the_model_in_the_asked_precision(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    import torch

    from quantkit.evals import perf_worker
    from quantkit.evals.perf import WorkerSettings
    from quantkit.runtimes.hf import HFRuntime

    loaded: list[torch.dtype] = []
    load = HFRuntime.load.__func__

    def spy(cls: type[HFRuntime], path: Path, settings: RuntimeSettings) -> HFRuntime:
        runtime = load(cls, path, settings)
        loaded.append(runtime.model.dtype)
        return runtime

    monkeypatch.setattr(HFRuntime, "load", classmethod(spy))
    settings = WorkerSettings(
        path=str(tiny_model),
        runtime="hf",
        device="cpu",
        prompt_lengths=[8],
        decode_tokens=2,
        repeats=1,
        batch_size=1,
        threads=None,
        dtype=dtype,
    )
    side = perf_worker.measure(settings)
    assert loaded == [getattr(torch, dtype)] and side.decode_tok_s > 0


def test_lm_eval_baselines_are_cached_per_precision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_extra("lm_eval", "lm-eval")
    from quantkit.evals import lm_eval_runner as runner
    from quantkit.inputs.specs import LmEvalSpec

    computed: list[str] = []

    def evaluate_in(kind: str, path: Path, settings: RuntimeSettings, *args: object) -> dict[str, object]:
        computed.append(settings.compute_dtype)
        return {}

    monkeypatch.setattr(runner, "evaluate_in", evaluate_in)
    spec = LmEvalSpec(tasks=["quantkit_cloze"])
    for dtype in ("float32", "bfloat16", "float32", "bfloat16"):
        runner.baseline(tmp_path, "f" * 64, RuntimeSettings(device="cpu", dtype=dtype), spec)
    assert computed == ["float32", "bfloat16"]  # each precision once, then from the cache
