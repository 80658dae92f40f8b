"""Bootstrap confidence intervals over evaluation windows (pure numpy, seeded).

The resampling unit is the evaluation *window*, not the token: tokens inside a window are
strongly correlated, windows much less so. Every window has the same number of positions, so
a run-level mean is the mean of the per-window means (``eval_windows.json``).

Method: the percentile bootstrap. Draw ``samples`` sets of ``n`` window indices with
replacement from ``numpy.random.default_rng(seed)``, compute the statistic on each set, and
report the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles. The same seed and
window count always give the same index sets, so intervals of different metrics of one run are
computed on the same resamples (baseline and quantized windows are resampled jointly).

Perplexity change: with per-window mean NLLs ``b`` (baseline) and ``q`` (quantized) and a
resample ``I``, ``ppl_q / ppl_b - 1 = exp(mean(q[I])) / exp(mean(b[I])) - 1
= expm1(mean(q[I] - b[I]))``, reported in percent like ``ppl_increase_pct``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# Resample this many window indices at a time at most (bounds memory for huge B x n).
MAX_CHUNK_ELEMENTS = 2_000_000


@dataclass(frozen=True)
class Interval:
    """A two-sided bootstrap confidence interval."""

    low: float
    high: float
    confidence: float

    def as_list(self) -> list[float]:
        return [self.low, self.high]

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def _as_windows(values: Any, name: str) -> npt.NDArray[np.float64]:
    import numpy as np

    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected one value per window, got shape {array.shape}")
    if array.size < 2:
        raise ValueError(f"{name}: a bootstrap needs at least 2 windows, got {array.size}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: contains NaN or infinite values")
    return array


def _check_options(confidence: float, samples: int) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if samples < 1:
        raise ValueError(f"bootstrap samples must be at least 1, got {samples}")


def resampled_means(values: Any, samples: int = 2000, seed: int = 0) -> npt.NDArray[np.float64]:
    """Means of ``values`` over ``samples`` bootstrap resamples of its windows (shape [samples])."""
    import numpy as np

    array = _as_windows(values, "values")
    n = array.size
    rng = np.random.default_rng(seed)
    out = np.empty(samples, dtype=np.float64)
    chunk = max(1, MAX_CHUNK_ELEMENTS // n)
    for start in range(0, samples, chunk):
        stop = min(samples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = array[idx].mean(axis=1)
    return out


def _percentile_interval(statistics: npt.NDArray[np.float64], confidence: float) -> Interval:
    import numpy as np

    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(statistics, [alpha, 1.0 - alpha])
    return Interval(float(low), float(high), confidence)


def mean_interval(
    values: Any, confidence: float = 0.95, samples: int = 2000, seed: int = 0, scale: float = 1.0
) -> Interval:
    """Interval of the mean over windows of per-window means (e.g. KLD), times ``scale``."""
    _check_options(confidence, samples)
    return _percentile_interval(scale * resampled_means(values, samples, seed), confidence)


def ppl_increase_interval(
    baseline_nll: Any, quantized_nll: Any, confidence: float = 0.95, samples: int = 2000, seed: int = 0
) -> Interval:
    """Interval of the perplexity change in percent, 100 x (ppl_q / ppl_b - 1).

    ``baseline_nll`` and ``quantized_nll`` are per-window mean NLLs of the same windows; each
    resample takes the same windows from both (paired), so window difficulty cancels out.
    """
    import numpy as np

    _check_options(confidence, samples)
    base = _as_windows(baseline_nll, "baseline nll_mean")
    quant = _as_windows(quantized_nll, "quantized nll_mean")
    if base.shape != quant.shape:
        raise ValueError(f"baseline has {base.size} windows, quantized {quant.size}")
    means = resampled_means(quant - base, samples, seed)
    return _percentile_interval(100.0 * np.expm1(means), confidence)
