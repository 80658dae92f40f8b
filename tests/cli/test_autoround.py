"""method: autoround: its own typed options per output type, refused with what to do instead,
and a missing AutoRound refused before any model is resolved or loaded. None of these loads a
model: each is refused first (the model path given does not even exist)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_gptq_engines import quantkit

CASES = {
    "bits AutoRound cannot write": (
        ["autoround-w4a16-g128", "--set", "options.bits=5"],
        [
            "error: autoround-w4a16-g128.yaml: options.bits=5: AutoRound's integer formats hold 2, 3, 4 or "
            "8 bits",
            "hint: use options.bits 2, 3, 4 or 8 (or a GGUF type, e.g. options.format=gguf:q5_k_m)",
        ],
    ),
    "bits the auto_awq format cannot hold": (
        ["autoround-w4a16-g128", "--set", "options.format=auto_awq", "--set", "options.bits=2"],
        [
            "error: autoround-w4a16-g128.yaml: options.bits=2: the auto_awq format holds 4-bit weights only",
            "hint: use options.format=auto_round",
        ],
    ),
    "an option AutoRound lacks (GPTQ's)": (
        ["autoround-w4a16-g128", "--set", "options.damp_percent=0.1"],
        [
            "error: autoround-w4a16-g128.yaml: options.damp_percent is not an option of method autoround",
            "hint: choose one of: batch_size, bits, dynamic_max_gap, enable_minmax_tuning, "
            "enable_norm_bias_tuning, enable_quanted_input, enable_torch_compile, format, "
            "gradient_accumulate_steps, group_size, ignore, iters, lr, minmax_lr, nblocks, not_use_best_mse, "
            "symmetric",
        ],
    ),
    "AutoRound's own nsamples: the calibration section's": (
        ["autoround-w4a16-g128", "--set", "options.nsamples=32"],
        [
            "error: autoround-w4a16-g128.yaml: options.nsamples: AutoRound takes it from the recipe's "
            "calibration.num_samples here",
            "hint: remove options.nsamples; set calibration.num_samples instead",
        ],
    ),
    "bits with a GGUF type": (
        ["autoround-gguf-q4_k_m", "--set", "options.bits=4"],
        [
            "error: autoround-gguf-q4_k_m.yaml: options.bits is not an option of AutoRound's format "
            "gguf:q4_k_m (the GGUF type fixes it)",
            "hint: remove options.bits, or set options.format=auto_round",
        ],
    ),
    "a format AutoRound has no writer for here": (
        ["autoround-w4a16-g128", "--set", "options.format=gguf:q4_k"],
        [
            "error: autoround-w4a16-g128.yaml: options.format=gguf:q4_k: AutoRound (in quantkit) writes "
            "auto_round, auto_gptq, auto_awq or a GGUF type",
            "hint: did you mean 'gguf:q4_k_s'?",
        ],
    ),
    "a group size that is no power of two": (
        ["autoround-w4a16-g128", "--set", "options.group_size=96"],
        ["hint: fix the value in the recipe or with --set"],
    ),
    "a misspelt option": (
        ["autoround-w4a16-g128", "--set", "options.iter=4"],
        [
            "error: autoround-w4a16-g128.yaml: options.iter is not an option of method autoround",
            "hint: did you mean 'iters'?",
        ],
    ),
    "a negative iteration count": (
        ["autoround-w4a16-g128", "--set", "options.iters=-1"],
        ["hint: fix the value in the recipe or with --set"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_autoround_options_exit_2_before_any_model_loads(case: str, tmp_path: Path) -> None:
    args, expected = CASES[case]
    result = quantkit("quantize", *args, "--model", str(tmp_path / "no-model"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-len(expected) :] == expected
    assert lines[-2].startswith("error: ")
    assert not (tmp_path / "runs").exists()


def test_a_group_size_that_does_not_divide_the_model_is_refused_before_loading(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The tiny model's widths are 128 and 256: group 256 does not divide 128 (checked on its
    config.json, as for the GPTQ recipes), before AutoRound is imported."""
    args = ["autoround-w4a16-g128", "--set", "options.group_size=256", "--model", str(tiny_model)]
    result = quantkit("quantize", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "hint: use options.group_size=128"
    assert "options.group_size=256 does not divide hidden_size=128" in result.stderr
    assert not list((tmp_path / "runs").glob("*/artifact"))


@pytest.mark.parametrize("recipe", ["autoround-w4a16-g128", "autoround-gguf-q4_k_m"])
def test_autoround_not_installed_is_refused_before_the_model_is_resolved(recipe: str, tmp_path: Path) -> None:
    """Simulates AutoRound being absent by making its import fail in the process
    (``sys.modules['auto_round'] = None``: ``importlib.util.find_spec`` finds nothing, as
    where it is not installed)."""
    prelude = "import sys\nsys.modules['auto_round'] = None"
    model = tmp_path / "no-model"
    result = quantkit("quantize", recipe, "--model", str(model), cwd=tmp_path, prelude=prelude)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-2:] == [
        "error: AutoRound is not installed (method: autoround)",
        "hint: pip install 'quantkit[autoround]'",
    ]
    assert not (tmp_path / "runs").exists()


