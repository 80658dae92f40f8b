"""The comparison: runs grouped by their baseline, one baseline row per group, as plain data.

Runs share a baseline when they were measured against the same model (fingerprint), on the
same device, on the same eval tokens (hash) and with the same baseline precision; each row's
deltas and ratios are against its own group's baseline row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import JsonValue

from quantkit import __version__
from quantkit.metrics import METRICS, format_metric
from quantkit.results.store import RunRecord
from quantkit.serving.record import ServeSide

if TYPE_CHECKING:
    from quantkit.results.manifest import Manifest

REPORT_SCHEMA = 2

Row = dict[str, JsonValue]

LEADING_COLUMNS: list[tuple[str, str]] = [
    ("name", "run"),
    ("run_id", "run id"),
    ("method", "method"),
    ("scheme", "scheme"),
    ("weight_bits", "bits (quantized)"),
    ("file_bpw", "bpw (file)"),
    ("disk_bytes", "disk"),
]


def fixed_columns() -> list[tuple[str, str]]:
    """(key, heading) of the columns every report has: the run's identity, the metrics
    registered as always shown, and the quantization time."""
    shown = [(info.name, info.column or info.name) for info in METRICS.columns() if info.always_shown]
    return [*LEADING_COLUMNS, *shown, ("quantize_s", "quantize s")]


def optional_columns() -> list[tuple[str, str]]:
    """Columns shown only when some row has a value (bench, lm-eval and serving are optional)."""
    shown = [(info.name, info.column or info.name) for info in METRICS.columns() if not info.always_shown]
    return [("convert_s", "convert s"), *shown]


TEXT_KEYS = ("name", "run_id", "method", "scheme")
NOTE = (  # under the Markdown and HTML reports' tables
    "Δppl and KLD are against the unquantized baseline of each group on identical token windows; "
    "KLD is KL(baseline ‖ quantized) in nats per token. bits (quantized): bits per weight of the "
    "quantized layers (the scheme's nominal figure; measured from the file for GGUF); bpw (file): "
    "bits per parameter of the whole file."
)


@dataclass
class Group:
    """Runs measured against one baseline; ``rows[0]`` is that baseline."""

    model: str
    device: str
    baseline_dtype: str
    eval_hash: str
    rows: list[Row]
    warnings: list[str] = field(default_factory=list)

    def title(self) -> str:
        return f"{self.model} on {self.device} ({self.baseline_dtype} baseline, eval {self.eval_hash[:12]})"


@dataclass
class Comparison:
    """Groups of runs, each against its own baseline."""

    groups: list[Group]
    warnings: list[str]

    @property
    def rows(self) -> list[Row]:
        """Every group's rows, in order (each row names its ``group``)."""
        return [row for group in self.groups for row in group.rows]

    def columns(self) -> list[tuple[str, str]]:
        """The fixed columns plus each optional one that some row has a value for."""
        rows = self.rows
        present = [col for col in optional_columns() if any(row.get(col[0]) is not None for row in rows)]
        return fixed_columns() + present

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "schema_version": REPORT_SCHEMA,
            "quantkit_version": __version__,
            "columns": [key for key, _ in self.columns()],
            "rows": list(self.rows),
            "groups": [
                {
                    "model": group.model,
                    "device": group.device,
                    "baseline_dtype": group.baseline_dtype,
                    "eval_hash": group.eval_hash,
                    "runs": len(group.rows) - 1,
                    "warnings": list(group.warnings),
                }
                for group in self.groups
            ],
            "warnings": list(self.warnings),
        }


def baseline_key(record: RunRecord) -> tuple[str, str, str, str]:
    """What makes two runs share a baseline."""
    manifest = record.manifest
    eval_key = (
        manifest.eval.hash if manifest.eval.score == "all" else f"{manifest.eval.hash}:{manifest.eval.score}"
    )
    return (manifest.model.fingerprint, manifest.device, eval_key, manifest.baseline.dtype)


