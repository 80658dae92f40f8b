"""GGUF recipe validation and the unsupported-architecture refusal (no model conversion)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.cli import main
from quantkit.errors import RecipeError
from quantkit.inputs.recipe import validate_recipe


def test_very_low_bit_types_need_an_imatrix() -> None:
    with pytest.raises(RecipeError, match="IQ2_XXS needs an importance matrix"):
        validate_recipe({"name": "x", "method": "gguf", "options": {"type": "IQ2_XXS"}})
    recipe = validate_recipe({"name": "x", "method": "gguf", "options": {"type": "IQ2_XXS", "imatrix": True}})
    assert recipe.options["imatrix"] is True


def test_unknown_type_is_refused() -> None:
    with pytest.raises(RecipeError, match=r"options\.type"):
        validate_recipe({"name": "x", "method": "gguf", "options": {"type": "Q4_K_XL"}})


def test_imatrix_without_calibration_is_refused() -> None:
    with pytest.raises(RecipeError, match="needs calibration data"):
        validate_recipe({"name": "x", "method": "gguf", "options": {"imatrix": True}, "calibration": None})


def test_unsupported_architecture_is_refused_before_anything_is_written(
    tmp_path: Path, tiny_model: Path, capsys
) -> None:
    require_extra("llama_cpp", "gguf")
    from transformers import OPTConfig, OPTForCausalLM

    folder = tmp_path / "opt"
    config = OPTConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
                       max_position_embeddings=64, word_embed_proj_dim=16)  # fmt: skip
    OPTForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, folder / name)
    out = tmp_path / "out"
    code = main(["quantize", "gguf-q8_0", "--model", str(folder), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "does not support architecture 'OPTForCausalLM'" in err
    assert "LlamaForCausalLM" in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["opt"]
