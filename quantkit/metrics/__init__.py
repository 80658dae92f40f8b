"""Metrics: each registered once (``MetricInfo``), read by evaluation, the gate, the reports and
the docs' metric table. See ``quantkit.metrics.info`` for what a registration holds."""

from __future__ import annotations

from quantkit.metrics.info import GateBound, MetricInfo, Style, WindowForm, format_number
from quantkit.metrics.registry import METRICS, metric_info

__all__ = [
    "METRICS",
    "GateBound",
    "MetricInfo",
    "Style",
    "WindowForm",
    "format_metric",
    "format_number",
    "metric_info",
]


def format_metric(name: str, value: float | None, with_unit: bool = True) -> str:
    """The display form of a metric value (``—`` when not measured); with its unit unless the
    column header carries it."""
    if value is None:
        return "—"
    info = metric_info(name)
    text = format_number(info.style, value)
    if with_unit and info.style in ("pct", "pct_delta"):
        return text + "%"
    if with_unit and info.style == "nats":
        return text + " nats"
    return text
