"""Per-tensor GGUF types refused before anything is written: bad types and patterns at recipe
validation, patterns that name no tensor and types that do not fit a tensor's rows against the
model's own tensors (the tiny Llama: 128-wide hidden rows, 256-wide ffn_down rows, 2 layers,
tied embeddings)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.cli import main
from quantkit.inputs.recipe import validate_recipe
from quantkit.llamacpp.gguf_types import TENSOR_TYPES

require_extra("llama_cpp", "gguf")

TYPES = ", ".join(TENSOR_TYPES)


def write_recipe(folder: Path, model: Path, options: str) -> Path:
    path = folder / "mixed.yaml"
    path.write_text(
        f"name: mixed\nmethod: gguf\nmodel: {model}\ndevice: cpu\noptions:\n{options}\n"
        "eval: {num_windows: 2, seq_len: 32}\nbench: {enabled: false}\n",
        encoding="utf-8",
    )
    return path


def refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[str, str]:
    """Exit 2, one error and its hint as the last two lines of stderr, and nothing written."""
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / "out"
    code = main([*args, "--out", str(out)] if args[0] == "quantize" else list(args))
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and sum(line.startswith("error: ") for line in lines) == 1, err
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: "), err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == before
    return lines[-2], lines[-1]


# options (YAML, indented under `options:`) -> the error line and the hint line
RECIPE_ERRORS = {
    "file type as a tensor type": (
        "  type: Q4_K_M\n  tensor_types: {ffn_down: Q4_K_M}",
        "error: unknown tensor type 'Q4_K_M' in options.tensor_types (pattern 'ffn_down')",
        f"hint: Q4_K_M is a file type (options.type); per-tensor types are ggml's: {TYPES}",
    ),
    "unknown type": (
        "  tensor_types: ['attn_v=Q7_K']",
        "error: unknown tensor type 'Q7_K' in options.tensor_types (pattern 'attn_v')",
        f"hint: per-tensor types are ggml's: {TYPES}",
    ),
    "unknown output type": (
        "  output_tensor_type: q9_0",
        "error: unknown tensor type 'q9_0' in options.output_tensor_type",
        f"hint: per-tensor types are ggml's: {TYPES}",
    ),
    "bad regex": (
        "  tensor_types: {'blk\\.(0|1\\.ffn_down': Q8_0}",
        "error: invalid regular expression 'blk\\.(0|1\\.ffn_down' in options.tensor_types: "
        "missing ), unterminated subpattern at position 5",
        "hint: a pattern is a regular expression searched in llama.cpp's tensor names, "
        "e.g. blk\\.[0-3]\\.ffn_down",
    ),
    "python-only regex": (
        "  tensor_types: {'blk\\.(?P<n>0)\\.ffn_down': Q8_0}",
        "error: 'blk\\.(?P<n>0)\\.ffn_down' in options.tensor_types uses Python-only regex syntax that "
        "llama.cpp's std::regex rejects",
        "hint: use ECMAScript syntax: no (?P<name>...), look-behind, inline flags or \\A / \\Z",
    ),
    "not PATTERN=TYPE": (
        "  tensor_types: [ffn_down]",
        "error: bad entry 'ffn_down' in options.tensor_types",
        "hint: write PATTERN=TYPE (e.g. ffn_down=Q8_0) or a mapping",
    ),
    "unquantized file type": (
        "  type: F16\n  tensor_types: {ffn_down: Q8_0}",
        "error: per-tensor types need a quantized options.type (llama.cpp ignores them for F16)",
        "hint: set options.type to the type of the other tensors, e.g. Q8_0 or Q4_K_M",
    ),
}

NAMES = (
    "token_embd.weight, blk.0.attn_k.weight, blk.0.attn_output.weight, blk.0.attn_q.weight, "
    "blk.0.attn_v.weight, blk.0.ffn_down.weight, blk.0.ffn_gate.weight, blk.0.ffn_up.weight (blk.0 to blk.1)"
)
MODEL_ERRORS = {
    "names no tensor": (
        "  tensor_types: {ffn_dwn: Q8_0}",
        "error: options.tensor_types 'ffn_dwn' names no tensor of this model",
        f"hint: tensor names look like {NAMES} (GGUF names, lower case)",
    ),
    "hf name": (
        "  tensor_types: {'mlp\\.down_proj': Q8_0}",
        "error: options.tensor_types 'mlp\\.down_proj' names no tensor of this model",
        f"hint: tensor names look like {NAMES} (GGUF names, lower case)",
    ),
    "only unquantized tensors": (
        "  tensor_types: {attn_norm: Q8_0}",
        "error: options.tensor_types 'attn_norm' names only tensors llama.cpp keeps unquantized "
        "(blk.0.attn_norm.weight)",
        f"hint: name quantized tensors, e.g. {NAMES}",
    ),
    "shadowed by an earlier pattern": (
        "  tensor_types: {ffn_down: Q8_0, 'blk\\.1\\.ffn_down': Q6_K}",
        "error: options.tensor_types 'blk\\.1\\.ffn_down' sets no tensor: blk.1.ffn_down.weight and the "
        "others it names are taken by options.tensor_types 'ffn_down'",
        "hint: the first matching pattern wins (as in llama-quantize): put the narrower pattern first",
    ),
    "k-quant on 128-wide rows": (
        "  tensor_types: {ffn_down: Q6_K, 'ffn_(up|gate)': Q4_K}",
        "error: options.tensor_types 'ffn_(up|gate)' asks Q4_K for blk.0.ffn_gate.weight (and 3 more), "
        "whose 128-wide rows are not whole 256-weight blocks",
        "hint: use Q5_0 (what llama.cpp would silently write instead) or another type that fits "
        "128-wide rows: Q4_0, IQ4_NL, Q8_0",
    ),
    "token embedding type without fallback": (
        "  token_embedding_type: Q6_K",
        "error: options.token_embedding_type asks Q6_K for token_embd.weight, whose 128-wide rows are not "
        "whole 256-weight blocks",
        "hint: use Q8_0 (what llama.cpp would silently write instead) or another type that fits "
        "128-wide rows: Q4_0, IQ4_NL, Q5_0",
    ),
    "output type of a tied model taken by the embedding type": (
        "  output_tensor_type: Q8_0\n  token_embedding_type: Q8_0",
        "error: options.output_tensor_type applies to no tensor of this model",
        "hint: a tied output.weight is token_embd.weight, which options.token_embedding_type or a "
        "tensor_types pattern takes first; remove one of them",
    ),
    "i-quant without an imatrix": (
        "  tensor_types: {ffn_down: IQ2_XS}",
        "error: options.tensor_types 'ffn_down' asks IQ2_XS for blk.0.ffn_down.weight, which llama.cpp "
        "quantizes only with an importance matrix",
        "hint: set options.imatrix=true (computed from the calibration set) or pick another type",
    ),
}


@pytest.mark.parametrize("case", list(RECIPE_ERRORS) + list(MODEL_ERRORS))
def test_bad_per_tensor_types_are_refused_before_anything_is_written(
    case: str, tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options, error, hint = (RECIPE_ERRORS | MODEL_ERRORS)[case]
    recipe = write_recipe(tmp_path, tiny_model, options)
    if case in RECIPE_ERRORS:  # found while loading the file, which the error names
        error = error.replace("error: ", "error: mixed.yaml: ", 1)
    assert refused(capsys, tmp_path, "quantize", str(recipe)) == (error, hint)


@pytest.mark.parametrize("case", ["names no tensor", "k-quant on 128-wide rows"])
def test_plan_refuses_them_too(
    case: str, tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options, error, hint = MODEL_ERRORS[case]
    recipe = write_recipe(tmp_path, tiny_model, options)
    assert refused(capsys, tmp_path, "plan", str(recipe), "--device-name", "l4") == (error, hint)


def test_both_spellings_resolve_to_one_ordered_mapping_of_upper_case_types() -> None:
    as_list = ["blk\\.0\\.ffn_down=q8_0", "ffn_down=Q6_k", "attn_v=iq4_nl"]
    as_mapping = {"blk\\.0\\.ffn_down": "Q8_0", "ffn_down": "Q6_K", "attn_v": "IQ4_NL"}
    for given in (as_list, as_mapping):
        options = {"type": "Q4_K_M", "tensor_types": given, "output_tensor_type": "q8_0"}
        recipe = validate_recipe({"name": "x", "method": "gguf", "options": options})
        assert list(recipe.options["tensor_types"].items()) == list(as_mapping.items())  # type: ignore[union-attr]
        assert recipe.options["output_tensor_type"] == "Q8_0"
        assert recipe.backend().describe() == ("Q4_K_M+overrides", 4.89)


def test_plain_recipes_keep_their_scheme() -> None:
    recipe = validate_recipe({"name": "x", "method": "gguf", "options": {"type": "Q4_K_M"}})
    assert recipe.options["tensor_types"] == {} and recipe.options["token_embedding_type"] is None
    assert recipe.backend().describe() == ("Q4_K_M", 4.89)


def test_the_option_types_are_the_planned_types_and_ggml_knows_them() -> None:
    from typing import get_args

    import gguf

    from quantkit.backends.gguf import TensorType

    assert set(get_args(TensorType)) == set(TENSOR_TYPES)
    assert all(gguf.GGMLQuantizationType[name].name == name for name in TENSOR_TYPES)
