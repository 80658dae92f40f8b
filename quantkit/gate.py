"""Threshold checks over a run's metrics. A missing metric fails its check; it never passes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from quantkit.recipe import GateSpec

# gate field -> (metric name, "max" | "min")
GATE_FIELDS: dict[str, tuple[str, str]] = {
    "max_kld": ("kld_mean", "max"),
    "max_kld_p99": ("kld_p99", "max"),
    "max_ppl_increase_pct": ("ppl_increase_pct", "max"),
    "min_top1_pct": ("top1_agreement_pct", "min"),
}


@dataclass
class Check:
    """One threshold applied to one metric."""

    metric: str
    kind: str
    threshold: float
    value: float | None
    passed: bool

    def describe(self) -> str:
        sign = "<=" if self.kind == "max" else ">="
        if self.value is None:
            return f"{self.metric}: missing (required {sign} {self.threshold:g})"
        verdict = "ok" if self.passed else "FAILED"
        return f"{self.metric} = {self.value:.6g} (required {sign} {self.threshold:g}): {verdict}"


@dataclass
class GateResult:
    """All checks of a gate; it passes only when every check passes."""

    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "checks": [asdict(check) for check in self.checks]}


def evaluate_gate(spec: GateSpec, metrics: dict[str, float | None]) -> GateResult:
    """Apply every threshold set in ``spec`` to ``metrics``."""
    checks: list[Check] = []
    for field, (metric, kind) in GATE_FIELDS.items():
        threshold = getattr(spec, field)
        if threshold is None:
            continue
        value = metrics.get(metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            checks.append(Check(metric, kind, float(threshold), None, False))
            continue
        passed = value <= threshold if kind == "max" else value >= threshold
        checks.append(Check(metric, kind, float(threshold), float(value), bool(passed)))
    return GateResult(checks)
