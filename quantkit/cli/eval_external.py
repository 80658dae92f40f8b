"""`quantkit eval --baseline MODEL ARTIFACT...`: artifacts quantkit did not make (a hub GGUF,
another tool's quant, another run), each stored as a run of kind ``external`` with the same
metrics, manifest, report and gate as a quantized run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from quantkit.cli.output import OutputFormat, RichReporter, TableView, emit_json, print_comparison, stderr
from quantkit.errors import UserInputError

if TYPE_CHECKING:
    from quantkit.inputs.recipe import Recipe
    from quantkit.inputs.specs import LmEvalSpec


@dataclass
class ExternalEvalRequest:
    """What ``quantkit eval --baseline`` was asked."""

    baseline: str
    artifacts: list[Path]
    recipe: str | None = None
    overrides: list[str] = field(default_factory=list)
    lm_eval: LmEvalSpec | None = None
    out: Path | None = None
    names: list[str] = field(default_factory=list)  # display names, one per artifact
    bench: bool = False
    overwrite: bool = False
    device: str | None = None
    allow_implausible_baseline: bool = False
    verbose: bool = False


def _recipes(request: ExternalEvalRequest) -> list[tuple[Recipe, str]]:
    """Each artifact's recipe and display name; every artifact is recognised (and refused if
    it cannot be evaluated) before anything runs."""
    from quantkit.inputs.external import display_names, inspect_external
    from quantkit.inputs.recipe import external_recipe
    from quantkit.inputs.specs import EvalEntry

    count = len(request.artifacts)
    if count > 1 and request.out is not None:
        raise UserInputError(f"--out names one run, but {count} artifacts were given",
                             "evaluate them one at a time, or drop --out")  # fmt: skip
    if request.names and len(request.names) != count:
        raise UserInputError(
            f"{len(request.names)} --name for {count} artifact{'s' if count > 1 else ''}",
            "give --name once per artifact, in the same order, or not at all",
        )
    planned = []
    artifacts = [inspect_external(path) for path in request.artifacts]
    names = request.names or display_names(artifacts)
    for path, name in zip(request.artifacts, names, strict=True):
        recipe = external_recipe(str(path.expanduser().resolve()), request.recipe, request.overrides)
        if request.lm_eval is not None:
            recipe = recipe.model_copy(update={"evals": [*recipe.evals, EvalEntry(lm_eval=request.lm_eval)]})
        planned.append((recipe, name))
    return planned


def evaluate_external(request: ExternalEvalRequest, output_format: OutputFormat, view: TableView) -> None:
    """Evaluate each artifact against the baseline; exit 1 when a gate fails."""
    from quantkit.report import table
    from quantkit.run.pipeline import QuantizeRequest, run_quantize

    human = output_format == OutputFormat.human
    results = []
    for recipe, name in _recipes(request):
        if human:
            shown = f"[cyan]{escape(name)}[/cyan] against {escape(request.baseline)}"
            stderr.print(f"[bold]quantkit[/bold] evaluating {shown}")
        quantize_request = QuantizeRequest(
            recipe=recipe,
            model=request.baseline,
            out=request.out,
            overwrite=request.overwrite,
            device=request.device,
            bench=request.bench,
            name=name,
            allow_implausible_baseline=request.allow_implausible_baseline,
            verbose=request.verbose,
        )
        results.append(run_quantize(quantize_request, RichReporter() if human else None))
    if human:
        comparison = table.build([result.record for result in results])
        print_comparison(comparison, view)
        for result in results:
            stderr.print(f"run saved to [bold]{escape(str(result.record.path))}[/bold]")
            for check in result.gate.checks if result.gate is not None else []:
                colour = "green" if check.passed else "red"
                stderr.print(f"  gate [{colour}]{escape(check.describe())}[/{colour}]")
    else:
        emit_json(
            [
                {"run": str(result.record.path), "manifest": result.record.manifest.model_dump(mode="json")}
                for result in results
            ]
        )
    if any(result.gate is not None and not result.gate.passed for result in results):
        raise typer.Exit(1)
