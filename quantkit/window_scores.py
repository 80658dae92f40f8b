"""Per-window scores of a run (``eval_windows.json``): what significance tests resample."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

WINDOWS_SCHEMA = 1


class BaselineWindows(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nll_mean: list[float]


class QuantizedWindows(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nll_mean: list[float]
    kld_mean: list[float]
    top1_agreement: list[float]


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
        lengths = {
            len(self.baseline.nll_mean),
            len(self.quantized.nll_mean),
            len(self.quantized.kld_mean),
            len(self.quantized.top1_agreement),
        }
        if len(lengths) > 1:
            raise ValueError(f"window counts differ: {sorted(lengths)}")
        return self

    @property
    def windows(self) -> int:
        return len(self.baseline.nll_mean)
