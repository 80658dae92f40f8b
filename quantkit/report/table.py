"""The comparison table: one baseline row, then one row per run, as plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantkit import __version__
from quantkit.store import RunRecord

REPORT_SCHEMA = 1

COLUMNS: list[tuple[str, str]] = [
    ("name", "run"),
    ("method", "method"),
    ("scheme", "scheme"),
    ("weight_bits", "bits"),
    ("disk_bytes", "disk"),
    ("ppl", "ppl"),
    ("ppl_increase_pct", "Δppl %"),
    ("kld_mean", "KLD mean"),
    ("kld_p99", "KLD p99"),
    ("top1_agreement_pct", "top-1 %"),
    ("quantize_s", "quantize s"),
]

# Shown only when at least one row has a value (benchmark and lm-eval stages are optional).
OPTIONAL_COLUMNS: list[tuple[str, str]] = [
    ("peak_memory_bytes", "peak mem"),
    ("prefill_tok_s", "prefill tok/s"),
    ("decode_tok_s", "decode tok/s"),
    ("decode_speed_ratio", "decode × base"),
    ("cost_per_mtok_usd", "$/1M tok"),
    ("task_recovery_pct", "lm-eval recovery %"),
]

TEXT_KEYS = ("name", "method", "scheme")


@dataclass
class Comparison:
    """Rows for a set of runs sharing (ideally) one baseline."""

    rows: list[dict[str, Any]]
    warnings: list[str]

    def columns(self) -> list[tuple[str, str]]:
        """The fixed columns plus each optional one that some row has a value for."""
        present = [col for col in OPTIONAL_COLUMNS if any(row.get(col[0]) is not None for row in self.rows)]
        return COLUMNS + present

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": REPORT_SCHEMA,
            "quantkit_version": __version__,
            "columns": [key for key, _ in self.columns()],
            "rows": self.rows,
            "warnings": self.warnings,
        }


def _value(manifest: dict[str, Any], section: str, name: str) -> Any:
    entry = manifest.get("metrics", {}).get(section, {}).get(name)
    return None if entry is None else entry.get("value")


def build(runs: list[RunRecord]) -> Comparison:
    """Build the comparison rows; warn when runs were evaluated against different baselines."""
    warnings: list[str] = []
    first = runs[0].manifest
    base_key = first.get("eval", {}).get("reference_key")
    for run in runs[1:]:
        if run.manifest.get("eval", {}).get("reference_key") != base_key:
            warnings.append(
                f"{run.name} was evaluated on a different model, text or windows than "
                f"{runs[0].name}: its deltas are against its own baseline"
            )
        if run.manifest.get("environment", {}).get("libraries") != first.get("environment", {}).get(
            "libraries"
        ):
            warnings.append(f"{run.name} used different library versions than {runs[0].name}")
    rows = [
        {
            "name": "baseline",
            "method": "none",
            "scheme": first.get("baseline", {}).get("dtype", ""),
            "weight_bits": first.get("baseline", {}).get("weight_bits"),
            "disk_bytes": first.get("model", {}).get("disk_bytes"),
            "ppl": _value(first, "baseline", "ppl"),
            "ppl_increase_pct": 0.0,
            "kld_mean": 0.0,
            "kld_p99": 0.0,
            "top1_agreement_pct": 100.0,
            "quantize_s": None,
            "model": first.get("model", {}).get("spec"),
        }
    ]
    for key, _ in OPTIONAL_COLUMNS:
        rows[0][key] = _value(first, "baseline", key)
    for run in runs:
        manifest = run.manifest
        artifact = manifest.get("artifact", {})
        row = {
            "name": manifest.get("recipe", {}).get("name", run.name),
            "run_id": run.name,
            "method": manifest.get("recipe", {}).get("method"),
            "scheme": artifact.get("scheme"),
            "weight_bits": artifact.get("weight_bits"),
            "disk_bytes": artifact.get("disk_bytes"),
            "quantize_s": manifest.get("timings", {}).get("quantize_s"),
            "path": str(run.path),
        }
        for key in ("ppl", "ppl_increase_pct", "kld_mean", "kld_p99", "top1_agreement_pct"):
            row[key] = _value(manifest, "quantized", key)
        for key, _ in OPTIONAL_COLUMNS:
            row[key] = _value(manifest, "quantized", key)
        gate = manifest.get("gate")
        row["gate_passed"] = None if gate is None else gate.get("passed")
        rows.append(row)
    baseline = rows[0]
    if baseline["decode_speed_ratio"] is None and baseline["decode_tok_s"] is not None:
        baseline["decode_speed_ratio"] = 1.0  # the baseline against itself
    if baseline["task_recovery_pct"] is None and any(row["task_recovery_pct"] is not None for row in rows):
        baseline["task_recovery_pct"] = 100.0
    return Comparison(rows=rows, warnings=warnings)


def format_cell(key: str, value: Any) -> str:
    """Human formatting of one table cell."""
    if value is None:
        return "—"
    if key == "disk_bytes":
        return f"{value / 1e6:.1f} MB"
    if key in ("ppl",):
        return f"{value:.3f}"
    if key in ("ppl_increase_pct", "top1_agreement_pct"):
        return f"{value:+.2f}" if key == "ppl_increase_pct" else f"{value:.2f}"
    if key in ("kld_mean", "kld_p99"):
        return f"{value:.5f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.2e}"
    if key == "weight_bits":
        return f"{value:g}"
    if key == "quantize_s":
        return f"{value:.1f}"
    if key == "peak_memory_bytes":
        return f"{value / 1e9:.2f} GB" if value >= 1e9 else f"{value / 1e6:.1f} MB"
    if key in ("prefill_tok_s", "decode_tok_s"):
        return f"{value:.1f}"
    if key == "decode_speed_ratio":
        return f"{value:.2f}×"
    if key == "cost_per_mtok_usd":
        return f"${value:.4g}"
    if key == "task_recovery_pct":
        return f"{value:.1f}"
    return str(value)
