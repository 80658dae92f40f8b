from __future__ import annotations

import math

import numpy as np
import pytest

from quantkit.evals import significance as sig


def _windows(n: int = 24, seed: int = 1) -> np.ndarray:
    """Per-window mean NLLs that differ from window to window, like real text."""
    return 3.0 + 0.3 * np.random.default_rng(seed).standard_normal(n)


def test_identical_baseline_and_quantized_contain_zero() -> None:
    base = _windows()
    interval = sig.ppl_increase_interval(base, base.copy())
    assert interval.contains(0.0)
    assert interval.low == pytest.approx(0.0) and interval.high == pytest.approx(0.0)


def test_noise_without_a_shift_contains_zero() -> None:
    base = _windows()
    noise = 0.01 * np.random.default_rng(2).standard_normal(base.size)
    interval = sig.ppl_increase_interval(base, base + noise - noise.mean())
    assert interval.low < 0.0 < interval.high


def test_a_clear_shift_excludes_zero_and_covers_the_true_change() -> None:
    base = _windows()
    noise = 0.01 * np.random.default_rng(3).standard_normal(base.size)
    interval = sig.ppl_increase_interval(base, base + 0.05 + noise)
    assert interval.low > 0.0
    point = 100 * (math.exp(np.mean(base + 0.05 + noise)) / math.exp(np.mean(base)) - 1)
    assert interval.low <= point <= interval.high
    assert interval.contains(100 * math.expm1(0.05))


def test_windows_are_resampled_jointly() -> None:
    # Window difficulty varies a lot, the shift is constant: a paired bootstrap sees no spread.
    base = 3.0 + np.linspace(-1, 1, 16)
    interval = sig.ppl_increase_interval(base, base + 0.02)
    assert interval.low == pytest.approx(interval.high) == pytest.approx(100 * math.expm1(0.02))


def test_seeded_and_deterministic() -> None:
    kld = np.abs(_windows(seed=4)) / 100
    first = sig.mean_interval(kld, seed=7)
    assert sig.mean_interval(kld, seed=7) == first
    assert sig.mean_interval(kld, seed=8) != first


def test_chunking_does_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    values = _windows(n=30)
    whole = sig.resampled_means(values, samples=500, seed=3)
    monkeypatch.setattr(sig, "MAX_CHUNK_ELEMENTS", 7)  # many small chunks
    assert np.array_equal(sig.resampled_means(values, samples=500, seed=3), whole)


def test_mean_interval_contains_the_mean_and_scales() -> None:
    values = np.abs(_windows(seed=5)) / 10
    interval = sig.mean_interval(values, confidence=0.9)
    assert interval.low < values.mean() < interval.high
    assert interval.confidence == 0.9
    scaled = sig.mean_interval(values, confidence=0.9, scale=100.0)
    assert scaled.low == pytest.approx(100 * interval.low) and scaled.high == pytest.approx(
        100 * interval.high
    )
    wider = sig.mean_interval(values, confidence=0.99)
    assert wider.low <= interval.low and wider.high >= interval.high
    assert interval.as_list() == [interval.low, interval.high]


def test_more_windows_narrow_the_interval() -> None:
    few = sig.mean_interval(_windows(n=8, seed=6))
    many = sig.mean_interval(_windows(n=400, seed=6))
    assert (many.high - many.low) < (few.high - few.low)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sig.mean_interval([1.0]), "at least 2 windows"),
        (lambda: sig.mean_interval([1.0, float("nan")]), "NaN"),
        (lambda: sig.mean_interval([[1.0, 2.0]]), "one value per window"),
        (lambda: sig.mean_interval([1.0, 2.0], confidence=1.5), "confidence"),
        (lambda: sig.mean_interval([1.0, 2.0], samples=0), "samples"),
        (lambda: sig.ppl_increase_interval([1.0, 2.0], [1.0, 2.0, 3.0]), "windows"),
    ],
)
def test_bad_inputs_raise(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
