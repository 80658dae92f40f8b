"""The metric registry: quantkit's own metrics, those registered at run time, and those installed
packages declare in the ``quantkit.metrics`` entry-point group (each entry a ``MetricInfo``).

Entry points are read on first use, so a plug-in's module may import ``quantkit.metrics`` (and
only what that imports: the gate's model is built from this registry when ``quantkit.inputs.specs``
is imported).
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata

from quantkit.errors import UserInputError
from quantkit.metrics.builtin import BUILTIN
from quantkit.metrics.info import MetricInfo
from quantkit.registry import load_plugin

ENTRY_POINT_GROUP = "quantkit.metrics"


class MetricRegistry:
    """Every known metric by name, in registration order (the report's column order)."""

    def __init__(self, builtin: list[MetricInfo], group: str) -> None:
        self._metrics = {info.name: info for info in builtin}
        self._group = group
        self._plugins_loaded = False

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for point in metadata.entry_points(group=self._group):
            if point.name in self._metrics:
                continue
            info = load_plugin(point, "metric", UserInputError)
            if not isinstance(info, MetricInfo) or info.name != point.name:
                raise UserInputError(
                    f"entry point '{point.name}' ({point.value}) is not a MetricInfo named '{point.name}'",
                    "fix the plug-in's entry point",
                )
            self._metrics[info.name] = info

    def register(self, info: MetricInfo) -> None:
        """Add a metric (a name quantkit already has cannot be taken over)."""
        if info.name in self._metrics:
            raise UserInputError(f"metric '{info.name}' is already registered", "pick another name")
        self._metrics[info.name] = info

    def all(self) -> list[MetricInfo]:
        self._load_plugins()
        return list(self._metrics.values())

    def __iter__(self) -> Iterator[str]:
        return iter(info.name for info in self.all())

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._metrics

    def get(self, name: str) -> MetricInfo | None:
        self._load_plugins()
        return self._metrics.get(name)

    def gated(self) -> list[MetricInfo]:
        """The metrics a gate can bound, in order."""
        return [info for info in self.all() if info.gate is not None]

    def computed(self) -> list[MetricInfo]:
        """The quality metrics computed from per-position scores, in order."""
        return [info for info in self.all() if info.compute is not None]

    def windowed(self) -> list[MetricInfo]:
        """The metrics with a per-window form (bootstrap intervals)."""
        return [info for info in self.all() if info.windows is not None]

    def columns(self) -> list[MetricInfo]:
        """The metrics that are report columns, in order."""
        return [info for info in self.all() if info.column is not None]


METRICS = MetricRegistry(BUILTIN, ENTRY_POINT_GROUP)


def metric_info(name: str) -> MetricInfo:
    """The metadata of ``name`` (``base:detail`` names share their base's)."""
    info = METRICS.get(name.split(":", 1)[0])
    if info is None:
        raise KeyError(f"unknown metric '{name}'")
    return info
