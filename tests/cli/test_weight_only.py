"""GPTQ, AWQ and RTN through llm-compressor on the tiny model; validation before loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.cli import main
from quantkit.errors import RecipeError
from quantkit.inputs.recipe import validate_recipe

TINY_BUDGET = [
    "--set", "calibration.num_samples=4", "--set", "calibration.seq_len=64",
    "--set", "eval.num_windows=4", "--set", "eval.seq_len=64", "--set", "eval.top_k=8",
    "--set", "options.group_size=32", "--device", "cpu",
]  # fmt: skip


def quantize(recipe: str, model: Path, out: Path, *extra: str) -> dict:
    code = main(["quantize", recipe, "--model", str(model), "--out", str(out), *TINY_BUDGET, *extra])
    manifest = json.loads((out / "manifest.json").read_text())
    # Every recipe here passes its own gate on the tiny model (KLD ~2e-5 to 2e-4 against
    # max_kld_mean 0.35); rtn has no gate. A run that fails its gate exits 1 and fails here.
    assert code == 0
    assert (manifest["gate"] and manifest["gate"]["passed"]) is (None if recipe.startswith("rtn") else True)
    return manifest


@pytest.mark.parametrize("recipe", ["gptq-w4a16-g128", "awq-w4a16-g128", "rtn-w4a16-g64"])
def test_weight_only_recipes_make_loadable_compressed_tensors(
    recipe: str, tiny_model: Path, tmp_path: Path
) -> None:
    manifest = quantize(recipe, tiny_model, tmp_path / "run")
    artifact = tmp_path / "run" / "artifact"
    config = json.loads((artifact / "config.json").read_text())
    quant = config["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors"
    weights = quant["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["strategy"]) == (4, 32, "group")
    assert "lm_head" in quant["ignore"]
    assert manifest["artifact"]["scheme"].startswith("W4A16-g32")
    assert 4 < manifest["artifact"]["weight_bits"] < 5
    assert manifest["metrics"]["quantized"]["kld_mean"]["value"] > 0
    if recipe.startswith("rtn"):
        assert manifest["calibration"] is None
    else:
        assert manifest["calibration"]["tokens"] == 4 * 64


def test_gptq_records_per_layer_errors(tiny_model: Path, tmp_path: Path) -> None:
    manifest = quantize("gptq-w4a16-g128", tiny_model, tmp_path / "g")
    errors = manifest["artifact"]["details"]["layer_errors"]
    assert len(errors) == 2 * 7  # q, k, v, o, gate, up, down in each of the two layers
    assert all(entry["method"] == "GPTQ" and entry["loss"] > 0 for entry in errors)
    assert any("q_proj" in str(entry["module"]) for entry in errors)


def test_awq_records_scale_search_errors(tiny_model: Path, tmp_path: Path) -> None:
    manifest = quantize("awq-w4a16-g128", tiny_model, tmp_path / "a")
    errors = manifest["artifact"]["details"]["layer_errors"]
    assert errors and all(entry["method"] == "AWQ" for entry in errors)
    assert all(entry["best_error"] <= entry["initial_error"] + 1e-12 for entry in errors)


def _base(method: str, **options) -> dict:
    return {"name": "x", "method": method, "options": options}


@pytest.mark.parametrize("bits", [2, 5, 16])
def test_unsupported_bits_are_refused(bits: int) -> None:
    with pytest.raises(RecipeError, match=r"options\.bits"):
        validate_recipe(_base("gptq", bits=bits))


@pytest.mark.parametrize("group_size", [0, 48, 100])
def test_group_size_must_be_a_power_of_two(group_size: int) -> None:
    with pytest.raises(RecipeError, match=r"options\.group_size"):
        validate_recipe(_base("awq", group_size=group_size))


def test_per_channel_is_allowed() -> None:
    assert validate_recipe(_base("gptq", group_size=None)).options["group_size"] is None


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_calibrated_methods_refuse_null_calibration(method: str) -> None:
    with pytest.raises(RecipeError, match="needs calibration data"):
        validate_recipe(_base(method) | {"calibration": None})


def test_rtn_accepts_null_calibration() -> None:
    assert validate_recipe(_base("rtn") | {"calibration": None}).calibration is None


def test_group_size_not_dividing_the_model_is_refused_before_loading(
    tiny_model: Path, tmp_path: Path, capsys
) -> None:
    # tiny model: hidden 128, intermediate 256 -> group 512 cannot divide it
    code = main(["quantize", "gptq-w4a16-g128", "--model", str(tiny_model), "--out", str(tmp_path / "x"),
                 "--set", "options.group_size=512"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "does not divide hidden_size=128" in err and "group_size=128" in err
    assert not (tmp_path / "x").exists()


def test_smollm2_width_is_checked_against_group_128() -> None:
    from quantkit.backends.int_weights import IntWeightOptions, check_group_size_divides

    with pytest.raises(RecipeError) as err:
        check_group_size_divides(
            IntWeightOptions(group_size=128), {"hidden_size": 576, "intermediate_size": 1536}
        )
    assert "hidden_size=576" in err.value.message and "group_size=64" in err.value.hint


def test_gptq_reports_progress_per_decoder_layer(tiny_model: Path, tmp_path: Path) -> None:
    from contextlib import contextmanager

    from quantkit.inputs.recipe import load_recipe
    from quantkit.run.pipeline import QuantizeRequest, run_quantize
    from quantkit.util.progress import Reporter

    seen: dict[str, list[int]] = {}

    class Recording(Reporter):
        @contextmanager
        def stage(self, title, total=None):
            steps = seen.setdefault(title, [])
            yield steps.append

    recipe = load_recipe("gptq-w4a16-g128", [*TINY_BUDGET[1::2][:6], "options.group_size=32"])
    run_quantize(
        QuantizeRequest(recipe=recipe, model=str(tiny_model), out=tmp_path / "p", device="cpu"), Recording()
    )
    steps = seen["quantizing with gptq"]
    assert sum(steps) == 2 and len(steps) == 2  # one step per decoder layer of the tiny model


@pytest.mark.parametrize("bits", [3, 8])
def test_gptq_w3_and_w8(bits: int, tiny_model: Path, tmp_path: Path) -> None:
    manifest = quantize("gptq-w4a16-g128", tiny_model, tmp_path / "b", "--set", f"options.bits={bits}")
    config = json.loads((tmp_path / "b" / "artifact" / "config.json").read_text())
    assert config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] == bits
    assert manifest["artifact"]["scheme"] == f"W{bits}A16-g32"


def test_piped_output_prints_a_line_per_layer_with_elapsed_and_remaining(
    tiny_model: Path, tmp_path: Path
) -> None:
    """In CI logs (stderr not a terminal) GPTQ says where it is instead of going silent."""
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "QUANTKIT_PROGRESS_INTERVAL": "0"}
    args = ["quantize", "gptq-w4a16-g128", "--model", str(tiny_model), "--out", str(tmp_path / "p")]
    result = subprocess.run(
        [sys.executable, "-m", "quantkit", *args, *TINY_BUDGET], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert "▶ quantizing with gptq (2 steps)" in lines
    steps = [line for line in lines if line.startswith("  quantizing with gptq: ")]
    assert len(steps) == 2, result.stderr
    assert re.fullmatch(r"  quantizing with gptq: 1/2, \d+ s elapsed, ~\d+ s left", steps[0])
    assert re.fullmatch(r"  quantizing with gptq: 2/2, \d+ s elapsed", steps[1])
    assert any(re.fullmatch(r"✓ quantizing with gptq \(\d+ s\)", line) for line in lines)
