"""`quantkit gate RUN`: exit 0 when every threshold holds, 1 when one fails."""

from __future__ import annotations

from pathlib import Path

import typer

from quantkit.cli.common import FormatOption
from quantkit.cli.output import OutputFormat, emit_json, stderr, stdout
from quantkit.errors import UserInputError


def _percent(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value.strip().rstrip("%"))
    except ValueError:
        raise UserInputError(f"{name}: '{value}' is not a number", f"e.g. {name} 5%") from None


def gate(
    run: Path = typer.Argument(..., help="run folder made by quantkit quantize"),
    max_kld: float | None = typer.Option(None, "--max-kld", help="max mean KLD (nats)"),
    max_kld_p99: float | None = typer.Option(None, "--max-kld-p99", help="max p99 KLD (nats)"),
    max_ppl_increase: str | None = typer.Option(
        None, "--max-ppl-increase", help="max perplexity increase, e.g. 5%"
    ),
    min_top1: str | None = typer.Option(None, "--min-top1", help="min top-1 agreement, e.g. 90%"),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Check a run against thresholds (from the flags, else from its recipe's gates)."""
    from quantkit.gate import evaluate_gate
    from quantkit.recipe import GateSpec
    from quantkit.store import load_run

    record = load_run(run)
    spec = GateSpec(
        max_kld=max_kld,
        max_kld_p99=max_kld_p99,
        max_ppl_increase_pct=_percent(max_ppl_increase, "--max-ppl-increase"),
        min_top1_pct=_percent(min_top1, "--min-top1"),
    )
    if spec.is_empty():
        spec = GateSpec.model_validate(record.manifest.get("recipe", {}).get("gates") or {})
    if spec.is_empty():
        raise UserInputError(
            "no thresholds to check",
            "pass e.g. --max-kld 0.05 --max-ppl-increase 5% or declare gates in the recipe",
        )
    quantized = record.manifest.get("metrics", {}).get("quantized", {})
    metrics = {name: entry.get("value") for name, entry in quantized.items()}
    result = evaluate_gate(spec, metrics)
    if output_format == OutputFormat.json:
        emit_json({"run": str(run), **result.to_dict()})
    else:
        for check in result.checks:
            colour = "green" if check.passed else "red"
            stdout.print(f"[{colour}]{'PASS' if check.passed else 'FAIL'}[/{colour}] {check.describe()}")
        verdict = (
            "[green]gate passed[/green]"
            if result.passed
            else f"[red]gate failed: {len(result.failures)} check(s)[/red]"
        )
        stderr.print(verdict)
    if not result.passed:
        raise typer.Exit(1)
