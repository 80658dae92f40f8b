"""GPTQ engines (options.engine): each engine's own options and bit widths, refused with the
engine that has them named; a missing engine refused before any model is resolved or loaded.
The refusals need no GPTQModel: all happen before it would be imported; the Gemma 3 run needs it
(make test installs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_extra

ROOT = Path(__file__).resolve().parents[2]


def quantkit(*args: str, cwd: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """``quantkit`` in a process of its own; ``prelude`` runs first in that process."""
    code = f"{prelude}\nfrom quantkit.cli import main\nraise SystemExit(main({list(args)!r}))\n"
    env = {**os.environ, "QUANTKIT_RUNS_DIR": str(cwd / "runs"), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


CASES = {
    "llm-compressor option with gptqmodel": (
        ["gptq-w4a16-g128-gptqmodel", "--set", "options.block_size=64"],
        [
            "error: gptq-w4a16-g128-gptqmodel.yaml: options.block_size is an option of the GPTQ engine "
            "llmcompressor, not of gptqmodel",
            "hint: remove options.block_size, or set options.engine=llmcompressor",
        ],
    ),
    "gptqmodel option with llm-compressor": (
        ["gptq-w4a16-g64", "--set", "options.damp_percent=0.1"],
        [
            "error: gptq-w4a16-g64.yaml: options.damp_percent is an option of the GPTQ engine gptqmodel, "
            "not of llmcompressor",
            "hint: remove options.damp_percent, or set options.engine=gptqmodel",
        ],
    ),
    "bits only gptqmodel does": (
        ["gptq-w4a16-g64", "--set", "options.bits=2"],
        [
            "error: gptq-w4a16-g64.yaml: options.bits=2: the GPTQ engine llmcompressor quantizes to "
            "3, 4 or 8 bits",
            "hint: set options.engine=gptqmodel",
        ],
    ),
    "bits no engine does": (
        ["gptq-w4a16-g128-gptqmodel", "--set", "options.bits=5"],
        [
            "error: gptq-w4a16-g128-gptqmodel.yaml: options.bits=5: the GPTQ engine gptqmodel quantizes "
            "to 2, 3, 4 or 8 bits",
            "hint: use options.bits 2, 3, 4 or 8",
        ],
    ),
    "unknown engine": (
        ["gptq-w4a16-g64", "--set", "options.engine=gptqmodle"],
        [
            "error: gptq-w4a16-g64.yaml: unknown GPTQ engine (options.engine) 'gptqmodle'",
            "hint: did you mean 'gptqmodel'?",
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_option_or_bits_of_another_engine_is_refused_naming_it(case: str, tmp_path: Path) -> None:
    args, expected = CASES[case]
    result = quantkit("quantize", *args, "--model", str(tmp_path / "no-model"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-2:] == expected
    assert not (tmp_path / "runs").exists()


def test_a_missing_engine_is_refused_before_the_model_is_resolved(tmp_path: Path) -> None:
    """Simulates GPTQModel not being installed by making its import fail in the process
    (``sys.modules['gptqmodel'] = None``: ``import gptqmodel`` raises ImportError and
    ``importlib.util.find_spec`` finds nothing, as where it is absent; its distribution metadata
    may still be installed). The model path does not exist: the engine is checked first."""
    prelude = "import sys\nsys.modules['gptqmodel'] = None"
    model = tmp_path / "no-model"
    result = quantkit(
        "quantize", "gptq-w4a16-g128-gptqmodel", "--model", str(model), cwd=tmp_path, prelude=prelude
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-2:] == [
        "error: GPTQModel is not installed (options.engine: gptqmodel)",
        "hint: pip install 'quantkit[gptqmodel]'",
    ]
    assert not (tmp_path / "runs").exists()
    # the same command with the llm-compressor engine gets as far as the model
    result = quantkit("quantize", "gptq-w4a16-g64", "--model", str(model), cwd=tmp_path, prelude=prelude)
    assert result.returncode == 2 and f"error: model '{model}' not found" in result.stderr


def test_each_engine_validates_to_its_own_options() -> None:
    from quantkit.backends.gptq import GPTQBackend
    from quantkit.backends.gptq_gptqmodel import GPTQModelBackend
    from quantkit.inputs.recipe import load_recipe

    recipe = load_recipe("gptq-w4a16-g128-gptqmodel", [])
    backend = recipe.backend()
    assert type(backend) is GPTQModelBackend and backend.library == "gptqmodel"
    assert recipe.options["engine"] == "gptqmodel" and "block_size" not in recipe.options
    assert backend.options.quantize_config() == {  # type: ignore[attr-defined]
        "bits": 4, "group_size": 128, "sym": True, "desc_act": False, "act_group_aware": True,
        "damp_percent": 0.05, "damp_auto_increment": 0.01, "static_groups": False,
        "true_sequential": True, "mse": 0.0,
    }  # fmt: skip
    default = load_recipe("gptq-w4a16-g64", [])
    assert type(default.backend()) is GPTQBackend and default.options["engine"] == "llmcompressor"


def test_the_method_column_names_the_engine_that_ran() -> None:
    from conftest import synthetic_record

    from quantkit.report.table import method_label

    manifest = synthetic_record("q4", "W4A16-g64", {"kld_mean": 0.2}, {"ppl": 20.0}).manifest
    assert "engine" not in manifest.recipe.options and method_label(manifest) == "gptq"
    for engine in ("gptqmodel", "llmcompressor"):
        ran = manifest.model_copy(
            update={"artifact": manifest.artifact.model_copy(update={"details": {"engine": engine}})}
        )
        assert method_label(ran) == f"gptq ({engine})"
    resolved = manifest.model_copy(
        update={"recipe": manifest.recipe.model_copy(update={"options": {"engine": "llmcompressor"}})}
    )
    assert method_label(resolved) == "gptq (llmcompressor)"  # a run made before the engine was recorded


def test_gptqmodel_quantizes_gemma3_and_keeps_its_per_layer_type_rope(tmp_path: Path) -> None:
    """GPTQModel 7.6's RoPE shim for transformers 5 runs ``standardize_rope_params`` on Gemma 3's
    config while loading it, which adds top-level ``rope_type``/``rope_theta`` beside the per
    layer-type entries; transformers then refused to save the quantized model's config
    ("'str' object has no attribute 'get'"), so GPTQModel failed on every Gemma 3. A two-layer
    random Gemma 3 (one sliding-window layer, one global): the run succeeds and the saved config
    keeps exactly the source's RoPE parameters. ~30 s."""
    require_extra("gptqmodel", "gptqmodel")
    from quantkit.util.testing import make_tiny_gemma3

    model = make_tiny_gemma3(tmp_path / "tiny-gemma3")
    source = json.loads((model / "config.json").read_text())["rope_parameters"]
    out = tmp_path / "q"
    result = quantkit(
        "quantize", "gptq-w4a16-g128-gptqmodel", "--model", str(model), "--out", str(out),
        "--set", "options.group_size=32",
        "--set", "calibration.num_samples=4", "--set", "calibration.seq_len=64",
        "--set", "eval.num_windows=2", "--set", "eval.seq_len=64", "--set", "gates.max_kld_mean=null",
        "--device", "cpu", "--no-bench", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    saved = json.loads((out / "artifact" / "config.json").read_text())
    assert saved["rope_parameters"] == source
    assert saved["quantization_config"]["bits"] == 4 and saved["quantization_config"]["group_size"] == 32
