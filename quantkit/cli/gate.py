"""`quantkit gate RUN...`: exit 0 when every threshold holds for every run, 1 when one fails.

Thresholds are layered field by field: the run's recipe `gates:` < `--gate-file` < flags.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import JsonValue

from quantkit.cli.common import FormatOption
from quantkit.cli.output import OutputFormat, emit_json, print_notes, stderr, stdout
from quantkit.errors import OutputError, RunNotFoundError, UserInputError

if TYPE_CHECKING:
    from quantkit.results.gate import GateResult

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _percent(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value.strip().rstrip("%"))
    except ValueError:
        raise UserInputError(f"{name}: '{value}' is not a number", f"e.g. {name} 5%") from None


def _fraction(value: str | None, name: str) -> float | None:
    """0.95 or 95%."""
    if value is None:
        return None
    text = value.strip()
    number = _percent(text, name)
    return None if number is None else (number / 100 if text.endswith("%") else number)


def _seconds(value: str | None, name: str) -> float | None:
    from quantkit.serving.units import parse_duration

    return None if value is None else parse_duration(value, name)


def _number(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise UserInputError(f"{name}: '{value}' is not a number", f"e.g. {name} 0.05") from None


def _bytes(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", value.lower())
    if not match or match.group(2) not in _BYTE_UNITS:
        raise UserInputError(f"{name}: '{value}' is not a size", f"e.g. {name} 8GB (or bytes, or 7.5GiB)")
    return round(float(match.group(1)) * _BYTE_UNITS[match.group(2)])


_READERS = {
    "number": _number,
    "percent": _percent,
    "fraction": _fraction,
    "seconds": _seconds,
    "bytes": _bytes,
}


def _threshold_value(field: str, text: str | None) -> JsonValue:
    """A threshold flag's text as its gate field's value, read as its metric registers."""
    from quantkit.metrics import METRICS

    bound = next(info.gate for info in METRICS.gated() if info.gate_field == field)
    assert bound is not None
    value = _READERS[bound.value](text, bound.flag)
    return None if value is None else (round(value) if bound.integer else value)


def _threshold_options() -> list[inspect.Parameter]:
    """One ``--max-*``/``--min-*`` option per gated metric of the registry (plug-ins' included)."""
    from quantkit.metrics import METRICS

    return [
        inspect.Parameter(
            info.gate_field,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, info.gate.flag, help=info.gate.help),
            annotation=str | None,
        )
        for info in METRICS.gated()
        if info.gate is not None
    ]


def gate(
    runs: list[Path] = typer.Argument(..., help="run folders made by quantkit quantize", metavar="RUN"),
    gate_file: Path | None = typer.Option(
        None, "--gate-file", help="YAML mapping of gate fields (overrides the recipe's gates; see docs/ci.md)"
    ),
    require_significance: bool | None = typer.Option(
        None,
        "--require-significance/--no-require-significance",
        help="judge KLD, ppl and top-1 by bootstrap intervals: fail only on a clear regression",
    ),
    strict_inconclusive: bool | None = typer.Option(
        None,
        "--strict-inconclusive/--no-strict-inconclusive",
        help="with --require-significance: an interval straddling a threshold fails (default: passes)",
    ),
    confidence: str | None = typer.Option(None, "--confidence", help="interval confidence, e.g. 0.95 or 95%"),
    bootstrap_samples: int | None = typer.Option(None, "--bootstrap-samples", help="bootstrap resamples"),
    seed: int | None = typer.Option(None, "--seed", help="bootstrap seed"),
    junit: Path | None = typer.Option(None, "--junit", help="write a JUnit XML report here"),
    markdown: Path | None = typer.Option(
        None, "--markdown", help="write a Markdown table here (e.g. $GITHUB_STEP_SUMMARY)"
    ),
    output_format: OutputFormat = FormatOption,
    **thresholds: str | None,  # one option per gated metric: _threshold_options
) -> None:
    from quantkit.evals.plausibility import artifact_check
    from quantkit.results.gate import evaluate_gate, load_gate_file, load_windows, resolve_spec
    from quantkit.results.store import load_run

    flags: dict[str, JsonValue] = {
        **{field: _threshold_value(field, text) for field, text in thresholds.items()},
        "require_significance": require_significance,
        "strict_inconclusive": strict_inconclusive,
        "confidence": _fraction(confidence, "--confidence"),
        "bootstrap_samples": bootstrap_samples,
        "seed": seed,
    }
    flags = {key: value for key, value in flags.items() if value is not None}
    file_layer: dict[str, JsonValue] = {}
    if gate_file is not None:
        file_spec = load_gate_file(gate_file)
        file_layer = file_spec.model_dump(include=file_spec.model_fields_set)
        print_notes([f"{gate_file}: {note}" for note in file_spec.deprecation_notes()])

    # Validate every input before evaluating anything: bad input is exit 2, never a half gate.
    for target in (junit, markdown):
        if target is not None and not target.parent.is_dir():
            raise OutputError(f"cannot write '{target}': no folder '{target.parent}'", "create it first")
    plans = []
    for run in runs:
        record = load_run(run)
        recipe_gates = record.manifest.recipe.gates.model_dump(mode="json")
        spec, sources = resolve_spec([("recipe", recipe_gates), ("gate-file", file_layer), ("flag", flags)])
        if spec.is_empty():
            raise UserInputError(
                f"no thresholds to check for '{run}'",
                "pass e.g. --max-kld 0.05 --max-ppl-increase 5% or a --gate-file, or set the recipe's gates",
            )
        windows = load_windows(run)
        if spec.require_significance and windows is None:
            raise RunNotFoundError(
                f"'{run}' has no eval_windows.json: significance needs per-window scores",
                "run quantize again with this quantkit, or drop --require-significance",
            )
        plans.append((run, record, spec, sources, windows))

    results: list[tuple[str, GateResult]] = []
    for run, record, spec, sources, windows in plans:
        quantized = record.manifest.metrics.values("quantized")
        sanity = artifact_check(record.manifest.metrics.values("baseline"), quantized)
        result = evaluate_gate(spec, dict[str, float | None](quantized), windows, sanity)
        for check in result.checks:
            check.source = sources.get(check.field, check.source)
        results.append((str(run), result))

    _write_outputs(results, junit, markdown)
    passed = all(result.passed for _, result in results)
    if output_format == OutputFormat.json:
        emit_json(
            {
                "schema_version": 1,
                "passed": passed,
                "runs": [{"run": label, **result.to_dict()} for label, result in results],
            }
        )
    else:
        _print_table(results)
    from rich.markup import escape

    for label, result in results:
        for note in result.notes:
            stderr.print(f"[yellow]note:[/yellow] {escape(label)}: {escape(note)}")
        for check in result.failures:
            stderr.print(f"[red]✗[/red] {escape(label)}: {escape(check.describe())}")
    failed_runs = [label for label, result in results if not result.passed]
    if failed_runs:
        stderr.print(f"[red]gate failed: {len(failed_runs)} of {len(results)} run(s)[/red]")
        raise typer.Exit(1)
    stderr.print("[green]gate passed[/green]")


