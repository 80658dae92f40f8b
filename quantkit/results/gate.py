"""Threshold checks over a run's metrics. A missing metric fails its check; it never passes.

With per-window scores (``eval_windows.json``) the checks on ``kld_mean``, ``ppl_increase_pct``
and ``top1_agreement_pct`` also carry a bootstrap confidence interval. With
``require_significance`` those checks are judged by the interval instead of the point value:

* max check: the whole interval <= threshold passes, the whole interval > threshold fails
  (a clear regression), an interval straddling the threshold is *inconclusive*;
* min check: the mirror image (whole interval >= threshold passes, < threshold fails);
* inconclusive counts as a pass unless ``strict_inconclusive`` is set, then it fails;
* checks without an interval (``kld_p99``, benchmark metrics) compare the point value.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, JsonValue, TypeAdapter, ValidationError, computed_field
from pydantic.dataclasses import dataclass

from quantkit.errors import RecipeError, RunNotFoundError
from quantkit.evals import significance as sig
from quantkit.evals.plausibility import Plausibility
from quantkit.inputs.specs import GateSpec
from quantkit.metrics import METRICS, MetricInfo, format_metric
from quantkit.results.window_scores import WINDOWS_SCHEMA, WindowScores


def gate_fields() -> dict[str, tuple[str, Literal["max", "min"]]]:
    """Gate field -> (the metric it bounds, ``max`` or ``min``), from the metric registry."""
    return {info.gate_field: (info.name, info.gate_kind) for info in METRICS.gated()}


def serve_fields() -> list[str]:
    """The gate fields on served metrics: any of them set, no request may have failed either."""
    return [info.gate_field for info in METRICS.gated() if info.stage == "serve_bench"]


WINDOWS_FILE = "eval_windows.json"
MAX_GATE_FILE_BYTES = 100_000


@dataclass(config=ConfigDict(extra="forbid"))
class Check:
    """One threshold applied to one metric.

    ``verdict`` is ``pass``, ``fail``, ``missing`` (no value: fails) or ``inconclusive`` (the
    interval straddles the threshold under require_significance; ``passed`` says how it counts).
    """

    metric: str
    kind: Literal["max", "min"]
    threshold: float
    value: float | None
    passed: bool
    interval: list[float] | None = None
    verdict: str = ""
    field: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not self.verdict:
            self.verdict = "missing" if self.value is None else ("pass" if self.passed else "fail")

    def describe(self) -> str:
        sign = "<=" if self.kind == "max" else ">="
        if self.value is None:
            return f"{self.metric}: missing (required {sign} {self.threshold:g})"
        text = f"{self.metric} = {self.value:.6g} (required {sign} {self.threshold:g})"
        if self.interval is not None:
            text += f", interval [{self.interval[0]:.6g}, {self.interval[1]:.6g}]"
        if self.verdict == "inconclusive":
            return text + (
                ": inconclusive (counted as pass)" if self.passed else ": inconclusive (FAILED: strict)"
            )
        return text + (": ok" if self.passed else ": FAILED")


@dataclass(config=ConfigDict(extra="forbid"))
class Significance:
    """How intervals were computed for a gate (and whether they decide it)."""

    required: bool
    strict_inconclusive: bool
    confidence: float
    bootstrap_samples: int
    seed: int
    windows: int
    method: str = "percentile bootstrap over eval windows"


@dataclass(config=ConfigDict(extra="ignore"))
class GateResult:
    """All checks of a gate; it passes only when every check passes. ``passed`` is written for
    readers of the JSON and recomputed from the checks when read back."""

    checks: list[Check]
    significance: Significance | None = None
    notes: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    @property
    def inconclusive(self) -> list[Check]:
        return [check for check in self.checks if check.verdict == "inconclusive"]

    def to_dict(self) -> dict[str, JsonValue]:
        data: dict[str, JsonValue] = TypeAdapter(GateResult).dump_python(self, mode="json")
        return data


def _judge(
    kind: str, threshold: float, value: float, interval: list[float] | None, significance: bool, strict: bool
) -> tuple[str, bool]:
    """(verdict, passed) of one check; see the module docstring for the rule."""
    if not significance or interval is None:
        ok = value <= threshold if kind == "max" else value >= threshold
        return ("pass", True) if ok else ("fail", False)
    low, high = interval
    if kind == "max":
        clear_pass, clear_fail = high <= threshold, low > threshold
    else:
        clear_pass, clear_fail = low >= threshold, high < threshold
    if clear_pass:
        return "pass", True
    if clear_fail:
        return "fail", False
    return "inconclusive", not strict


def _interval(info: MetricInfo, spec: GateSpec, windows: WindowScores) -> sig.Interval:
    form = info.windows
    assert form is not None
    values = windows.quantized.series(form.series)
    if form.statistic == "ppl_increase":
        base = windows.baseline.nll_mean
        return sig.ppl_increase_interval(base, values, spec.confidence, spec.bootstrap_samples, spec.seed)
    return sig.mean_interval(values, spec.confidence, spec.bootstrap_samples, spec.seed, scale=form.scale)


def _intervals(spec: GateSpec, windows: WindowScores) -> tuple[dict[str, list[float]], list[str]]:
    """Bootstrap intervals per metric with a per-window form (and notes on what was skipped)."""
    out: dict[str, list[float]] = {}
    notes: list[str] = []
    for info in METRICS.windowed():
        try:
            out[info.name] = _interval(info, spec, windows).as_list()
        except (ValueError, KeyError) as err:
            notes.append(f"no interval for {info.name}: {err}")
    return out, notes


PLAUSIBILITY = "plausibility"  # the ``field`` and ``source`` of the checks no threshold sets


def plausibility_checks(check: Plausibility) -> list[Check]:
    """The artifact against the context-free bars of its eval tokens (``quantkit.evals.plausibility``):
    checked by every gate, whatever its thresholds."""
    return [
        Check(
            metric="ppl",
            kind="max",
            threshold=check.unigram_ppl,
            value=check.ppl,
            passed=check.ppl < check.unigram_ppl,
            field=PLAUSIBILITY,
            source="unigram ppl of the eval tokens",
        ),
        Check(
            metric="top1_accuracy_pct",
            kind="min",
            threshold=check.unigram_top1_pct,
            value=check.top1_accuracy_pct,
            passed=check.top1_accuracy_pct > check.unigram_top1_pct,
            field=PLAUSIBILITY,
            source="commonest eval token's share",
        ),
    ]


TOKENIZATION = "tokenization"  # the ``field`` of the deployment-path check


def tokenization_check(metrics: Mapping[str, float | None]) -> Check | None:
    """The artifact's eval text cut by its own tokenizer (a GGUF's) against quantkit's ids
    (``quantkit.evals.deployment``): a bits-per-byte gap beyond the run's noise fails every gate.
    None where the artifact has no tokenizer of its own."""
    gap, noise = metrics.get("deployed_bpb_gap_pct"), metrics.get("deployed_bpb_noise_pct")
    if gap is None or noise is None:
        return None
    return Check(
        metric="deployed_bpb_gap_pct",
        kind="max",
        threshold=float(noise),
        value=abs(float(gap)),
        passed=abs(float(gap)) <= noise,
        field=TOKENIZATION,
        source="the file's own tokenization vs quantkit's ids, within the run's noise",
    )


def evaluate_gate(
    spec: GateSpec,
    metrics: Mapping[str, float | None],
    windows: WindowScores | None = None,
    plausibility: Plausibility | None = None,
) -> GateResult:
    """Apply every threshold set in ``spec`` to ``metrics``.

    ``windows`` are the run's per-window scores; when given, KLD, perplexity and top-1 checks
    carry bootstrap intervals, which decide them under ``require_significance``.
    ``plausibility``: the artifact's sanity check (``artifact_check``), two more checks that
    fail an artifact whose ppl or top-1 accuracy is no better than ignoring context. An artifact
    scored on its own tokenization too is checked by ``tokenization_check``.
    """
    intervals: dict[str, list[float]] = {}
    notes: list[str] = []
    significance: Significance | None = None
    if windows is not None:
        intervals, notes = _intervals(spec, windows)
        significance = Significance(
            required=spec.require_significance,
            strict_inconclusive=spec.strict_inconclusive,
            confidence=spec.confidence,
            bootstrap_samples=spec.bootstrap_samples,
            seed=spec.seed,
            windows=windows.windows,
        )
    elif spec.require_significance:
        notes.append("significance requested but no per-window scores were given: point values compared")
    thresholds, bounds = spec.thresholds(), gate_fields()
    checks = [
        _threshold_check(spec, (field, *bounds[field]), thresholds[field], metrics, intervals)
        for field in bounds
        if field in thresholds
    ]
    if any(name in thresholds for name in serve_fields()):
        checks.append(_served_without_failures(metrics))
    if plausibility is not None:
        checks += plausibility_checks(plausibility)
    tokenization = tokenization_check(metrics)
    if tokenization is not None:
        checks.append(tokenization)
    return GateResult(checks=checks, significance=significance, notes=notes)


def _threshold_check(
    spec: GateSpec,
    bound: tuple[str, str, Literal["max", "min"]],
    threshold: float,
    metrics: Mapping[str, float | None],
    intervals: dict[str, list[float]],
) -> Check:
    """The check of ``bound`` (gate field, the metric it bounds, max or min) at ``threshold`` on
    that metric; a missing value fails."""
    name, metric, kind = bound
    value = metrics.get(metric)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return Check(metric=metric, kind=kind, threshold=threshold, value=None, passed=False, field=name)
    interval = intervals.get(metric)
    verdict, passed = _judge(
        kind, threshold, float(value), interval, spec.require_significance, spec.strict_inconclusive
    )
    return Check(
        metric=metric,
        kind=kind,
        threshold=threshold,
        value=float(value),
        passed=passed,
        interval=interval,
        verdict=verdict,
        field=name,
    )


def _served_without_failures(metrics: Mapping[str, float | None]) -> Check:
    """Implied by any serving threshold: every request of the load test succeeded."""
    failed = metrics.get("serve_failed_requests")
    return Check(
        metric="serve_failed_requests",
        kind="max",
        threshold=0.0,
        value=None if failed is None else float(failed),
        passed=failed is not None and failed <= 0,
        field="serving",
        source="implied",
    )


# --- inputs: per-window scores, gate files, layered thresholds ---------------------------------


def load_windows(run_dir: Path) -> WindowScores | None:
    """A run's ``eval_windows.json`` (None when the run has none); damaged files are errors."""
    path = run_dir / WINDOWS_FILE
    if not path.is_file():
        return None
    damaged = f"{path} is damaged"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise RunNotFoundError(f"{damaged} (not valid JSON)", "run quantize again") from None
    if not isinstance(data, dict) or data.get("schema_version") != WINDOWS_SCHEMA:
        raise RunNotFoundError(f"{damaged} (unknown schema)", "run quantize again with this quantkit")
    try:
        return WindowScores.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RunNotFoundError(f"{damaged} ('{where}': {first['msg']})", "run quantize again") from None


