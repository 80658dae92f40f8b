from __future__ import annotations

from quantkit.gate import evaluate_gate
from quantkit.recipe import GateSpec


def test_all_hold() -> None:
    result = evaluate_gate(
        GateSpec(max_kld=0.1, min_top1_pct=80), {"kld_mean": 0.05, "top1_agreement_pct": 90.0}
    )
    assert result.passed and len(result.checks) == 2


def test_one_fails_and_is_named() -> None:
    result = evaluate_gate(
        GateSpec(max_kld=0.01, max_ppl_increase_pct=5), {"kld_mean": 0.05, "ppl_increase_pct": 1.0}
    )
    assert not result.passed
    assert [check.metric for check in result.failures] == ["kld_mean"]
    assert "0.05" in result.failures[0].describe() and "0.01" in result.failures[0].describe()


def test_missing_metric_fails() -> None:
    result = evaluate_gate(GateSpec(max_kld_p99=1.0), {"kld_mean": 0.0})
    assert not result.passed
    assert "missing" in result.failures[0].describe()


def test_nan_metric_fails() -> None:
    assert not evaluate_gate(GateSpec(max_kld=1.0), {"kld_mean": float("nan")}).passed


def test_boundary_values_pass() -> None:
    assert evaluate_gate(
        GateSpec(max_kld=0.05, min_top1_pct=90), {"kld_mean": 0.05, "top1_agreement_pct": 90.0}
    ).passed
