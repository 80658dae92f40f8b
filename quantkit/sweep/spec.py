"""The sweep spec (a YAML file or the command line) and its expansion into named runs.

A sweep is models x recipes x grid points. Each point is one run: a shipped recipe or recipe
file with ``--set``-style overrides (the sweep's shared ``eval``/``calibration``/``bench``/
``gates`` sections first, then the entry's ``set``, then its grid point). Every point is
validated as a recipe before anything runs, so a bad grid key fails the whole sweep up front.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, JsonValue, ValidationError, field_validator

from quantkit.errors import RecipeError
from quantkit.inputs.recipe import Recipe, format_validation_error, load_recipe_and_base, read_yaml, run_name
from quantkit.inputs.specs import StrictModel

Scalar = str | int | float | bool | None


class RecipeEntry(StrictModel):
    """One recipe of the sweep, with its own overrides and grid."""

    recipe: str = Field(description="a shipped recipe name or a recipe file")
    set: dict[str, JsonValue] = Field(default_factory=dict, description="overrides: key.sub -> value")
    grid: dict[str, list[Scalar]] = Field(default_factory=dict, description="key.sub -> values to try")


class RaySpec(StrictModel):
    """Where and how runs go on a Ray cluster."""

    address: str = Field("auto", description="'auto', host:port of the head, or ray://host:10001")
    num_cpus: float | None = Field(None, gt=0, description="CPUs per run (default: 1, or 0 with a GPU)")
    num_gpus: float | None = Field(None, ge=0, description="GPUs per run (default: 1 for CUDA runs)")
    max_retries: int = Field(3, ge=0, description="Ray's retries of a run whose worker died")


class SweepSpec(StrictModel):
    """A sweep: what to quantize, how each run is evaluated, and where runs execute."""

    name: str = Field("sweep", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    models: list[str | None] = Field([None], min_length=1, description="models (default: each recipe's)")
    device: Literal["auto", "cpu", "cuda"] | None = Field(None, description="default: each recipe's")
    recipes: list[RecipeEntry] = Field(min_length=1)
    grid: dict[str, list[Scalar]] = Field(default_factory=dict, description="applied to every recipe")
    set: dict[str, JsonValue] = Field(default_factory=dict, description="overrides for every recipe")
    eval: dict[str, JsonValue] = Field(default_factory=dict, description="eval settings of every run")
    calibration: dict[str, JsonValue] = Field(default_factory=dict, description="shared calibration")
    bench: dict[str, JsonValue] = Field(default_factory=dict, description="bench settings of every run")
    gates: dict[str, JsonValue] = Field(default_factory=dict, description="gates of every run")
    executor: Literal["local", "ray"] = "local"
    jobs: int | None = Field(None, ge=1, description="local runs at once (default: one per GPU, else 1)")
    ray: RaySpec = Field(default_factory=RaySpec)

    @field_validator("recipes", mode="before")
    @classmethod
    def _names_as_entries(cls, value: object) -> object:
        if isinstance(value, list):
            return [{"recipe": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("grid")
    @classmethod
    def _no_empty_axis(cls, grid: dict[str, list[Scalar]]) -> dict[str, list[Scalar]]:
        _check_grid(grid)
        return grid


def _check_grid(grid: dict[str, list[Scalar]]) -> None:
    for key, values in grid.items():
        if not values:
            raise ValueError(f"grid '{key}' has no values")
        if len(set(map(repr, values))) != len(values):
            raise ValueError(f"grid '{key}' repeats a value")


class PlannedRun(BaseModel):
    """One point of the sweep: a validated recipe, its model, and its id inside the sweep."""

    run_id: str
    name: str
    recipe_ref: str
    overrides: list[str]
    model: str | None
    recipe: Recipe


def _read_sweep_file(path: Path) -> dict[str, object]:
    """A sweep file's mapping (``_is_sweep_file`` said it is one)."""
    data = read_yaml(path, "sweep")
    return {str(key): value for key, value in data.items()} if isinstance(data, dict) else {}


def validate_sweep(data: Mapping[str, object], where: str) -> SweepSpec:
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as err:
        problem = format_validation_error(err, owner=_owner(err))
        raise RecipeError(
            f"{where}: {problem.message}", problem.hint.replace("the recipe", "the sweep")
        ) from None


def _owner(err: ValidationError) -> type[BaseModel]:
    loc = err.errors()[0]["loc"]
    if loc[:1] == ("ray",):
        return RaySpec
    if loc[:1] == ("recipes",) and len(loc) > 2:
        return RecipeEntry
    return SweepSpec


def parse_grid(items: list[str]) -> dict[str, list[Scalar]]:
    """``--grid key=v1,v2`` flags as a grid (values parsed as YAML scalars)."""

    grid: dict[str, list[Scalar]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise RecipeError(f"bad grid '{item}'", "use --grid key=v1,v2, e.g. options.group_size=64,128")
        if key in grid:
            raise RecipeError(f"grid '{key}' is given twice", "give each key once, with all its values")
        values = [part.strip() for part in raw.split(",") if part.strip()]
        if not values:
            raise RecipeError(f"grid '{key}' has no values", "list them: --grid key=v1,v2")
        grid[key] = [_scalar(_yaml_value(value)) for value in values]
        try:
            _check_grid({key: grid[key]})
        except ValueError as err:
            raise RecipeError(str(err), "list each value once") from None
    return grid


def _yaml_value(text: str) -> object:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _scalar(value: object) -> Scalar:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _flatten(prefix: str, section: dict[str, JsonValue]) -> list[str]:
    """A shared section as ``prefix.key=value`` overrides (nested mappings become dotted keys)."""
    import json

    items: list[str] = []
    for key, value in section.items():
        if isinstance(value, dict):
            items += _flatten(f"{prefix}.{key}", value)
        else:
            items.append(f"{prefix}.{key}={json.dumps(value)}")
    return items


def _override(key: str, value: JsonValue) -> str:
    import json

    return f"{key}={json.dumps(value)}"


def _point_label(point: dict[str, Scalar]) -> str:
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in point.items())


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", text).strip("-.") or "run"


