"""Recipes: pydantic models (extra="forbid"), YAML load/dump and ``--set key=value`` overrides."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import yaml
from pydantic import BaseModel, Field, JsonValue, ValidationError

from quantkit.backends import get_backend
from quantkit.errors import RecipeError
from quantkit.inputs.specs import (
    BaselineSpec,
    BenchSpec,
    CalibrationSpec,
    EvalEntry,
    EvalSpec,
    GateSpec,
    StrictModel,
)
from quantkit.paths import recipes_dir
from quantkit.registry import did_you_mean

if TYPE_CHECKING:
    from quantkit.backends.base import Backend, BackendOptions

MAX_RECIPE_BYTES = 1_000_000
M = TypeVar("M", bound=BaseModel)


class Recipe(StrictModel):
    """A complete, validated quantization recipe."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    method: str
    options: dict[str, JsonValue] = Field(default_factory=dict)
    model: str | None = Field(None, description="HF folder, hub id or 'smollm2-135m' (default)")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 0
    calibration: CalibrationSpec | None = Field(default_factory=CalibrationSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    baseline: BaselineSpec = Field(default_factory=BaselineSpec)
    gates: GateSpec = Field(default_factory=GateSpec)
    bench: BenchSpec = Field(default_factory=BenchSpec)
    evals: list[EvalEntry] = Field(default_factory=list, description="extra evaluations (lm-eval tasks)")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def backend(self) -> Backend[BackendOptions]:
        """This recipe's backend with its options validated (the recipe was validated already)."""
        return get_backend(self.method).from_raw(self.options)


def _model_for(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for did-you-mean on unknown fields)."""
    model: type[BaseModel] = Recipe
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        for arg in getattr(annotation, "__args__", ()):  # Optional[Section]
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                annotation = arg
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def format_validation_error(
    err: ValidationError, prefix: tuple[str | int, ...] = (), owner: type[BaseModel] | None = None
) -> RecipeError:
    """The first problem of a pydantic error as a one-line RecipeError naming the field."""
    first = err.errors()[0]
    loc = prefix + tuple(first["loc"])
    where = ".".join(str(part) for part in loc) or "recipe"
    if first["type"] == "extra_forbidden":
        parent = owner if owner is not None else _model_for(loc)
        fields = sorted(parent.model_fields) if parent else []
        hint = did_you_mean(str(loc[-1]), fields) if fields else "remove it"
        return RecipeError(f"unknown field '{where}'", hint)
    if first["type"] == "missing":
        return RecipeError(f"missing required field '{where}'", "see `quantkit recipes show`")
    value = first.get("input")
    shown = repr(value) if not isinstance(value, dict) else "a mapping"
    more = f" ({len(err.errors()) - 1} more problem(s))" if len(err.errors()) > 1 else ""
    return RecipeError(
        f"invalid value for '{where}': {first['msg']} (got {shown}){more}",
        "fix the value in the recipe or with --set",
    )


def validate_section(
    model: type[M], data: Mapping[str, JsonValue], where: str, flags: Mapping[str, str] | None = None
) -> M:
    """Validate one recipe section; a bad value that came from a command-line flag is an error
    naming the flag (``flags``: field -> flag), any other one names the recipe field."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as err:
        first = err.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        flag = (flags or {}).get(field)
        if flag is None:
            raise format_validation_error(err, (where,), model) from None
        raise RecipeError(
            f"invalid value for {flag}: {first['msg']} (got {first.get('input')!r})",
            f"fix the value of {flag}",
        ) from None


def validate_recipe(data: object) -> Recipe:
    """Validate a raw mapping into a Recipe, including the method's own typed options."""
    if not isinstance(data, dict):
        raise RecipeError("a recipe must be a YAML mapping", "see recipes/ for examples")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        raise format_validation_error(err) from None
    backend_cls = get_backend(recipe.method)
    try:
        backend = backend_cls.from_raw(recipe.options)
    except ValidationError as err:
        raise format_validation_error(err, ("options",), backend_cls.options_model) from None
    backend.check_options()
    _check_runtime(recipe.eval.runtime)
    if backend.requires_calibration() and recipe.calibration is None:
        raise RecipeError(
            f"method '{recipe.method}' with these options needs calibration data, but calibration is null",
            "remove 'calibration: null' (the built-in set is the default) or give a source",
        )
    return recipe.model_copy(update={"options": backend.options.model_dump(mode="json")})


def _check_runtime(name: str | None) -> None:
    from quantkit.runtimes import RUNTIMES

    if name is not None and name not in RUNTIMES:
        raise RecipeError(f"unknown runtime '{name}' in eval.runtime", did_you_mean(name, RUNTIMES.names()))


def option_changes(recipe: Recipe, base: Recipe) -> dict[str, JsonValue]:
    """The method and options in which ``recipe`` differs from ``base`` (its file before
    ``--set`` overrides): what makes the artifact something other than the recipe's name says."""
    changes: dict[str, JsonValue] = {}
    if recipe.method != base.method:
        changes["method"] = recipe.method
    for key, value in recipe.options.items():
        if base.method != recipe.method or base.options.get(key) != value:
            changes[key] = value
    return changes


def run_name(recipe: Recipe, base: Recipe) -> str:
    """The run's display name: the recipe's, plus ``[key=value, ...]`` for changed options."""
    changes = option_changes(recipe, base)
    if not changes:
        return recipe.name
    shown = ", ".join(f"{key}={value}" for key, value in changes.items())
    return f"{recipe.name} [{shown}]"


def resolve_recipe_path(ref: str | Path) -> Path:
    """A recipe file path, or the name of a shipped recipe (``fp8-dynamic``)."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    shipped = recipes_dir() / f"{ref}.yaml"
    if not path.suffix and shipped.is_file():
        return shipped
    if path.exists():
        raise RecipeError(f"recipe '{ref}' is not a file", "give a .yaml recipe file")
    names = [p.stem for p in sorted(recipes_dir().glob("*.yaml"))]
    raise RecipeError(f"recipe '{ref}' not found", did_you_mean(Path(str(ref)).stem, names))


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML loader that refuses aliases, which defeats 'billion laughs' recipes."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not allowed in quantkit files", mark
            )
        return super().compose_node(parent, index)


def read_yaml(path: Path, what: str, max_bytes: int = MAX_RECIPE_BYTES) -> object:
    """Parse a small YAML file safely (no aliases); errors name the file and the line."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise RecipeError(f"{path}: {what} is {size} bytes", f"a {what} is a small YAML file")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text", f"save the {what} as UTF-8") from None
    except OSError as err:
        raise RecipeError(f"{path}: cannot read the {what} ({err.strerror})", "check the path") from None
    try:
        return yaml.load(text, Loader=_NoAliasLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise RecipeError(f"{path}: malformed YAML{where}: {problem}", "fix the YAML") from None


def load_raw(path: Path) -> dict[str, JsonValue]:
    """Read a recipe file into a plain mapping (no validation yet)."""
    data = read_yaml(path, "recipe")
    if data is None:
        raise RecipeError(f"{path}: recipe is empty", "see recipes/ for examples")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping", "see recipes/ for examples")
    return data


def apply_overrides(data: Mapping[str, JsonValue], overrides: list[str]) -> dict[str, JsonValue]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML scalars) to a raw recipe."""
    result = copy.deepcopy(dict(data))
    for item in overrides:
        key, sep, raw_value = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"bad override '{item}'", "use --set key=value, e.g. eval.seq_len=256")
        try:
            value = yaml.safe_load(raw_value) if raw_value.strip() else ""
        except yaml.YAMLError:
            value = raw_value
        node: dict[str, JsonValue] = result
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise RecipeError(f"override '{key}': '{part}' is not a section", "check the key")
            node = child
        node[parts[-1]] = value
    return result


def load_recipe(ref: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Load, override and validate a recipe given by path or shipped name."""
    return load_recipe_and_base(ref, overrides)[0]


