"""Per-layer integer schemes (``options.overrides``) for the llm-compressor formats, on the tiny
model: config groups in the artifact, each layer stored at its own bits (read back from the
packed weights), the mean bits in the manifest and the plan, a checkpoint plain transformers
loads; and overrides refused before any model loads when they name no layer, overlap, misfit a
layer or go to an engine that lacks them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quantkit.cli import main

TINY_BUDGET = [
    "--set", "calibration.num_samples=4", "--set", "calibration.seq_len=64",
    "--set", "eval.num_windows=4", "--set", "eval.seq_len=64", "--set", "eval.top_k=8",
    "--set", "options.group_size=32", "--device", "cpu", "--no-bench",
]  # fmt: skip
DOWN_0 = "model.layers.0.mlp.down_proj"
# the tiny Llama: 2 layers, hidden 128, intermediate 256 (q/k/v/o 128x128 with 2 kv heads of 32)
ATTENTION_1 = r"re:model\.layers\.1\.self_attn\.(q|o)_proj$"
OVERRIDES = (
    f"options.overrides=[{{targets: [{DOWN_0}], bits: 8}}, {{targets: ['{ATTENTION_1}'], group_size: 16}}]"
)
BITS_ONLY = f"options.overrides=[{{targets: [{DOWN_0}], bits: 8}}]"


def _quantize(recipe: str, model: Path, out: Path, *extra: str) -> int:
    return main(["quantize", recipe, "--model", str(model), "--out", str(out), *TINY_BUDGET, *extra])


def _headers(folder: Path) -> dict[str, list[int]]:
    from quantkit.inputs.plan import tensor_shapes

    return {name: shape for name, (shape, _) in tensor_shapes(folder).items()}


@pytest.fixture(scope="module")
def mixed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """RTN W4 g32 with down_proj of layer 0 at 8 bits and layer 1's q/o projections at group 16,
    beside plain W4 g32 and plain W8 g32."""
    root = tmp_path_factory.mktemp("mixed")
    runs = {}
    for name, extra in {
        "mixed": ["--set", OVERRIDES],
        "w4": [],
        "w8": ["--set", "options.bits=8"],
    }.items():
        assert _quantize("rtn-w4a16-g64", tiny_model, root / name, *extra) == 0
        runs[name] = json.loads((root / name / "manifest.json").read_text()) | {"_path": root / name}
    return runs


def test_each_override_is_a_config_group_of_its_own(mixed: dict) -> None:
    config = json.loads((mixed["mixed"]["_path"] / "artifact" / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    shown = {
        name: (group["targets"], group["weights"]["num_bits"], group["weights"]["group_size"])
        for name, group in groups.items()
    }
    assert shown == {
        "group_0": (["Linear"], 4, 32),
        "group_1": ([DOWN_0], 8, 32),  # the group size it left out is the recipe's
        "group_2": ([ATTENTION_1], 4, 16),
    }


def test_every_layer_is_stored_at_the_bits_it_was_given(mixed: dict, tiny_model: Path) -> None:
    """int32-packed weights hold 32/bits weights per column: 128-wide rows are 16 columns at
    4 bits and 32 at 8; group 16 doubles the scales' columns."""
    stored = _headers(mixed["mixed"]["_path"] / "artifact")
    plain = _headers(mixed["w4"]["_path"] / "artifact")
    assert stored[f"{DOWN_0}.weight_packed"] == [128, 256 * 8 // 32]
    assert plain[f"{DOWN_0}.weight_packed"] == [128, 256 * 4 // 32]
    assert stored["model.layers.1.mlp.down_proj.weight_packed"] == [128, 256 * 4 // 32]
    assert stored["model.layers.1.self_attn.q_proj.weight_scale"] == [128, 128 // 16]
    assert stored["model.layers.1.self_attn.k_proj.weight_scale"] == [64, 128 // 32]  # not named
    assert stored["model.layers.0.self_attn.q_proj.weight_scale"] == [128, 128 // 32]
    record = mixed["mixed"]["artifact"]["details"]["overrides"]
    assert record == [
        {"targets": [DOWN_0], "scheme": "W8A16-g32", "modules": [DOWN_0]},
        {
            "targets": [ATTENTION_1],
            "scheme": "W4A16-g16",
            "modules": ["model.layers.1.self_attn.o_proj", "model.layers.1.self_attn.q_proj"],
        },
    ]


def test_the_manifest_and_the_plan_give_the_layers_mean_bits(mixed: dict, tiny_model: Path, capsys) -> None:
    """Two layers of 7 linears; down_proj of layer 0 (32,768 weights) at 8.5 bits, q/o of
    layer 1 (16,384 each) at 5.0, the rest at 4.5."""
    sizes = {"q": 128 * 128, "k": 64 * 128, "v": 64 * 128, "o": 128 * 128, "gate": 256 * 128, "up": 256 * 128}
    sizes["down"] = 128 * 256
    total = 2 * sum(sizes.values())
    bits = 4.5 * total + (8.5 - 4.5) * sizes["down"] + (5.0 - 4.5) * (sizes["q"] + sizes["o"])
    expected = round(bits / total, 4)
    assert mixed["mixed"]["artifact"]["weight_bits"] == expected
    assert mixed["w4"]["artifact"]["weight_bits"] == 4.5
    assert mixed["mixed"]["artifact"]["scheme"] == "W4A16-g32 + W8A16-g32, W4A16-g16"
    capsys.readouterr()
    args = ["plan", "rtn-w4a16-g64", "--model", str(tiny_model), *TINY_BUDGET[-5:-3], "--format", "json"]
    plans = {}
    for name, extra in {"mixed": ["--set", OVERRIDES], "w4": []}.items():
        assert main([*args, *extra]) == 0
        plans[name] = json.loads(capsys.readouterr().out)
    assert plans["mixed"]["weight_bits"] == expected
    # the bytes the overrides add: 4 more bits on down_proj, half a bit more on q/o
    added = plans["mixed"]["quantized_weights_bytes"] - plans["w4"]["quantized_weights_bytes"]
    assert added == (4 * sizes["down"] + 0.5 * (sizes["q"] + sizes["o"])) // 8
    from quantkit.inputs.plan import tensor_bytes

    stored = {name: tensor_bytes(mixed[name]["_path"] / "artifact") for name in ("mixed", "w4")}
    print(f"overrides add {added} bytes by the plan, {stored['mixed'] - stored['w4']} in the artifacts")
    # exactly, but for the scales: the bits count 16-bit scales, the float32 tiny model stores
    # 32-bit ones (q/o at group 16: 2 x 128 x (8 - 4) more of them, 2 bytes each unaccounted)
    assert stored["mixed"] - stored["w4"] == added + 2 * 128 * (8 - 4) * 2


def test_the_upgraded_layer_brings_the_kld_between_w4_and_w8(mixed: dict) -> None:
    kld = {name: run["metrics"]["quantized"]["kld_mean"]["value"] for name, run in mixed.items()}
    print("KLD:", kld)
    assert kld["w8"] < kld["mixed"] < kld["w4"]


def test_the_mixed_checkpoint_loads_in_plain_transformers(mixed: dict) -> None:
    artifact = mixed["mixed"]["_path"] / "artifact"
    script = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(artifact)!r})\n"
        "out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)\n"
        "assert out.shape == (1, 7) and 'quantkit' not in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_gptq_takes_overrides_too(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _quantize("gptq-w4a16-g128", tiny_model, out, "--set", OVERRIDES, "--set", "gates={}") == 0
    stored = _headers(out / "artifact")
    assert stored[f"{DOWN_0}.weight_packed"] == [128, 256 * 8 // 32]
    assert stored["model.layers.1.self_attn.q_proj.weight_scale"] == [128, 128 // 16]
    errors = json.loads((out / "manifest.json").read_text())["artifact"]["details"]["layer_errors"]
    assert len(errors) == 2 * 7  # GPTQ ran on every layer, the overridden ones included


def test_awq_takes_overrides_of_bits(tiny_model: Path, tmp_path: Path, capsys) -> None:
    """AWQ balances layers sharing an input under one group size: overrides may change bits
    only (a group size of their own failed inside llm-compressor with a shape mismatch)."""
    out = tmp_path / "run"
    assert _quantize("awq-w4a16-g128", tiny_model, out, "--set", BITS_ONLY, "--set", "gates={}") == 0
    assert _headers(out / "artifact")[f"{DOWN_0}.weight_packed"] == [128, 256 * 8 // 32]
    capsys.readouterr()
    assert _quantize("awq-w4a16-g128", tiny_model, tmp_path / "other", "--set", OVERRIDES) == 2
    assert "changes the group size or symmetry, which AWQ" in capsys.readouterr().err


BAD = {
    "a target naming no layer": (
        "options.overrides=[{targets: [model.layers.7.mlp.down_proj], bits: 8}]",
        "name no quantized linear layer",
    ),
    "the output head (kept in full precision)": (
        "options.overrides=[{targets: [lm_head], bits: 8}]",
        "name no quantized linear layer",
    ),
    "two overrides naming one layer": (
        f"options.overrides=[{{targets: [{DOWN_0}], bits: 8}}, {{targets: ['re:.*down_proj'], bits: 3}}]",
        f"both name {DOWN_0}",
    ),
    "a group size that does not divide the layer": (
        f"options.overrides=[{{targets: [{DOWN_0}], group_size: 512}}]",
        "does not divide",
    ),
    "a class name as a target": (
        "options.overrides=[{targets: [Linear], bits: 8}]",
        "looks like a class name",
    ),
    "a broken regular expression": (
        "options.overrides=[{targets: ['re:(layers'], bits: 8}]",
        "not a regular",
    ),
    "bits no format holds": (f"options.overrides=[{{targets: [{DOWN_0}], bits: 5}}]", "overrides"),
    "an unknown field": (f"options.overrides=[{{targets: [{DOWN_0}], bitz: 8}}]", "bitz"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_overrides_exit_2_before_the_model_loads(
    case: str, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setting, message = BAD[case]
    out = tmp_path / "run"
    assert _quantize("rtn-w4a16-g64", tiny_model, out, "--set", setting) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-2].startswith("error: ") and message in lines[-2], lines
    assert lines[-1].startswith("hint: ")
    assert not out.exists()


def test_an_engine_without_overrides_is_refused_naming_the_one_with_them(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setting = f"options.overrides=[{{targets: [{DOWN_0}], bits: 8}}]"
    assert _quantize("gptq-w4a16-g128-gptqmodel", tiny_model, tmp_path / "run", "--set", setting) == 2
    err = capsys.readouterr().err
    assert "options.overrides is an option of the GPTQ engine llmcompressor" in err


def test_a_3_bit_override_is_packed_densely(tiny_model: Path, tmp_path: Path) -> None:
    """compressed-tensors packs 3-bit weights across int32 boundaries: ceil(256 * 3 / 32) = 24
    columns for down_proj's 256-wide rows (not 256 / 10 rounded up, as whole weights per int32)."""
    out = tmp_path / "run"
    setting = f"options.overrides=[{{targets: [{DOWN_0}], bits: 3}}]"
    assert _quantize("rtn-w4a16-g64", tiny_model, out, "--set", setting) == 0
    assert _headers(out / "artifact")[f"{DOWN_0}.weight_packed"] == [128, 24]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["artifact"]["details"]["overrides"][0]["scheme"] == "W3A16-g32"