def _baseline_row(record: RunRecord, index: int) -> Row:
    manifest = record.manifest
    params = manifest.model.parameters
    row: Row = {
        "name": "baseline",
        "run_id": None,
        "method": "none",
        "scheme": manifest.baseline.dtype,
        "weight_bits": manifest.baseline.weight_bits,
        "file_bpw": round(8 * manifest.model.disk_bytes / params, 3) if params else None,
        "disk_bytes": manifest.model.disk_bytes,
        "quantize_s": None,
        "convert_s": None,
        "model": manifest.model.spec,
        "group": index,
    }
    baseline = manifest.metrics.values("baseline")
    for info in METRICS.columns():  # the baseline's own figure, or its value against itself
        row[info.name] = baseline.get(info.name) if info.baseline_value is None else info.baseline_value
    if baseline.get("decode_tok_s") is not None:
        row["decode_speed_ratio"] = 1.0  # the baseline against itself
    serve = manifest.serve
    row["serve_levels"] = serve_levels(None if serve is None else serve.baseline)
    return row


def serve_levels(side: ServeSide | None) -> JsonValue:
    """[[level, output tok/s, p95 E2E s, p95 TTFT s], ...] of a served side (None: not served)."""
    if side is None:
        return None
    return [
        [level.label, level.output_tok_s, level.e2e.p95, level.ttft.p95]
        for level in side.levels
        if level.e2e.p95 is not None
    ]


def _conversion_seconds(details: dict[str, JsonValue]) -> float | None:
    """The one-off F16 GGUF conversion inside a GGUF run's quantize stage (None: cached)."""
    source = details.get("source_gguf")
    seconds = source.get("conversion_s") if isinstance(source, dict) else None
    return float(seconds) if isinstance(seconds, (int, float)) else None


def _quantize_seconds(total: float | None, convert: float | None) -> float | None:
    return None if total is None else round(max(total - (convert or 0.0), 0.0), 3)


def method_label(manifest: Manifest) -> str:
    """The method, with the engine that ran it where the method has several (``gptq
    (gptqmodel)``): the artifact's record of it, else the resolved recipe's option; a method
    that is its own engine (``autoround``) is named once."""
    engine = manifest.artifact.details.get("engine") or manifest.recipe.options.get("engine")
    method = manifest.recipe.method
    return f"{method} ({engine})" if isinstance(engine, str) and engine != method else method


def _run_row(record: RunRecord, index: int) -> Row:
    manifest = record.manifest
    artifact = manifest.artifact
    convert = _conversion_seconds(artifact.details)
    quantized = manifest.metrics.values("quantized")
    row: Row = {
        "name": manifest.display_name,
        "run_id": record.name,
        "method": method_label(manifest),
        "scheme": artifact.scheme,
        "weight_bits": artifact.weight_bits,
        "file_bpw": artifact.file_bpw,
        "disk_bytes": artifact.disk_bytes,
        # an external artifact was imported, not quantized here: no quantization time
        "quantize_s": None
        if manifest.kind == "external"
        else _quantize_seconds(manifest.timings.get("quantize_s"), convert),
        "convert_s": convert,
        "path": str(record.path),
        "model": manifest.model.spec,
        "group": index,
        "gate_passed": None if manifest.gate is None else manifest.gate.passed,
        "serve_levels": serve_levels(None if manifest.serve is None else manifest.serve.artifact),
    }
    for info in METRICS.columns():
        row[info.name] = quantized.get(info.name)
    return row


def _implausible(members: list[RunRecord]) -> list[str]:
    """Warnings for a baseline let through the sanity guard and for implausible artifacts."""
    from quantkit.evals.plausibility import artifact_check, plausibility

    baseline = members[0].manifest.metrics.values("baseline")
    base = plausibility(baseline)
    if base is not None and base.failures():
        return [
            f"the baseline is implausible on the eval text ({'; '.join(base.failures())}), let through "
            "with --allow-implausible-baseline: every figure against it is suspect"
        ]
    out = []
    for run in members:
        check = artifact_check(baseline, run.manifest.metrics.values("quantized"))
        if check is not None and check.failures():
            out.append(f"{run.manifest.display_name} is implausible: {'; '.join(check.failures())}")
    return out


