"""Request records to serving metrics, with the definitions of ``vllm bench serve``
(``vllm/benchmarks/serve.py: calculate_metrics``):

- TTFT: from sending the request to the first streamed chunk that carries text;
- TPOT: ``(e2e - ttft) / (output_tokens - 1)`` per request with more than one output token;
- ITL: the gaps between successive text chunks, pooled over the requests;
- E2E: from sending the request to the end of its stream;
- throughput: completed requests and output tokens per second of the level's duration
  (first request sent to last one finished);
- goodput: requests meeting every SLO (a request with one output token has TPOT 0, as in
  vLLM), as a fraction of all requests sent (failed ones count as missing it) and per
  second (vLLM's ``request_goodput``).

Percentiles are numpy's (linear interpolation), as vLLM's and guidellm's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

PERCENTILES = (50, 90, 95, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it (seconds on the client's monotonic clock)."""

    prompt_tokens: int
    start: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    chunk_gaps: list[float] = field(default_factory=list)  # ITL samples
    output_tokens: int = 0
    error: str | None = None  # None: completed

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None and self.e2e is not None

    @property
    def tpot(self) -> float:
        """Seconds per output token after the first (0 with a single token, as vLLM)."""
        if not self.ok or self.output_tokens <= 1:
            return 0.0
        assert self.e2e is not None and self.ttft is not None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


class Distribution(BaseModel):
    """Mean and percentiles of one latency, in seconds (None: no sample)."""

    model_config = ConfigDict(extra="forbid")

    count: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


class Slo(BaseModel):
    """Per-request objectives in seconds (None: not set)."""

    model_config = ConfigDict(extra="forbid")

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def met_by(self, record: RequestRecord) -> bool:
        if not record.ok:
            return False
        bounds = ((self.ttft, record.ttft), (self.tpot, record.tpot), (self.e2e, record.e2e))
        return all(bound is None or (value is not None and value <= bound) for bound, value in bounds)

    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft, self.tpot, self.e2e))


class LevelResult(BaseModel):
    """One load level (a concurrency, or a request rate) measured through the endpoint."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int | None = None
    request_rate: float | None = None  # requests/s (Poisson arrivals)
    requests: int  # sent
    completed: int
    failed: int
    errors: dict[str, int]  # failure reason -> count
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    request_throughput: float  # completed requests / s
    output_tok_s: float
    total_tok_s: float
    goodput: float | None = None  # fraction of the requests sent meeting every SLO (None: no SLO)
    goodput_req_s: float | None = None
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"rate={self.request_rate:g}/s"


def distribution(values: list[float]) -> Distribution:
    """Mean and percentiles of ``values`` (numpy's linear interpolation)."""
    import numpy as np

    if not values:
        return Distribution(count=0)
    array = np.asarray(values, dtype=np.float64)
    points = np.percentile(array, PERCENTILES)
    return Distribution(
        count=len(values),
        mean=float(array.mean()),
        **{f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)},
    )


def summarize(
    records: list[RequestRecord],
    duration_s: float,
    slo: Slo,
    concurrency: int | None = None,
    request_rate: float | None = None,
) -> LevelResult:
    """The level's metrics from its requests (every request sent, failed ones included)."""
    done = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for record in records:
        if not record.ok:
            reason = record.error or "no output"
            errors[reason] = errors.get(reason, 0) + 1
    output = sum(r.output_tokens for r in done)
    prompt = sum(r.prompt_tokens for r in done)
    duration = max(duration_s, 1e-9)
    good = sum(slo.met_by(r) for r in records) if slo.is_set() else None
    return LevelResult(
        concurrency=concurrency,
        request_rate=request_rate,
        requests=len(records),
        completed=len(done),
        failed=len(records) - len(done),
        errors=errors,
        duration_s=round(duration_s, 4),
        prompt_tokens=prompt,
        output_tokens=output,
        request_throughput=len(done) / duration,
        output_tok_s=output / duration,
        total_tok_s=(prompt + output) / duration,
        goodput=None if good is None else good / max(1, len(records)),
        goodput_req_s=None if good is None else good / duration,
        ttft=distribution([r.ttft for r in done if r.ttft is not None]),
        tpot=distribution([r.tpot for r in done if r.output_tokens > 1]),
        itl=distribution([gap for r in done for gap in r.chunk_gaps]),
        e2e=distribution([r.e2e for r in done if r.e2e is not None]),
    )
