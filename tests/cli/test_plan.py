"""`quantkit plan` and the pipeline's pre-flight memory check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.cli import main
from quantkit.plan import Serving, Target, count_parameters, estimate


def test_estimate_from_headers_matches_the_model(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    stored = count_parameters(tiny_model)
    assert stored == sum(p.numel() for p in model.parameters())  # tied embeddings stored once
    plan = estimate(tiny_model, Target("W4A16-g64", 4.25), Serving(1024, 2, "h200", 10**12))
    assert (
        plan.kv_cache_bytes == 2 * 2 * 2 * 32 * 1024 * 2 * 2
    )  # K+V, layers, kv heads, head dim, ctx, batch, fp16
    assert plan.quantized_weights_bytes < plan.baseline_weights_bytes
    assert plan.fits is True


def test_plan_cli_json_and_named_devices(tiny_model: Path, capsys) -> None:
    assert (
        main(
            ["plan", "gptq-w4a16-g64", "--model", str(tiny_model), "--device-name", "l4", "--format", "json"]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["device"] == "l4" and data["fits"] is True and data["weight_bits"] == pytest.approx(4.25)
    huge = ["--context", "1000000", "--batch", "4096", "--format", "json"]
    assert main(["plan", "fp8-dynamic", "--model", str(tiny_model), "--device-name", "l4", *huge]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is False


def test_plan_unknown_device(tiny_model: Path, capsys) -> None:
    assert main(["plan", "fp8-dynamic", "--model", str(tiny_model), "--device-name", "h100-80g"]) == 2
    assert "did you mean 'h100-80gb'" in capsys.readouterr().err


def test_quantize_refuses_a_model_that_cannot_fit(
    tiny_recipe: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    import quantkit.plan

    monkeypatch.setattr(quantkit.plan, "machine_memory", lambda device: 1000)
    assert main(["quantize", str(tiny_recipe), "--out", str(tmp_path / "x")]) == 2
    assert "not enough memory on cpu" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
