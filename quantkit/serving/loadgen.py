"""The load generator: streamed completions at fixed concurrency levels (or Poisson arrivals at
a request rate), bounded in requests and time, every request's timings kept.

Requests go through the ``openai`` client (streaming, ``temperature=0``, ``max_tokens`` fixed);
a request that fails, times out, stalls mid-stream (no data for ``timeout_s``) or whose stream
ends without a ``finish_reason`` (cut off by the server) is counted as failed with its
reason, never dropped. A level that outlives its time budget is stopped and its unfinished
requests are counted as failed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from quantkit.errors import UserInputError
from quantkit.serving.stats import LevelResult, RequestRecord, Slo, summarize

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from openai import AsyncOpenAI

    from quantkit.serving.endpoint import Endpoint


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text and its length in the prompt tokenizer's tokens."""

    text: str
    tokens: int


class LoadSpec(BaseModel):
    """What load to put on the endpoint."""

    model_config = ConfigDict(extra="forbid")

    concurrency: list[int] = Field(default_factory=lambda: [1, 4])
    request_rate: float | None = None  # requests/s with Poisson arrivals, instead of levels
    requests: int = Field(32, ge=1, le=100_000)  # per level
    warmup: int = Field(2, ge=0)  # requests before the first level, not measured
    max_tokens: int = Field(64, ge=1)
    prompt_lengths: list[int] = Field(default_factory=lambda: [128])
    seed: int = 0
    timeout_s: float = Field(60.0, gt=0)  # per request: the longest wait for data
    max_level_s: float = Field(600.0, gt=0)  # a level stops by itself after this
    slo: Slo = Field(default_factory=Slo)

    @field_validator("concurrency", "prompt_lengths")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if not values or any(v < 1 for v in values):
            raise ValueError("give one or more positive integers")
        return values

    @field_validator("request_rate")
    @classmethod
    def _rate(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("a request rate must be positive")
        return value


@dataclass
class Level:
    """One level to run: at most ``concurrency`` requests in flight, or arrivals at ``rate``."""

    concurrency: int | None
    rate: float | None


def levels(spec: LoadSpec) -> list[Level]:
    if spec.request_rate is not None:
        return [Level(None, spec.request_rate)]
    return [Level(c, None) for c in spec.concurrency]


def pick_prompts(prompts: dict[int, list[Prompt]], count: int, seed: int) -> list[Prompt]:
    """``count`` prompts, the lengths taken in turn, each drawn (seeded) from its length's pool."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = sorted(prompts)
    return [
        prompts[lengths[i % len(lengths)]][int(rng.integers(len(prompts[lengths[i % len(lengths)]])))]
        for i in range(count)
    ]


async def _one(
    client: AsyncOpenAI, model: str, prompt: Prompt, spec: LoadSpec, record: RequestRecord
) -> None:
    """Send one streamed completion and fill ``record`` (errors included)."""
    import openai

    start = time.perf_counter()
    record.start = start
    last: float | None = None
    finish: str | None = None
    chunks = 0
    reported: int | None = None
    try:
        stream = await client.completions.create(
            model=model,
            prompt=prompt.text,
            max_tokens=spec.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                reported = chunk.usage.completion_tokens or None
                record.prompt_tokens = chunk.usage.prompt_tokens or record.prompt_tokens
            for choice in chunk.choices:
                if choice.text:
                    if record.ttft is None:
                        record.ttft = now - start
                    elif last is not None:
                        record.chunk_gaps.append(now - last)
                    last = now
                    chunks += 1
                finish = choice.finish_reason or finish
        record.e2e = (last if last is not None else time.perf_counter()) - start
        record.output_tokens = reported if reported is not None else chunks
        if record.ttft is None:
            record.error = "no text streamed"
        elif finish is None:
            record.error = "stream ended without a finish_reason (cut off by the server)"
    except openai.APITimeoutError:
        record.error = f"timed out (no data for {spec.timeout_s:g} s)"
    except openai.APIStatusError as err:
        record.error = f"HTTP {err.status_code}"
    except openai.APIConnectionError:
        record.error = "connection failed"
    except openai.APIError as err:
        record.error = f"API error: {type(err).__name__}"


async def _level(
    endpoint: Endpoint, model: str, prompts: list[Prompt], level: Level, spec: LoadSpec, seed: int
) -> tuple[list[RequestRecord], float]:
    import numpy as np

    client = endpoint.client()
    records = [RequestRecord(prompt_tokens=p.tokens) for p in prompts]
    limit = asyncio.Semaphore(level.concurrency or len(prompts))
    arrivals: npt.NDArray[np.float64] = np.zeros(len(prompts))  # seconds after the level's start
    if level.rate is not None:  # Poisson arrivals (vLLM's burstiness 1), the first at once
        gaps = np.random.default_rng(seed).exponential(1.0 / level.rate, size=len(prompts))
        arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])])

    async def send(index: int, begin: float) -> None:
        delay = begin + float(arrivals[index]) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with limit:
            await _one(client, model, prompts[index], spec, records[index])

    begin = time.perf_counter()
    tasks = [asyncio.create_task(send(i, begin)) for i in range(len(prompts))]
    try:
        _, pending = await asyncio.wait(tasks, timeout=spec.max_level_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
            for record in records:
                if record.e2e is None and record.error is None:
                    record.error = f"not finished within the level's {spec.max_level_s:g} s"
    finally:
        duration = time.perf_counter() - begin  # vLLM's benchmark duration: until the last one ended
        await client.close()
    return records, duration


async def _warm(endpoint: Endpoint, model: str, prompts: list[Prompt], spec: LoadSpec) -> None:
    client = endpoint.client()
    try:
        for prompt in prompts[: spec.warmup]:
            await _one(client, model, prompt, spec, RequestRecord(prompt_tokens=prompt.tokens))
    finally:
        await client.close()


def run_load(
    endpoint: Endpoint,
    model: str,
    pools: dict[int, list[Prompt]],
    spec: LoadSpec,
    on_level: Callable[[LevelResult], None] = lambda result: None,
) -> list[LevelResult]:
    """Every level of ``spec`` in turn (after the warm-up requests), each summarized."""
    results: list[LevelResult] = []
    asyncio.run(_warm(endpoint, model, pick_prompts(pools, spec.warmup, spec.seed + 1), spec))
    for index, level in enumerate(levels(spec)):
        prompts = pick_prompts(pools, spec.requests, spec.seed + 100 + index)
        records, duration = asyncio.run(_level(endpoint, model, prompts, level, spec, spec.seed + index))
        result = summarize(records, duration, spec.slo, level.concurrency, level.rate)
        results.append(result)
        on_level(result)
    return results


def check_answered(results: list[LevelResult], url: str) -> None:
    """Refuse a measurement in which no request completed (nothing to store or gate on)."""
    if any(level.completed for level in results):
        return
    reasons: dict[str, int] = {}
    for level in results:
        for reason, count in level.errors.items():
            reasons[reason] = reasons.get(reason, 0) + count
    listed = ", ".join(
        f"{reason} (x{count})" for reason, count in sorted(reasons.items(), key=lambda i: -i[1])
    )
    raise UserInputError(
        f"every request to {url} failed: {listed or 'no request was sent'}",
        "check the server's log; --timeout raises the wait for a slow server",
    )