def test_each_output_type_validates_to_its_own_options() -> None:
    from quantkit.backends.autoround import AutoRoundBackend, AutoRoundGGUFBackend
    from quantkit.inputs.recipe import load_recipe

    recipe = load_recipe("autoround-w4a16-g128", ["options.group_size=64", "options.iters=4"])
    backend = recipe.backend()
    assert type(backend) is AutoRoundBackend and backend.runtime == "hf" and backend.library == "auto-round"
    assert backend.describe() == ("W4A16-g64", 4.25)
    options = backend.options
    assert options.scheme_kwargs() == {"bits": 4, "group_size": 64, "sym": True}  # type: ignore[attr-defined]
    assert options.tuning_kwargs() == {  # type: ignore[attr-defined]
        "iters": 4, "lr": None, "minmax_lr": None, "enable_minmax_tuning": True,
        "enable_quanted_input": True, "enable_norm_bias_tuning": False, "nblocks": 1, "batch_size": 8,
        "gradient_accumulate_steps": 1, "not_use_best_mse": False, "dynamic_max_gap": -1,
        "enable_torch_compile": False,
    }  # fmt: skip
    with_ignore = load_recipe("autoround-w4a16-g128", ["options.ignore=[lm_head,mlp.down_proj]"]).backend()
    assert with_ignore.options.tuning_kwargs()["ignore_layers"] == "mlp.down_proj"  # type: ignore[attr-defined]
    gguf = load_recipe("autoround-gguf-q4_k_m", []).backend()
    assert gguf.options.tuning_kwargs() == {  # type: ignore[attr-defined]
        "iters": 0, "batch_size": 8, "enable_torch_compile": False,
    }  # fmt: skip
    assert type(gguf) is AutoRoundGGUFBackend and gguf.runtime == "llamacpp"
    assert gguf.describe() == ("Q4_K_M (AutoRound)", 4.89)
    assert "bits" not in load_recipe("autoround-gguf-q4_k_m", []).options
    assert gguf.requires_calibration() and backend.requires_calibration()


def test_the_method_column_names_autoround_once() -> None:
    from conftest import synthetic_record

    from quantkit.report.table import method_label

    manifest = synthetic_record("ar", "W4A16-g64", {"kld_mean": 0.2}, {"ppl": 20.0}).manifest
    ran = manifest.model_copy(
        update={
            "recipe": manifest.recipe.model_copy(update={"method": "autoround"}),
            "artifact": manifest.artifact.model_copy(update={"details": {"engine": "autoround"}}),
        }
    )
    assert method_label(ran) == "autoround"
