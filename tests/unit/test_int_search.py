"""The integer (GPTQ) side of sensitivity and search: compressed-tensors' rounding, the group
size, the W8/W4 path's sizes and the recipe options a mix becomes."""

from __future__ import annotations

import pytest
import torch

from quantkit.search.int_format import fake_quantize, group_size_for, int_mix_options, tensor_kind, type_bits
from quantkit.search.mix import build_path, calibrated, recipe_options
from quantkit.search.profile import Profile, TensorScore, UnitScore


@pytest.mark.parametrize(
    ("bits", "group_size", "symmetric"),
    [(4, 64, True), (8, 128, True), (4, None, True), (4, 64, False), (8, 32, False)],
)
def test_fake_quantize_is_compressed_tensors_rounding(
    bits: int, group_size: int | None, symmetric: bool
) -> None:
    """The same values compressed-tensors' own qparams and fake quantization give (symmetric for
    GPTQ, with a zero point for AWQ)."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize as ct_fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    weight = torch.randn(24, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    strategy = "group" if group_size else "channel"
    args = QuantizationArgs(num_bits=bits, symmetric=symmetric, strategy=strategy, group_size=group_size)
    grouped = weight.reshape(24, -1, group_size or 256)
    scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    if not group_size:
        scale, zero = scale.reshape(24, 1), zero.reshape(24, 1)
    expected = ct_fake_quantize(weight, scale, zero, args)
    ours = fake_quantize(weight, bits, group_size, symmetric)
    assert torch.allclose(ours, expected, atol=1e-7, rtol=0)
    levels = ours.reshape(24, -1, group_size or 256)[0, 0].unique().numel()
    assert 2 < levels <= 2**bits


def test_the_group_size_is_the_largest_that_divides_every_width() -> None:
    assert group_size_for([576, 1536]) == 64  # SmolLM2
    assert group_size_for([128, 256]) == 128
    assert group_size_for([96]) == 32
    assert group_size_for([100]) is None


def test_module_names_map_to_the_gguf_profile_units() -> None:
    assert tensor_kind("model.layers.12.self_attn.v_proj") == (12, "attn_v")
    assert tensor_kind("model.language_model.layers.3.mlp.down_proj") == (3, "ffn_down")
    assert tensor_kind("model.layers.0.mlp.experts.router") == (0, "router")  # a class of its own
    assert tensor_kind("lm_head") is None


def _names(layers: int) -> list[str]:
    roles = ("self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    return [f"model.layers.{i}.{role}" for i in range(layers) for role in roles]


def test_a_mix_becomes_gptq_options_naming_each_module_once() -> None:
    """The most common type is the scheme; every other module is named by one override per type,
    a re: target per role listing its layers; compressed-tensors' own matching assigns each
    module exactly the mix's bits."""
    from quantkit.backends.int_weights import IntWeightOptions

    mix = dict.fromkeys(_names(3), "W4") | {
        "model.layers.0.mlp.down_proj": "W8",
        "model.layers.2.mlp.down_proj": "W8",
        "model.layers.0.self_attn.v_proj": "W8",
        "model.layers.1.self_attn.v_proj": "W8",
        "model.layers.2.self_attn.v_proj": "W8",
    }
    options = int_mix_options(mix, 64)
    assert options == {
        "bits": 4,
        "group_size": 64,
        "symmetric": True,
        "overrides": [
            {
                "targets": [
                    r"re:model\.layers\.(0|2)\.mlp\.down_proj$",
                    r"re:model\.layers\.\d+\.self_attn\.v_proj$",
                ],
                "bits": 8,
            }
        ],
    }
    shapes = {f"{name}.weight": ([64, 128], "F16") for name in mix}
    bits = IntWeightOptions.model_validate(options).bits_per_module(shapes)
    assert bits == {name: type_bits(64)[kind] for name, kind in mix.items()}
    assert int_mix_options(dict.fromkeys(_names(2), "W8"), 64) == {
        "bits": 8,
        "group_size": 64,
        "symmetric": True,
    }


def _int_profile() -> Profile:
    """Two layers x (v_proj, down_proj) of 1000 weights; layer 1's down_proj the most sensitive."""
    tensors = [
        TensorScore(
            name=f"model.layers.{layer}.{role}",
            layer=layer,
            kind=kind,
            params=1000,
            width=128,
            proxy={"W8": 0.0, "W4": 1.0 + 10 * layer * (kind == "ffn_down")},
        )
        for layer in (0, 1)
        for role, kind in (("self_attn.v_proj", "attn_v"), ("mlp.down_proj", "ffn_down"))
    ]
    units = [UnitScore(unit="layer 0", kind="layer", tensors=2, params=2000, proxy=2.0)]
    return Profile(model="m", format="gptq", group_size=64, base="W8", low="W4", eval={}, units=units,
                   tensors=tensors, other_params=1000, other_bits=16000.0)  # fmt: skip


def test_the_int_path_runs_from_all_w8_to_all_w4_with_exact_sizes() -> None:
    prof = _int_profile()
    path = build_path(prof, calibrated(prof), seed=0)
    bits = type_bits(64)
    assert bits == {"W8": 8.25, "W4": 4.25}  # one fp16 scale per 64 weights
    assert len(path.steps) == 4 and path.steps[-1].tensor == "model.layers.1.mlp.down_proj"
    assert path.bpw(0) == pytest.approx((4000 * 8.25 + 16000) / 5000)
    assert path.bpw(4) == pytest.approx((4000 * 4.25 + 16000) / 5000)
    method, options = recipe_options(prof, path.mix(3))
    assert method == "gptq"
    assert options["bits"] == 4 and options["overrides"] == [
        {"targets": [r"re:model\.layers\.(1)\.mlp\.down_proj$"], "bits": 8}
    ]


def test_a_gptq_type_is_checked_against_its_own_ladder() -> None:
    from quantkit.errors import RecipeError
    from quantkit.search.profile import check_types

    check_types("W8", "W4", "gptq")
    with pytest.raises(RecipeError, match="--low Q4_0 is not a type the gptq sensitivity profile uses"):
        check_types("W8", "Q4_0", "gptq")
    with pytest.raises(RecipeError, match="--low W8 has no fewer bits than --base W4"):
        check_types("W4", "W8", "gptq")


def test_an_awq_mix_keeps_its_zero_point_and_overrides_bits_only() -> None:
    """AWQ's ladder counts the zero point per group; its options pass AWQ's own check (overrides
    may change bits only) and assign each module the mix's bits."""
    from quantkit.backends.awq import AWQBackend, AWQOptions

    assert type_bits(64, symmetric=False) == {"W8": 8 + 24 / 64, "W4": 4 + 20 / 64}
    mix = dict.fromkeys(_names(2), "W4") | {"model.layers.1.mlp.down_proj": "W8"}
    options = int_mix_options(mix, 64, symmetric=False)
    assert options["symmetric"] is False
    assert options["overrides"] == [{"targets": [r"re:model\.layers\.(1)\.mlp\.down_proj$"], "bits": 8}]
    parsed = AWQOptions.model_validate(options)
    AWQBackend(parsed).check_options()
    shapes = {f"{name}.weight": ([64, 128], "F16") for name in mix}
    assert parsed.bits_per_module(shapes) == {name: type_bits(64, False)[kind] for name, kind in mix.items()}