def _validate_spec(
    data: Mapping[str, JsonValue], where: str, hint: str, prefix: tuple[str, ...] = ()
) -> GateSpec:
    from quantkit.inputs.recipe import format_validation_error

    try:
        return GateSpec.model_validate(dict(data))
    except ValidationError as err:
        error = format_validation_error(err, prefix, GateSpec)
        unknown = error.message.startswith("unknown field")
        raise RecipeError(f"{where}: {error.message}", error.hint if unknown else hint) from None


def load_gate_file(path: Path) -> GateSpec:
    """Read a gate file: a YAML mapping of GateSpec fields (optionally under a ``gates:`` key).

    Parsed like recipes (safe loader, no aliases) and validated as strictly: an unknown field
    is an error with a did-you-mean hint. ``model_fields_set`` of the result says which fields
    the file sets (an explicit ``null`` clears a threshold inherited from the recipe).
    """
    from quantkit.inputs.recipe import read_yaml

    data = read_yaml(path, "gate file", MAX_GATE_FILE_BYTES)
    example = "e.g. 'max_kld_mean: 0.05' on its own line; see docs/ci.md"
    if data is None:
        raise RecipeError(f"{path}: gate file is empty", example)
    prefix: tuple[str, ...] = ()
    if isinstance(data, dict) and set(data) == {"gates"}:
        data, prefix = data["gates"], ("gates",)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a gate file must be a YAML mapping of thresholds", example)
    return _validate_spec(data, str(path), "fix the value in the gate file (see docs/ci.md)", prefix)


