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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from quantkit.errors import RecipeError, RunNotFoundError
from quantkit.recipe import GateSpec

# gate field -> (metric name, "max" | "min")
GATE_FIELDS: dict[str, tuple[str, str]] = {
    "max_kld": ("kld_mean", "max"),
    "max_kld_p99": ("kld_p99", "max"),
    "max_ppl_increase_pct": ("ppl_increase_pct", "max"),
    "min_top1_pct": ("top1_agreement_pct", "min"),
    "min_task_recovery_pct": ("task_recovery_pct", "min"),
    "min_decode_speed_ratio": ("decode_speed_ratio", "min"),
    "min_prefill_speed_ratio": ("prefill_speed_ratio", "min"),
    "max_peak_memory_bytes": ("peak_memory_bytes", "max"),
    "max_memory_ratio": ("memory_ratio", "max"),
}

# metric -> True when it is measured relative to the baseline, False when absolute
RELATIVE: dict[str, bool] = {
    "kld_mean": False,  # a divergence from the baseline, but in absolute nats
    "kld_p99": False,
    "ppl_increase_pct": True,  # 100 x (ppl / baseline ppl - 1)
    "top1_agreement_pct": True,  # % of positions whose argmax equals the baseline's
    "task_recovery_pct": True,  # 100 x task score / baseline task score
    "decode_speed_ratio": True,  # decode tokens/s / baseline's
    "prefill_speed_ratio": True,
    "peak_memory_bytes": False,
    "memory_ratio": True,  # peak memory / baseline's
}

WINDOWS_FILE = "eval_windows.json"
MAX_GATE_FILE_BYTES = 100_000


@dataclass
class Check:
    """One threshold applied to one metric.

    ``verdict`` is ``pass``, ``fail``, ``missing`` (no value: fails) or ``inconclusive`` (the
    interval straddles the threshold under require_significance; ``passed`` says how it counts).
    """

    metric: str
    kind: str
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


@dataclass
class GateResult:
    """All checks of a gate; it passes only when every check passes."""

    checks: list[Check]
    significance: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    @property
    def inconclusive(self) -> list[Check]:
        return [check for check in self.checks if check.verdict == "inconclusive"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "checks": [asdict(check) for check in self.checks],
            "significance": self.significance,
            "notes": self.notes,
        }


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


def _intervals(spec: GateSpec, windows: Mapping[str, Any]) -> tuple[dict[str, list[float]], list[str]]:
    """Bootstrap intervals per metric from per-window scores (and notes on what was skipped)."""
    from quantkit.evals import significance as sig

    conf, samples, seed = spec.confidence, spec.bootstrap_samples, spec.seed
    baseline = windows.get("baseline") or {}
    quantized = windows.get("quantized") or {}
    out: dict[str, list[float]] = {}
    notes: list[str] = []
    jobs: list[tuple[str, Callable[[], sig.Interval]]] = []
    if "nll_mean" in baseline and "nll_mean" in quantized:
        base_nll, quant_nll = baseline["nll_mean"], quantized["nll_mean"]
        jobs.append(
            ("ppl_increase_pct", lambda: sig.ppl_increase_interval(base_nll, quant_nll, conf, samples, seed))
        )
    if "kld_mean" in quantized:
        kld = quantized["kld_mean"]
        jobs.append(("kld_mean", lambda: sig.mean_interval(kld, conf, samples, seed)))
    if "top1_agreement" in quantized:
        top1 = quantized["top1_agreement"]
        jobs.append(("top1_agreement_pct", lambda: sig.mean_interval(top1, conf, samples, seed, scale=100.0)))
    for metric, compute in jobs:
        try:
            out[metric] = compute().as_list()
        except ValueError as err:
            notes.append(f"no interval for {metric}: {err}")
    return out, notes


