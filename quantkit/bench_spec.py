"""The ``bench:`` section of a recipe: how speed and memory are measured."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BenchSpec(BaseModel):
    """Speed/memory benchmark settings (a pipeline stage, on by default)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="measure speed and memory after evaluation")
    prompt_lengths: list[int] = Field(default_factory=lambda: [128, 512], min_length=1)
    decode_tokens: int = Field(32, ge=2, le=4096, description="tokens generated per timing")
    repeats: int = Field(3, ge=1, le=100, description="timings per setting (median reported)")
    batch_size: int = Field(4, ge=1, le=512, description="batch of the batched decode case (1: skip)")
    threads: int | None = Field(None, ge=1, description="CPU threads (default: all cores)")
    price_per_hour: float | None = Field(
        None, gt=0, description="USD per device-hour, for cost per 1M tokens"
    )