def resolve_spec(layers: Iterable[tuple[str, Mapping[str, JsonValue]]]) -> tuple[GateSpec, dict[str, str]]:
    """Merge layers of gate fields, later layers winning field by field.

    Each layer is (source name, fields it sets); e.g. recipe < gate file < flags. Returns the
    validated spec and, per threshold field that is set, the name of the layer it came from.
    """
    merged: dict[str, JsonValue] = {}
    sources: dict[str, str] = {}
    for source, values in layers:
        for key, value in values.items():
            merged[key] = value
            if value is None:
                sources.pop(key, None)
            else:
                sources[key] = source
    spec = _validate_spec(merged, "gate thresholds", "check the flags, the gate file and the recipe's gates")
    return spec, sources


# --- rendering ---------------------------------------------------------------------------------


def format_value(metric: str, value: float | None) -> str:
    """A value in the metric's unit, as every report shows it (``missing`` for None)."""
    return "missing" if value is None else format_metric(metric, value)


def format_threshold(check: Check) -> str:
    return ("≤ " if check.kind == "max" else "≥ ") + format_value(check.metric, check.threshold)


def format_interval(check: Check) -> str:
    if check.interval is None:
        return ""
    low, high = (format_value(check.metric, v) for v in check.interval)
    return f"[{low}, {high}]"