def load_recipe_and_base(ref: str | Path, overrides: list[str] | None = None) -> tuple[Recipe, Recipe]:
    """The recipe with ``overrides`` applied, and as its file stands (for ``run_name``)."""
    path = resolve_recipe_path(ref)
    raw = load_raw(path)
    try:
        recipe = validate_recipe(apply_overrides(raw, overrides or []))
        base = validate_recipe(raw) if overrides else recipe
    except RecipeError as err:
        raise RecipeError(f"{path.name}: {err.message}", err.hint) from None
    return recipe, base


def external_recipe(artifact: str, base: str | Path | None, overrides: list[str]) -> Recipe:
    """The recipe of an external artifact's evaluation: the eval, gates, bench and evals of
    the ``base`` recipe (default: the defaults, no gates) around method ``external``."""
    raw: dict[str, JsonValue] = load_raw(resolve_recipe_path(base)) if base is not None else {}
    raw = {key: value for key, value in raw.items() if key not in ("description", "options")}
    raw |= {"name": "external", "method": "external", "options": {"artifact": artifact}, "calibration": None}
    try:
        return validate_recipe(apply_overrides(raw, overrides))
    except RecipeError as err:
        where = f"{resolve_recipe_path(base).name}: " if base is not None else ""
        raise RecipeError(f"{where}{err.message}", err.hint) from None
