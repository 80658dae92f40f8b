"""What a run records of its serving measurements (the manifest's ``serve`` section) and the
headline metrics taken from it: one load level per side, the highest concurrency measured
(or the request rate), where the SLO and throughput questions of a deployment are asked."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quantkit.serving.endpoint import ServerInfo
from quantkit.serving.loadgen import LoadSpec
from quantkit.serving.stats import LevelResult

ServeSideName = Literal["artifact", "baseline"]


class ServeSide(BaseModel):
    """One model measured through one server."""

    model_config = ConfigDict(extra="forbid")

    server: ServerInfo
    settings: LoadSpec
    levels: list[LevelResult]
    measured_at: str
    prompts: str  # where the prompts came from

    def headline(self) -> LevelResult:
        return headline(self.levels)


def headline(levels: list[LevelResult]) -> LevelResult:
    """The level a run's metrics come from: the highest concurrency (or the rate)."""
    return max(levels, key=lambda level: (level.concurrency or 0, level.request_rate or 0.0))


def level_cost(level: LevelResult, price_per_hour: float) -> dict[str, float]:
    """USD per request and per 1M output tokens at ``level``'s throughput ({} when none)."""
    if level.request_throughput <= 0 or level.output_tok_s <= 0:
        return {}
    per_second = price_per_hour / 3600.0
    return {
        "serve_cost_per_request_usd": per_second / level.request_throughput,
        "serve_cost_per_mtok_usd": per_second / level.output_tok_s * 1e6,
    }


class ServeSection(BaseModel):
    """The run's serving measurements: the artifact's and, when measured, the baseline's."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    artifact: ServeSide | None = None
    baseline: ServeSide | None = None
    price_per_hour: float | None = None
    notes: list[str] = Field(default_factory=list)

    def side(self, name: ServeSideName) -> ServeSide | None:
        return self.artifact if name == "artifact" else self.baseline


def side_metrics(side: ServeSide, price_per_hour: float | None) -> dict[str, float]:
    """The headline metrics of one side (seconds, tokens/s, the goodput share, USD)."""
    level = side.headline()
    values: dict[str, float] = {
        "serve_output_tok_s": level.output_tok_s,
        "serve_request_s": level.request_throughput,
        "serve_failed_requests": float(sum(item.failed for item in side.levels)),
    }
    for name, dist in (("ttft", level.ttft), ("tpot", level.tpot), ("itl", level.itl), ("e2e", level.e2e)):
        if dist.p95 is not None:
            values[f"serve_{name}_p95_s"] = dist.p95
    if level.ttft.p50 is not None:
        values["serve_ttft_p50_s"] = level.ttft.p50
    if level.goodput is not None:
        values["serve_goodput"] = level.goodput
    if price_per_hour is not None:
        values |= level_cost(level, price_per_hour)
    return values


def cost_per_task(quantized: dict[str, float]) -> dict[str, float]:
    """Cost of a request over the share of the baseline's task score it keeps (lm-eval)."""
    cost, recovery = quantized.get("serve_cost_per_request_usd"), quantized.get("task_recovery_pct")
    if cost is None or not recovery:
        return {}
    return {"serve_cost_per_task_usd": cost / (recovery / 100.0)}


class ServedQuality(BaseModel):
    """Quality of the model as served, against the run's cached reference (quantkit eval RUN
    --endpoint): the protocol the server answered, the top-k asked, the alignment check."""

    model_config = ConfigDict(extra="forbid")

    server: ServerInfo
    protocol: str  # prompt_logprobs | echo
    top_k: int
    kld_estimator: str = "top-k+rest"
    alignment: dict[str, float]  # top-1 agreement at offsets early / aligned / late
    metrics: dict[str, float]  # served_* metrics
    measured_at: str