def verdict_label(check: Check) -> str:
    if check.verdict == "inconclusive":
        return "inconclusive (pass)" if check.passed else "inconclusive (fail)"
    if check.verdict == "missing":
        return "FAIL (missing)"
    return "PASS" if check.passed else "FAIL"


def to_junit(results: list[tuple[str, GateResult]]) -> str:
    """JUnit XML: one <testsuite> per run, one <testcase> per check, <failure> for failures."""
    root = ET.Element("testsuites", name="quantkit gate")
    total = failed = 0
    for run, result in results:
        suite = ET.SubElement(
            root,
            "testsuite",
            name=run,
            tests=str(len(result.checks)),
            failures=str(len(result.failures)),
            errors="0",
            skipped="0",
            time="0",
        )
        total += len(result.checks)
        failed += len(result.failures)
        if result.significance is not None:
            props = ET.SubElement(suite, "properties")
            for key, value in asdict(result.significance).items():
                ET.SubElement(props, "property", name=f"significance.{key}", value=str(value))
        for check in result.checks:
            case = ET.SubElement(suite, "testcase", classname=run, name=check.metric, time="0")
            if not check.passed:
                failure = ET.SubElement(case, "failure", message=check.describe(), type=check.verdict)
                failure.text = (
                    f"{check.metric}: value {format_value(check.metric, check.value)}, "
                    f"threshold {format_threshold(check)}"
                    + (f", interval {format_interval(check)}" if check.interval else "")
                )
            else:
                ET.SubElement(case, "system-out").text = check.describe()
        if result.notes:
            ET.SubElement(suite, "system-err").text = "\n".join(result.notes)
    root.set("tests", str(total))
    root.set("failures", str(failed))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(results: list[tuple[str, GateResult]]) -> str:
    """A GitHub-flavoured Markdown summary (for $GITHUB_STEP_SUMMARY)."""
    passed = all(result.passed for _, result in results)
    lines = [
        f"## quantkit gate: {'passed ✅' if passed else 'failed ❌'}",
        "",
        "| run | metric | value | threshold | interval | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for run, result in results:
        for check in result.checks:
            icon = "✅" if check.passed else "❌"
            if check.verdict == "inconclusive":
                icon = "⚠️"
            cells = [
                f"`{run}`",
                f"`{check.metric}`",
                format_value(check.metric, check.value),
                format_threshold(check),
                format_interval(check) or "–",
                f"{icon} {verdict_label(check)}",
            ]
            lines.append("| " + " | ".join(_md(cell) for cell in cells) + " |")
    lines.append("")
    for run, result in results:
        sig = result.significance
        if sig is not None and any(check.interval for check in result.checks):
            rule = "decides the verdict" if sig.required else "informational"
            lines.append(
                f"- `{_md(run)}`: {100 * sig.confidence:g}% bootstrap intervals over {sig.windows} "
                f"eval windows ({sig.bootstrap_samples} resamples, seed {sig.seed}); {rule}"
                + (", inconclusive fails (strict)" if sig.required and sig.strict_inconclusive else "")
            )
        for note in result.notes:
            lines.append(f"- `{_md(run)}`: {_md(note)}")
    lines.append(
        "\nRelative to the baseline: ppl increase, top-1 agreement, task recovery and the ratios; "
        "absolute: KLD (nats) and peak memory."
    )
    return "\n".join(lines) + "\n"
