"""The baseline sanity guard's figures and verdicts, and the two checks it adds to gates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantkit.evals.plausibility import (
    MIN_TOKENS,
    ImplausibleBaselineError,
    Plausibility,
    artifact_check,
    check_baseline,
    plausibility,
    unigram_figures,
)
from quantkit.inputs.specs import GateSpec
from quantkit.results.gate import evaluate_gate

# SmolLM2-135M on 8 x 256 built-in eval tokens (tests/e2e/test_smollm2.py checks the real run)
BASELINE = {
    "ppl": 20.0,
    "top1_accuracy_pct": 43.2,
    "tokens": 2040.0,
    "unigram_ppl": 258.8,
    "unigram_top1_pct": 7.3,
}


def test_unigram_figures_are_the_entropy_and_the_commonest_share() -> None:
    figures = unigram_figures(np.array([[1, 1, 2], [3, 1, 2]]))
    shares = np.array([3, 2, 1]) / 6
    assert figures["unigram_ppl"] == pytest.approx(math.exp(-(shares * np.log(shares)).sum()), rel=1e-12)
    assert figures["unigram_top1_pct"] == pytest.approx(50.0)
    assert unigram_figures(np.full(10, 7)) == {"unigram_ppl": 1.0, "unigram_top1_pct": 100.0}


def test_a_real_baseline_passes() -> None:
    check = plausibility(BASELINE)
    assert check is not None and check.judged and check.plausible
    assert check.verdict() == "passed"
    check_baseline(check, allow=False)  # no error


@pytest.mark.parametrize(
    ("changed", "failure"),
    [
        ({"ppl": 39069.0}, "ppl 3.907e+04 is not below the unigram ppl 258.8"),
        ({"ppl": 258.8}, "ppl 258.8 is not below the unigram ppl 258.8"),
        ({"top1_accuracy_pct": 7.3}, "top-1 accuracy 7.3 % is not above the 7.3 % of always guessing"),
    ],
)
def test_an_implausible_baseline_is_refused_with_its_figures(changed: dict, failure: str) -> None:
    check = plausibility(BASELINE | changed)
    assert check is not None and check.verdict() == "implausible"
    with pytest.raises(ImplausibleBaselineError) as raised:
        check_baseline(check, allow=False)
    assert raised.value.exit_code == 2
    assert failure in raised.value.message
    assert raised.value.message.startswith("the baseline is implausible on the eval text (2040 tokens): ")
    assert "tokenizer" in raised.value.hint and "BOS" in raised.value.hint
    assert raised.value.hint.endswith("--allow-implausible-baseline goes on anyway")
    check_baseline(check, allow=True)  # let through


def test_too_few_tokens_are_not_judged() -> None:
    check = plausibility(BASELINE | {"ppl": 1e6, "tokens": float(MIN_TOKENS - 1)})
    assert check is not None and not check.judged and check.failures() == []
    assert check.verdict() == "not judged"
    check_baseline(check, allow=False)
    assert plausibility({"ppl": 20.0, "tokens": 2040.0}) is None  # a run made before the check


def test_the_artifact_is_judged_only_against_a_plausible_baseline() -> None:
    broken = {"ppl": 5e5, "top1_accuracy_pct": 0.0, "tokens": 2040.0}
    check = artifact_check(BASELINE, broken)
    assert check == Plausibility(5e5, 0.0, 258.8, 7.3, 2040)
    assert len(check.failures()) == 2
    assert artifact_check(BASELINE | {"ppl": 300.0}, broken) is None  # the baseline was let through
    assert artifact_check(BASELINE, broken | {"tokens": 100.0}) is None


def test_every_gate_fails_an_implausible_artifact() -> None:
    quantized = {"ppl": 5e5, "top1_accuracy_pct": 0.0, "tokens": 2040.0, "kld_mean": 0.01}
    result = evaluate_gate(GateSpec(max_kld_mean=0.05), quantized, None, artifact_check(BASELINE, quantized))
    assert not result.passed
    assert [(c.metric, c.verdict, c.field) for c in result.checks] == [
        ("kld_mean", "pass", "max_kld_mean"),
        ("ppl", "fail", "plausibility"),
        ("top1_accuracy_pct", "fail", "plausibility"),
    ]
    assert result.checks[1].describe() == "ppl = 500000 (required <= 258.8): FAILED"
    assert result.checks[1].source == "unigram ppl of the eval tokens"
    fine = {"ppl": 21.0, "top1_accuracy_pct": 42.0, "tokens": 2040.0, "kld_mean": 0.01}
    assert evaluate_gate(GateSpec(max_kld_mean=0.05), fine, None, artifact_check(BASELINE, fine)).passed
