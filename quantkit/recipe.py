"""Recipes: pydantic models (extra="forbid"), YAML load/dump and ``--set key=value`` overrides."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantkit.bench_spec import BenchSpec
from quantkit.errors import RecipeError
from quantkit.lm_eval_spec import EvalEntry
from quantkit.paths import recipes_dir
from quantkit.registry import did_you_mean, get_backend

MAX_RECIPE_BYTES = 1_000_000


class StrictModel(BaseModel):
    """Base for every recipe section: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")


class TextSource(StrictModel):
    """Where text comes from: ``builtin``, a local ``.txt``/``.jsonl`` file, or ``hf:<dataset>``."""

    source: str = "builtin"
    text_field: str = Field("text", description="field holding the text in .jsonl / HF datasets")
    split: str = Field("train", description="HF dataset split")
    subset: str | None = Field(None, description="HF dataset configuration name")


class CalibrationSpec(TextSource):
    """Calibration tokens: ``num_samples`` windows of ``seq_len`` tokens, sampled with ``seed``."""

    num_samples: int = Field(32, ge=1, le=100_000)
    seq_len: int = Field(256, ge=8, le=131_072)
    seed: int = 0
    chat_template: bool = Field(False, description="render each document as a user turn of the chat template")


class EvalSpec(TextSource):
    """Evaluation windows: the first ``num_windows`` windows of ``seq_len`` tokens of the text."""

    num_windows: int = Field(24, ge=1, le=100_000)
    seq_len: int = Field(512, ge=8, le=131_072)
    top_k: int = Field(32, ge=1, le=1024, description="baseline log-probs kept per position for KLD")
    batch_size: int = Field(4, ge=1, le=1024)


class GateSpec(StrictModel):
    """Thresholds a run must meet (``max_*``/``min_*``; a missing metric fails its check) plus
    the significance options. Relative to the baseline: ``max_ppl_increase_pct``,
    ``min_top1_pct``, ``min_task_recovery_pct`` and the ``*_ratio`` fields; absolute:
    ``max_kld``, ``max_kld_p99`` (nats) and ``max_peak_memory_bytes``."""

    max_kld: float | None = Field(None, ge=0, description="max mean KL-divergence (nats)")
    max_kld_p99: float | None = Field(None, ge=0, description="max 99th-percentile KLD (nats)")
    max_ppl_increase_pct: float | None = Field(None, description="max perplexity increase, %")
    min_top1_pct: float | None = Field(None, ge=0, le=100, description="min top-1 agreement, %")
    min_task_recovery_pct: float | None = Field(
        None, ge=0, description="min task score recovered, % of the baseline's"
    )
    min_decode_speed_ratio: float | None = Field(None, ge=0, description="min decode speed / baseline's")
    min_prefill_speed_ratio: float | None = Field(None, ge=0, description="min prefill speed / baseline's")
    max_peak_memory_bytes: int | None = Field(None, ge=0, description="max peak memory, bytes")
    max_memory_ratio: float | None = Field(None, ge=0, description="max peak memory / baseline's")
    require_significance: bool = Field(
        False, description="judge KLD, ppl and top-1 by bootstrap intervals over the eval windows"
    )
    strict_inconclusive: bool = Field(
        False, description="with require_significance: an interval straddling a threshold fails"
    )
    confidence: float = Field(0.95, gt=0, lt=1, description="confidence level of the intervals")
    bootstrap_samples: int = Field(2000, ge=100, le=1_000_000, description="bootstrap resamples")
    seed: int = Field(0, description="seed of the bootstrap resampling")

    def is_empty(self) -> bool:
        """True when no threshold (``max_*``/``min_*``) is set; the options do not count."""
        return all(
            getattr(self, name) is None
            for name in type(self).model_fields
            if name.startswith(("max_", "min_"))
        )


class Recipe(StrictModel):
    """A complete, validated quantization recipe."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    method: str
    options: dict[str, Any] = Field(default_factory=dict)
    model: str | None = Field(None, description="HF folder, hub id or 'smollm2-135m' (default)")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 0
    calibration: CalibrationSpec | None = Field(default_factory=CalibrationSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    gates: GateSpec = Field(default_factory=GateSpec)
    bench: BenchSpec = Field(default_factory=BenchSpec)
    evals: list[EvalEntry] = Field(default_factory=list, description="extra evaluations (lm-eval tasks)")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _model_for(loc: tuple[Any, ...]) -> type[BaseModel] | None:
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


def _format_validation_error(
    err: ValidationError, prefix: tuple[Any, ...] = (), owner: type[BaseModel] | None = None
) -> RecipeError:
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


def validate_recipe(data: Any) -> Recipe:
    """Validate a raw mapping into a Recipe, including the method's own typed options."""
    if not isinstance(data, dict):
        raise RecipeError("a recipe must be a YAML mapping", "see recipes/ for examples")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        raise _format_validation_error(err) from None
    backend = get_backend(recipe.method)
    try:
        options = backend.Options.model_validate(recipe.options)
    except ValidationError as err:
        raise _format_validation_error(err, ("options",), backend.Options) from None
    backend.check_recipe(options, recipe)
    return recipe.model_copy(update={"options": options.model_dump(mode="json")})


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

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not allowed in quantkit files", mark
            )
        return super().compose_node(parent, index)


def read_yaml(path: Path, what: str, max_bytes: int = MAX_RECIPE_BYTES) -> Any:
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


def load_raw(path: Path) -> dict[str, Any]:
    """Read a recipe file into a plain mapping (no validation yet)."""
    data = read_yaml(path, "recipe")
    if data is None:
        raise RecipeError(f"{path}: recipe is empty", "see recipes/ for examples")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping", "see recipes/ for examples")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML scalars) to a raw recipe."""
    result = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw_value = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"bad override '{item}'", "use --set key=value, e.g. eval.seq_len=256")
        try:
            value = yaml.safe_load(raw_value) if raw_value.strip() else ""
        except yaml.YAMLError:
            value = raw_value
        node: Any = result
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
    path = resolve_recipe_path(ref)
    data = apply_overrides(load_raw(path), overrides or [])
    try:
        return validate_recipe(data)
    except RecipeError as err:
        raise RecipeError(f"{path.name}: {err.message}", err.hint) from None