def evaluate_gate(
    spec: GateSpec, metrics: Mapping[str, float | None], windows: Mapping[str, Any] | None = None
) -> GateResult:
    """Apply every threshold set in ``spec`` to ``metrics``.

    ``windows`` is the content of a run's ``eval_windows.json``; when given, KLD, perplexity
    and top-1 checks carry bootstrap intervals, which decide them under ``require_significance``.
    """
    intervals: dict[str, list[float]] = {}
    notes: list[str] = []
    significance: dict[str, Any] | None = None
    if windows is not None:
        intervals, notes = _intervals(spec, windows)
        significance = {
            "required": spec.require_significance,
            "strict_inconclusive": spec.strict_inconclusive,
            "confidence": spec.confidence,
            "bootstrap_samples": spec.bootstrap_samples,
            "seed": spec.seed,
            "windows": len((windows.get("baseline") or {}).get("nll_mean") or []),
            "method": "percentile bootstrap over eval windows",
        }
    elif spec.require_significance:
        notes.append("significance requested but no per-window scores were given: point values compared")
    checks: list[Check] = []
    for name, (metric, kind) in GATE_FIELDS.items():
        threshold = getattr(spec, name)
        if threshold is None:
            continue
        value = metrics.get(metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            checks.append(Check(metric, kind, float(threshold), None, False, field=name))
            continue
        interval = intervals.get(metric)
        verdict, passed = _judge(
            kind,
            float(threshold),
            float(value),
            interval,
            spec.require_significance,
            spec.strict_inconclusive,
        )
        checks.append(
            Check(metric, kind, float(threshold), float(value), passed, interval, verdict, field=name)
        )
    return GateResult(checks, significance, notes)


# --- inputs: per-window scores, gate files, layered thresholds ---------------------------------


def load_windows(run_dir: Path) -> dict[str, Any] | None:
    """A run's ``eval_windows.json`` (None when the run has none); damaged files are errors."""
    path = run_dir / WINDOWS_FILE
    if not path.is_file():
        return None
    damaged = f"{path} is damaged"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise RunNotFoundError(f"{damaged} (not valid JSON)", "run quantize again") from None
    if not isinstance(data, dict) or data.get("schema_version") != 1:
        raise RunNotFoundError(f"{damaged} (unknown schema)", "run quantize again with this quantkit")
    lengths = set()
    for section in ("baseline", "quantized"):
        part = data.get(section)
        if not isinstance(part, dict):
            raise RunNotFoundError(f"{damaged} (no '{section}' section)", "run quantize again")
        for key, values in part.items():
            if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
            ):
                raise RunNotFoundError(
                    f"{damaged} ('{section}.{key}' is not a list of numbers)", "run quantize again"
                )
            lengths.add(len(values))
    if len(lengths) > 1:
        raise RunNotFoundError(f"{damaged} (window counts differ: {sorted(lengths)})", "run quantize again")
    return data


def _validate_spec(data: Mapping[str, Any], where: str, hint: str, prefix: tuple[Any, ...] = ()) -> GateSpec:
    from quantkit.recipe import _format_validation_error

    try:
        return GateSpec.model_validate(dict(data))
    except ValidationError as err:
        error = _format_validation_error(err, prefix, GateSpec)
        unknown = error.message.startswith("unknown field")
        raise RecipeError(f"{where}: {error.message}", error.hint if unknown else hint) from None


def load_gate_file(path: Path) -> GateSpec:
    """Read a gate file: a YAML mapping of GateSpec fields (optionally under a ``gates:`` key).

    Parsed like recipes (safe loader, no aliases) and validated as strictly: an unknown field
    is an error with a did-you-mean hint. ``model_fields_set`` of the result says which fields
    the file sets (an explicit ``null`` clears a threshold inherited from the recipe).
    """
    from quantkit.recipe import read_yaml

    data = read_yaml(path, "gate file", MAX_GATE_FILE_BYTES)
    example = "e.g. 'max_kld: 0.05' on its own line; see docs/ci.md"
    if data is None:
        raise RecipeError(f"{path}: gate file is empty", example)
    prefix: tuple[Any, ...] = ()
    if isinstance(data, dict) and set(data) == {"gates"}:
        data, prefix = data["gates"], ("gates",)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a gate file must be a YAML mapping of thresholds", example)
    return _validate_spec(data, str(path), "fix the value in the gate file (see docs/ci.md)", prefix)


def resolve_spec(layers: Iterable[tuple[str, Mapping[str, Any]]]) -> tuple[GateSpec, dict[str, str]]:
    """Merge layers of gate fields, later layers winning field by field.

    Each layer is (source name, fields it sets); e.g. recipe < gate file < flags. Returns the
    validated spec and, per threshold field that is set, the name of the layer it came from.
    """
    merged: dict[str, Any] = {}
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

_PERCENT = {"top1_agreement_pct", "task_recovery_pct"}
_RATIO = {"decode_speed_ratio", "prefill_speed_ratio", "memory_ratio"}


def format_value(metric: str, value: float | None) -> str:
    """A value in the metric's unit (``missing`` for None)."""
    if value is None:
        return "missing"
    if metric == "ppl_increase_pct":
        return f"{value:+.4g}%"
    if metric in _PERCENT:
        return f"{value:.4g}%"
    if metric in _RATIO:
        return f"{value:.3g}×"
    if metric == "peak_memory_bytes":
        return f"{value / 1e9:.3g} GB" if abs(value) >= 1e9 else f"{value / 1e6:.3g} MB"
    return f"{value:.4g}"


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
            for key, value in result.significance.items():
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
            rule = "decides the verdict" if sig["required"] else "informational"
            lines.append(
                f"- `{_md(run)}`: {100 * sig['confidence']:g}% bootstrap intervals over {sig['windows']} "
                f"eval windows ({sig['bootstrap_samples']} resamples, seed {sig['seed']}); {rule}"
                + (", inconclusive fails (strict)" if sig["required"] and sig["strict_inconclusive"] else "")
            )
        for note in result.notes:
            lines.append(f"- `{_md(run)}`: {_md(note)}")
    lines.append(
        "\nRelative to the baseline: ppl increase, top-1 agreement, task recovery and the ratios; "
        "absolute: KLD (nats) and peak memory."
    )
    return "\n".join(lines) + "\n"
