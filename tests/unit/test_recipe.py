from __future__ import annotations

from pathlib import Path

import pytest

from quantkit.errors import RecipeError
from quantkit.inputs.recipe import apply_overrides, load_recipe, validate_recipe
from quantkit.paths import recipes_dir

SHIPPED = sorted(recipes_dir().glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_recipes_validate(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    assert recipe.description


def test_shipped_name_resolves_and_fills_defaults() -> None:
    recipe = load_recipe("fp8-dynamic")
    assert recipe.method == "fp8"
    assert recipe.options == {"scheme": "FP8_DYNAMIC", "targets": ["Linear"], "ignore": ["lm_head"]}
    assert recipe.eval.top_k == 32


def test_unknown_top_level_field_suggests_the_right_one() -> None:
    with pytest.raises(RecipeError) as err:
        validate_recipe({"name": "x", "method": "fp8", "calibraton": {}})
    assert "calibraton" in err.value.message
    assert "calibration" in err.value.hint


def test_unknown_nested_field_names_its_path() -> None:
    with pytest.raises(RecipeError) as err:
        validate_recipe({"name": "x", "method": "fp8", "eval": {"num_windos": 3}})
    assert "eval.num_windos" in err.value.message
    assert "num_windows" in err.value.hint


def test_unknown_option_is_checked_against_the_backend_schema() -> None:
    with pytest.raises(RecipeError) as err:
        validate_recipe({"name": "x", "method": "fp8", "options": {"schem": "FP8"}})
    assert "options.schem" in err.value.message
    assert "scheme" in err.value.hint


def test_invalid_option_value() -> None:
    with pytest.raises(RecipeError) as err:
        validate_recipe({"name": "x", "method": "fp8", "options": {"scheme": "FP4"}})
    assert "options.scheme" in err.value.message
    assert "FP4" in err.value.message


def test_wrong_type() -> None:
    with pytest.raises(RecipeError) as err:
        validate_recipe({"name": "x", "method": "fp8", "eval": {"seq_len": "long"}})
    assert "eval.seq_len" in err.value.message


def test_unknown_method_did_you_mean() -> None:
    with pytest.raises(RecipeError) as err:
        validate_recipe({"name": "x", "method": "fp9"})
    assert "fp9" in err.value.message
    assert "fp8" in err.value.hint


def test_missing_name() -> None:
    with pytest.raises(RecipeError, match="missing required field 'name'"):
        validate_recipe({"method": "fp8"})


def test_overrides_parse_yaml_scalars_and_create_sections() -> None:
    data = apply_overrides({"name": "x"}, ["eval.seq_len=128", "options.scheme=FP8", "seed=3"])
    assert data == {"name": "x", "eval": {"seq_len": 128}, "options": {"scheme": "FP8"}, "seed": 3}


def test_override_without_equals_is_refused() -> None:
    with pytest.raises(RecipeError, match="bad override"):
        apply_overrides({}, ["eval.seq_len"])


def test_override_typo_is_caught_by_validation(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"eval\.seqlen"):
        load_recipe("fp8-dynamic", ["eval.seqlen=8"])


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nmethod: [fp8\n", encoding="utf-8")
    with pytest.raises(RecipeError, match=r"malformed YAML at line \d+"):
        load_recipe(path)


def test_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8)
    )
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb, encoding="utf-8")
    with pytest.raises(RecipeError, match="aliases"):
        load_recipe(path)


def test_missing_recipe_suggests_shipped_name() -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe("fp8-dynamik")
    assert "fp8-dynamic" in err.value.hint


def test_recipe_roundtrips_through_yaml(tmp_path: Path) -> None:
    recipe = load_recipe("fp8-static")
    path = tmp_path / "again.yaml"
    path.write_text(recipe.to_yaml(), encoding="utf-8")
    assert load_recipe(path) == recipe
