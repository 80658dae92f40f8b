"""`quantkit plan` and the pipeline's pre-flight memory check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.cli import main
from quantkit.inputs.plan import Serving, Target, count_parameters, estimate


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
    import quantkit.inputs.plan

    monkeypatch.setattr(quantkit.inputs.plan, "machine_memory", lambda device: 1000)
    assert main(["quantize", str(tiny_recipe), "--out", str(tmp_path / "x")]) == 2
    assert "not enough memory on cpu" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("extra", "tokens"),
    [
        ({}, [1024, 1024]),
        ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 128}, [128, 1024]),
        ({"sliding_window": 256}, [256, 256]),  # Mistral: every layer
        ({"sliding_window": 256, "use_sliding_window": False}, [1024, 1024]),  # Qwen2's default
        ({"layer_types": ["sliding_attention", "sliding_attention"], "sliding_window": 4096}, [1024, 1024]),
    ],
)
def test_kv_cache_counts_sliding_window_layers(
    tiny_model: Path, tmp_path: Path, extra: dict[str, object], tokens: list[int]
) -> None:
    """Gemma 3 270M keeps 512 tokens in 15 of its 18 layers: at 8k context its KV cache is
    (15 x 512 + 3 x 8192) / (18 x 8192) = 22 % of a full-attention estimate."""
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text()) | extra
    (folder / "config.json").write_text(json.dumps(config))
    plan = estimate(folder, Target("W4A16-g64", 4.25), Serving(1024, 2, "h200", 10**12))
    # K+V, kv heads, head dim, batch, fp16
    assert plan.kv_cache_bytes == sum(2 * 2 * 32 * 2 * 2 * t for t in tokens)