_signature = inspect.signature(gate)
_fixed = [param for param in _signature.parameters.values() if param.kind != inspect.Parameter.VAR_KEYWORD]
_options = [param.replace(kind=inspect.Parameter.KEYWORD_ONLY) for param in _fixed[1:]]
gate.__signature__ = _signature.replace(  # type: ignore[attr-defined]
    parameters=[_fixed[0], *_threshold_options(), *_options]
)
gate.__doc__ = (  # built from single-line paragraphs: the help reflows them
    "Check runs against thresholds: each run's recipe gates, overridden field by field by "
    "--gate-file, overridden by the flags. Exit 0 when every check of every run passes, 1 when "
    "one fails, 2 on bad input (see docs/ci.md).\n\n"
    "Relative to the baseline: --max-ppl-increase (% over its perplexity), --min-top1 (% of "
    "positions agreeing with its argmax), --min-task-recovery (% of its task score) and the "
    "*-ratio flags (quantized / baseline). Absolute: --max-kld and --max-kld-p99 (nats of "
    "KL(baseline || quantized)) and --max-peak-memory.\n\n"
    "Served (quantkit bench RUN --endpoint): --max-ttft-p95, --max-tpot-p95, --max-e2e-p95 "
    "(800ms, 0.8s), --min-goodput (0.9 or 90%) and --min-output-tok-s, at the highest load "
    "level measured; any of them also fails the gate when a request failed.\n\n"
    "--require-significance judges KLD, ppl and top-1 by bootstrap intervals over the eval "
    "windows: a check fails only when the whole interval is past the threshold; an interval "
    "straddling it is inconclusive and passes unless --strict-inconclusive."
)


def _write_outputs(results: list[tuple[str, GateResult]], junit: Path | None, markdown: Path | None) -> None:
    from quantkit.results.gate import to_junit, to_markdown
    from quantkit.util.fileio import write_text_atomic

    for target, render in ((junit, to_junit), (markdown, to_markdown)):
        if target is None:
            continue
        try:
            write_text_atomic(target, render(results))
        except OSError as err:
            raise OutputError(f"cannot write '{target}' ({err.strerror})", "pick another path") from None
        stderr.print(f"wrote {target}")


def _print_table(results: list[tuple[str, GateResult]]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from quantkit.results.gate import format_interval, format_threshold, format_value, verdict_label

    table = Table(title="quantkit gate", title_justify="left")
    for column in ("run", "metric", "value", "threshold", "interval", "from", "verdict"):
        table.add_column(column, justify="right" if column in ("value", "threshold") else "left")
    for label, result in results:
        for check in result.checks:
            colour = "green" if check.passed else "red"
            if check.verdict == "inconclusive":
                colour = "yellow"
            table.add_row(
                escape(label),
                check.metric,
                format_value(check.metric, check.value),
                format_threshold(check),
                format_interval(check),
                check.source,
                f"[{colour}]{verdict_label(check)}[/{colour}]",
            )
    stdout.print(table)