def expand(spec: SweepSpec) -> list[PlannedRun]:
    """Every (model, recipe, grid point) of the sweep as a validated run, in order."""
    shared = (
        _flatten("eval", spec.eval)
        + _flatten("calibration", spec.calibration)
        + _flatten("bench", spec.bench)
        + _flatten("gates", spec.gates)
        + [_override(key, value) for key, value in spec.set.items()]
        + ([f"device={spec.device}"] if spec.device else [])
    )
    runs: list[PlannedRun] = []
    for model_index, model in enumerate(spec.models):
        for entry in spec.recipes:
            try:
                _check_grid(entry.grid)
            except ValueError as err:
                raise RecipeError(f"recipe '{entry.recipe}': {err}", "list each value once") from None
            grid = spec.grid | entry.grid
            keys = list(grid)
            for values in itertools.product(*(grid[key] for key in keys)):
                point = dict(zip(keys, values, strict=True))
                overrides = shared + [_override(k, v) for k, v in entry.set.items()]
                overrides += [_override(key, value) for key, value in point.items()]
                recipe, base = load_recipe_and_base(entry.recipe, overrides)
                name = recipe.name if not point else f"{recipe.name} [{_point_label(point)}]"
                if not point:
                    name = run_name(recipe, base)
                if len(spec.models) > 1:
                    name = f"{name} @{model_index + 1}"
                run_id = _unique(_slug(name), {run.run_id for run in runs})
                runs.append(
                    PlannedRun(
                        run_id=run_id,
                        name=name,
                        recipe_ref=entry.recipe,
                        overrides=overrides,
                        model=model,
                        recipe=recipe,
                    )
                )
    _refuse_duplicates(runs)
    return runs


def _unique(slug: str, taken: set[str]) -> str:
    run_id, count = slug, 1
    while run_id in taken:
        count += 1
        run_id = f"{slug}-{count}"
    return run_id


def _refuse_duplicates(runs: list[PlannedRun]) -> None:
    seen: dict[str, str] = {}
    for run in runs:
        key = run.recipe.model_dump_json() + f"|{run.model}"
        if key in seen:
            raise RecipeError(
                f"runs '{seen[key]}' and '{run.name}' are the same recipe on the same model",
                "list each recipe (or grid point) once",
            )
        seen[key] = run.name


def _is_sweep_file(item: str) -> bool:
    path = Path(item).expanduser()
    if not (path.is_file() and path.suffix in (".yaml", ".yml")):
        return False
    data = read_yaml(path, "sweep")
    return isinstance(data, dict) and "recipes" in data and "method" not in data


@dataclass(frozen=True)
class SweepFlags:
    """What ``quantkit sweep`` was given beyond its arguments."""

    models: list[str] = field(default_factory=list)
    grid: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    name: str | None = None
    ray: str | None = None
    jobs: int | None = None
    device: str | None = None


def spec_from_command(items: list[str], flags: SweepFlags) -> SweepSpec:
    """The sweep the command line describes: a sweep file, or recipes, plus the flags."""
    import yaml

    models, grid, overrides, name = flags.models, flags.grid, flags.overrides, flags.name
    ray, jobs, device = flags.ray, flags.jobs, flags.device
    sweep_files = [item for item in items if _is_sweep_file(item)]
    if sweep_files and len(items) > 1:
        raise RecipeError(
            f"'{sweep_files[0]}' is a sweep file: give it alone", "list extra recipes inside the sweep file"
        )
    data: dict[str, object]
    if sweep_files:
        path = Path(sweep_files[0]).expanduser()
        data = _read_sweep_file(path)
        data.setdefault("name", _file_name(path))
        where = path.name
    else:
        data = {"recipes": list(items)}
        where = "sweep"
    if name is not None:
        data["name"] = name
    if models:
        data["models"] = list(models)
    if device is not None:
        data["device"] = device
    if jobs is not None:
        data["jobs"] = jobs
    if ray is not None:
        data["executor"] = "ray"
        data["ray"] = {**_section(data, "ray"), "address": ray}
    if grid:
        data["grid"] = {**_section(data, "grid"), **parse_grid(grid)}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"bad override '{item}'", "use --set key=value, e.g. eval.seq_len=256")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw  # as ``quantkit quantize --set``: validation says what is wrong with it
        data["set"] = {**_section(data, "set"), key.strip(): value}
    return validate_sweep(data, where)


def _section(data: Mapping[str, object], key: str) -> dict[str, object]:
    """A mapping section of raw sweep data, to merge flags into (anything else is left for
    validation to refuse)."""
    value = data.get(key)
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _file_name(path: Path) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-.")
    return slug or "sweep"