def _tokenization_flags(members: list[RunRecord]) -> list[str]:
    """Warnings for artifacts whose own tokenizer cuts the eval text otherwise than the
    baseline's, beyond the run's noise (``quantkit.evals.deployment``)."""
    out = []
    for run in members:
        score = run.manifest.eval.deployment
        if score is not None and score.flagged:
            out.append(
                f"{run.manifest.display_name}: its own tokenizer cuts the eval text otherwise than the "
                f"baseline's ({score.windows_cut_differently} of {score.windows} windows): "
                f"{score.own_bpb:.4f} bits/byte as deployed vs {score.ids_bpb:.4f} on quantkit's ids "
                f"({score.gap_pct:+.1f} %, noise {score.noise_pct:.1f} %): its other figures do not "
                "describe the file as its users run it"
            )
    return out


def _bench_notes(members: list[RunRecord]) -> list[str]:
    """What each run's bench says about its speed figures (a format emulated on this device, a
    memory ratio that could not be taken), named by run."""
    from quantkit.results.manifest import BenchSection

    out = []
    for run in members:
        bench = run.manifest.bench
        if isinstance(bench, BenchSection):
            out += [f"{run.manifest.display_name}: {note}" for note in bench.notes]
    return out


def build(runs: list[RunRecord]) -> Comparison:
    """Group runs by baseline, keep the order they were given in, and warn where a group's
    runs used different library versions."""
    keyed: dict[tuple[str, str, str, str], list[RunRecord]] = {}
    for run in runs:
        keyed.setdefault(baseline_key(run), []).append(run)
    groups: list[Group] = []
    for index, members in enumerate(keyed.values()):
        first = members[0].manifest
        group = Group(
            model=first.model.spec,
            device=first.device,
            baseline_dtype=first.baseline.dtype,
            eval_hash=first.eval.hash,
            rows=[_baseline_row(members[0], index), *(_run_row(run, index) for run in members)],
        )
        for run in members[1:]:
            if run.manifest.environment.libraries != first.environment.libraries:
                group.warnings.append(f"{run.name} used different library versions than {members[0].name}")
        estimators = {run.name: run.manifest.eval.kld_estimator for run in members}
        bounded = [name for name, estimator in estimators.items() if estimator == "top-k+rest"]
        if bounded:
            group.warnings.append(
                f"KLD of {', '.join(bounded)} is the top-k + rest estimate, a lower bound "
                "(~78 % of the full KLD at top_k 32 on SmolLM2; docs/evaluation.md): "
                "not comparable with sampled-tail KLDs"
            )
        group.warnings += _implausible(members)
        group.warnings += _tokenization_flags(members)
        group.warnings += _bench_notes(members)
        bpb = [run.manifest.metrics.values("baseline").get("bpb") for run in members]
        group.rows[0]["bpb"] = next((value for value in bpb if value is not None), None)
        if any(row["task_recovery_pct"] is not None for row in group.rows[1:]):
            group.rows[0]["task_recovery_pct"] = 100.0
        groups.append(group)
    warnings = [text for group in groups for text in group.warnings]
    if len(groups) > 1:
        warnings.insert(
            0,
            f"these runs have {len(groups)} different baselines (model, device, eval tokens or precision): "
            "each is compared with its own baseline row",
        )
    return Comparison(groups=groups, warnings=warnings)


def format_cell(key: str, value: JsonValue) -> str:
    """Human formatting of one table cell (metric columns as the metric registry says)."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if key in METRICS:
        return format_metric(key, float(value), with_unit=False)
    if key == "disk_bytes":
        return f"{value / 1e6:.1f} MB"
    if key in ("weight_bits", "file_bpw"):
        return f"{round(float(value), 2):g}"
    if key in ("quantize_s", "convert_s"):
        return f"{value:.1f}"
    return str(value)
