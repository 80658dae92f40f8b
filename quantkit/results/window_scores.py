"""Per-window scores of a run (``eval_windows.json``): what significance tests resample."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

WINDOWS_SCHEMA = 1


class BaselineWindows(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nll_mean: list[float]


class QuantizedWindows(BaseModel):
    """The quantized side's per-window series: the built-in three, plus one per metric with a
    per-window form that registers another series (``quantkit.metrics.WindowForm``)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, list[float]] = Field(init=False)

    nll_mean: list[float]
    kld_mean: list[float]
    top1_agreement: list[float]

    def series(self, name: str) -> list[float]:
        """A series by name; KeyError when this run has none of that name."""
        if name in type(self).model_fields:
            values: list[float] = getattr(self, name)
            return values
        return self.__pydantic_extra__[name]

    def all_series(self) -> dict[str, list[float]]:
        return {name: self.series(name) for name in (*type(self).model_fields, *self.__pydantic_extra__)}


class WindowScores(BaseModel):
    """Per-window means of the baseline and the quantized model over the same windows.

    Every window has the same number of predicted positions, so the mean over windows of
    these per-window means is the token mean the run's metrics use.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(WINDOWS_SCHEMA, ge=WINDOWS_SCHEMA, le=WINDOWS_SCHEMA)
    positions_per_window: int
    baseline: BaselineWindows
    quantized: QuantizedWindows

    @model_validator(mode="after")
    def _same_window_count(self) -> WindowScores:
        lengths = {len(self.baseline.nll_mean), *map(len, self.quantized.all_series().values())}
        if len(lengths) > 1:
            raise ValueError(f"window counts differ: {sorted(lengths)}")
        return self

    @property
    def windows(self) -> int:
        return len(self.baseline.nll_mean)
