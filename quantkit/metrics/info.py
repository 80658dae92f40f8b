"""What a metric is: name, unit, direction, display format, the stage and function that compute
it, its per-window form for intervals, its gate field and flag, and its report column.

One ``MetricInfo`` registers a metric everywhere (``quantkit.metrics.registry``): evaluation
computes the ones with a ``compute`` function, the gate's fields and ``quantkit gate``'s flags
come from ``gate``, the report's columns from ``column``, and every report formats values by
``style``. Per-task metrics are named ``base:task`` (``task_recovery_pct:arc_easy``) and share
the metadata of ``base``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from quantkit.metrics.positions import PositionScores

Style = Literal[
    "ppl",
    "pct",
    "pct_delta",
    "nats",
    "prob_delta",
    "count",
    "tok_s",
    "seconds",
    "bytes",
    "ratio",
    "usd",
    "fraction",
    "bits",
]
Stage = str  # a stage kind: evaluate, lm_eval, bench, serve_bench, serve_eval, or a plug-in's
# how a gate flag's text is read: a plain number, "5%" or 5, "0.9" or "90%", "800ms", "8GB"
FlagValue = Literal["number", "percent", "fraction", "seconds", "bytes"]
# the quality metrics' compute functions: (per-position scores, the baseline's ppl) -> value
PositionMetric = Callable[["PositionScores", float], float]
WindowValues = Callable[["PositionScores"], "npt.NDArray[np.float64]"]


@dataclass(frozen=True)
class GateBound:
    """How a recipe's ``gates:`` and ``quantkit gate`` bound a metric. The field is
    ``max_<metric>`` for a lower-is-better metric and ``min_<metric>`` for the others."""

    flag: str  # quantkit gate's option, e.g. --max-kld
    help: str
    value: FlagValue = "number"
    ge: float | None = None
    le: float | None = None
    gt: float | None = None
    integer: bool = False
    old_field: str | None = None  # the field's name before fields were named after metrics


@dataclass(frozen=True)
class WindowForm:
    """A metric's per-window form: what the gate's bootstrap interval resamples. ``series`` is
    its name in ``eval_windows.json``; ``statistic`` ``mean`` takes the interval of the mean of
    ``values`` (times ``scale``), ``ppl_increase`` that of exp(mean nll) over the baseline's."""

    series: str
    values: WindowValues
    statistic: Literal["mean", "ppl_increase"] = "mean"
    scale: float = 1.0


@dataclass(frozen=True)
class MetricInfo:
    """What a metric means, how it is computed, gated and shown."""

    name: str
    unit: str
    higher_is_better: bool
    relative: bool  # measured relative to the baseline (a ratio, a % of it, an agreement with it)
    style: Style
    description: str
    stage: Stage = "bench"  # the stage that produces it
    compute: PositionMetric | None = None  # evaluate-stage metrics: from the per-position scores
    windows: WindowForm | None = None
    gate: GateBound | None = None
    column: str | None = None  # the report's column heading (None: not a column)
    always_shown: bool = False  # a column of every report, else shown when some run has a value
    baseline_value: float | None = None  # the baseline against itself (a KLD of 0, 100 % agreement)

    @property
    def gate_kind(self) -> Literal["max", "min"]:
        return "min" if self.higher_is_better else "max"

    @property
    def gate_field(self) -> str:
        """The gate field that bounds it: ``max_kld_mean``, ``min_top1_agreement_pct``."""
        return f"{self.gate_kind}_{self.name}"


def _bytes(value: float) -> str:
    return f"{value / 1e9:.2f} GB" if abs(value) >= 1e9 else f"{value / 1e6:.1f} MB"


def format_number(style: Style, value: float) -> str:
    """``value`` in ``style``, without a unit suffix for percentages and nats."""
    if style == "ppl":
        return f"{value:.3f}" if abs(value) < 1e4 else f"{value:.4g}"
    if style == "pct_delta":
        return f"{value:+.2f}"
    if style == "pct":
        return f"{value:.2f}"
    if style == "nats":
        return "0" if value == 0 else f"{value:.4g}"
    if style == "bits":
        return f"{value:.4f}"
    if style == "prob_delta":
        return f"{value:+.4f}"
    if style == "count":
        return f"{value:.0f}"
    if style == "tok_s":
        return f"{value:.1f}"
    if style == "seconds":
        return f"{value:.3f}"
    if style == "bytes":
        return _bytes(value)
    if style == "ratio":
        return f"{value:.2f}×"
    if style == "fraction":
        return f"{100 * value:.1f}%"
    return f"${value:.4g}"  # usd
