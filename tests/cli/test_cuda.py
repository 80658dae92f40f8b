"""The CUDA branches, on a real GPU (marked ``gpu``: skipped where ``torch.cuda`` sees none).

Each test here is the CUDA side of a CPU test elsewhere: device selection, the bfloat16
baseline, the HF runtime's device memory, scoring on the GPU against the CPU, and the bench's
``memory_kind: cuda`` (allocated and reserved peaks instead of RSS).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quantkit.cli import main

pytestmark = pytest.mark.gpu


def test_auto_picks_cuda_and_the_baseline_is_bfloat16() -> None:
    import torch

    from quantkit.device import baseline_dtype, compute_dtype, resolve_device

    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda") == "cuda"
    assert baseline_dtype("cuda") == "bfloat16" and compute_dtype("cuda") == torch.bfloat16


def _scores(model: Path, device: str, ids: np.ndarray) -> tuple[np.ndarray, object]:
    from quantkit.runtimes import open_runtime
    from quantkit.runtimes.base import RuntimeSettings, ScoreRequest

    runtime = open_runtime("hf", model, RuntimeSettings(device=device, context_length=ids.shape[1]))
    try:
        scores = runtime.score(ScoreRequest(ids=ids, top_k=4))
        memory = runtime.device_memory()
    finally:
        runtime.close()
    return scores.target_logprobs, memory


def test_hf_runtime_scores_on_cuda_like_the_cpu_and_reports_device_memory(tiny_model: Path) -> None:
    ids = np.random.default_rng(0).integers(3, 200, size=(2, 32))
    on_cpu, cpu_memory = _scores(tiny_model, "cpu", ids)
    on_gpu, gpu_memory = _scores(tiny_model, "cuda", ids)
    assert cpu_memory is None
    assert gpu_memory is not None
    assert gpu_memory.peak_allocated_bytes >= gpu_memory.allocated_bytes > 0
    assert gpu_memory.peak_reserved_bytes >= gpu_memory.peak_allocated_bytes
    # bfloat16 on the GPU against float32 on the CPU: close, not equal
    assert float(np.abs(on_gpu - on_cpu).mean()) < 0.05


def test_quantize_and_bench_on_cuda(
    tiny_recipe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUANTKIT_NO_BENCH", raising=False)
    out = tmp_path / "run"
    small = [
        "--set",
        "bench.prompt_lengths=[16]",
        "--set",
        "bench.decode_tokens=4",
        "--set",
        "bench.repeats=1",
    ]
    assert main(["quantize", str(tiny_recipe), "--out", str(out), "--device", "cuda", "--bench", *small]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "cuda" and manifest["environment"]["hardware"]["gpu"]["memory_bytes"] > 0
    assert manifest["baseline"]["dtype"] == "bfloat16"
    assert 0 < manifest["metrics"]["quantized"]["kld_mean"]["value"] < 1.0
    for side in ("baseline", "artifact"):
        result = manifest["bench"][side]
        assert result["memory_kind"] == "cuda"
        assert result["peak_allocated_bytes"] >= result["weights_memory_bytes"] > 0
    quantized = manifest["metrics"]["quantized"]
    assert 0 < quantized["memory_ratio"]["value"] < 2  # allocated vs allocated, not RSS vs allocated
