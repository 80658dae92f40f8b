"""Serving metrics from recorded requests: numpy's percentiles, vLLM's TPOT/ITL/goodput rules,
failed requests counted; durations and SLOs as typed on the command line."""

from __future__ import annotations

import numpy as np
import pytest

from quantkit.errors import UserInputError
from quantkit.serving.stats import RequestRecord, Slo, summarize
from quantkit.serving.units import parse_counts, parse_duration, parse_slo


def _records() -> list[RequestRecord]:
    rng = np.random.default_rng(7)
    records = []
    for index in range(40):
        ttft = float(rng.uniform(0.05, 0.9))
        gaps = [float(g) for g in rng.uniform(0.005, 0.05, size=int(rng.integers(1, 12)))]
        records.append(
            RequestRecord(
                prompt_tokens=64 + index,
                start=float(index),
                ttft=ttft,
                e2e=ttft + sum(gaps),
                chunk_gaps=gaps,
                output_tokens=len(gaps) + 1,
            )
        )
    records.append(RequestRecord(prompt_tokens=64, error="HTTP 500"))
    records.append(RequestRecord(prompt_tokens=64, error="HTTP 500"))
    records.append(RequestRecord(prompt_tokens=64, ttft=0.1, error="timed out (no data for 1 s)"))
    one = RequestRecord(prompt_tokens=10, ttft=0.2, e2e=0.2, output_tokens=1)  # TPOT 0, as vLLM
    records.append(one)
    return records


def test_percentiles_equal_numpys_on_the_recorded_latencies() -> None:
    records = _records()
    level = summarize(records, duration_s=12.5, slo=Slo(), concurrency=4)
    done = [r for r in records if r.ok]
    ttft = [r.ttft for r in done]
    e2e = [r.e2e for r in done]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itl = [gap for r in done for gap in r.chunk_gaps]
    for dist, values in ((level.ttft, ttft), (level.e2e, e2e), (level.tpot, tpot), (level.itl, itl)):
        assert dist.count == len(values)
        assert dist.mean == pytest.approx(np.mean(values), rel=1e-12)
        for p in (50, 90, 95, 99):
            assert getattr(dist, f"p{p}") == pytest.approx(np.percentile(values, p), rel=1e-12)
    assert (level.requests, level.completed, level.failed) == (44, 41, 3)
    assert level.errors == {"HTTP 500": 2, "timed out (no data for 1 s)": 1}
    outputs = sum(r.output_tokens for r in done)
    assert level.output_tokens == outputs and level.output_tok_s == pytest.approx(outputs / 12.5)
    assert level.request_throughput == pytest.approx(41 / 12.5)
    assert level.prompt_tokens == sum(r.prompt_tokens for r in done)
    assert level.goodput is None and level.label == "c=4"


def test_goodput_counts_requests_meeting_every_slo_over_all_sent() -> None:
    records = _records()
    slo = Slo(ttft=0.5, tpot=0.03)
    level = summarize(records, duration_s=10.0, slo=slo, request_rate=2.0)
    expected = sum(1 for r in records if r.ok and r.ttft <= 0.5 and (r.output_tokens <= 1 or r.tpot <= 0.03))
    assert 0 < expected < 41
    assert level.goodput == pytest.approx(expected / 44)  # failed requests count as missing it
    assert level.goodput_req_s == pytest.approx(expected / 10.0)
    assert level.label == "rate=2/s"


def test_a_level_with_no_completed_request_has_no_latencies() -> None:
    level = summarize([RequestRecord(prompt_tokens=8, error="connection failed")] * 3, 1.0, Slo(ttft=1.0))
    assert (level.completed, level.failed, level.goodput) == (0, 3, 0.0)
    assert level.ttft.count == 0 and level.ttft.p95 is None and level.output_tok_s == 0.0


@pytest.mark.parametrize(
    ("text", "seconds"), [("800ms", 0.8), ("0.5s", 0.5), ("2", 2.0), (" 250 ms ", 0.25), ("1e-1", 0.1)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--x") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["fast", "-1s", "0", "5 min", ""])
def test_bad_durations_name_the_flag(text: str) -> None:
    with pytest.raises(UserInputError, match="--max-ttft-p95"):
        parse_duration(text, "--max-ttft-p95")


def test_slo_and_counts() -> None:
    assert parse_slo("ttft=500ms, tpot=50ms") == Slo(ttft=0.5, tpot=0.05)
    assert parse_slo("e2el=2s") == Slo(e2e=2.0)
    assert parse_counts("1,4,16", "--concurrency") == [1, 4, 16]
    for bad in ("latency=1s", "ttft", "ttft=soon"):
        with pytest.raises(UserInputError, match="--slo"):
            parse_slo(bad)
    for bad in ("0,4", "a", ""):
        with pytest.raises(UserInputError, match="--concurrency"):
            parse_counts(bad, "--concurrency")


def test_headline_metrics_and_cost_come_from_the_highest_level() -> None:
    from quantkit.serving.endpoint import ServerInfo
    from quantkit.serving.loadgen import LoadSpec
    from quantkit.serving.record import ServeSide, cost_per_task, side_metrics

    records = _records()
    low = summarize(records[:10], 5.0, Slo(ttft=0.5), concurrency=1)
    high = summarize(records, 10.0, Slo(ttft=0.5), concurrency=8)
    info = ServerInfo(url="http://127.0.0.1:1/v1", model="m", models=["m"])
    side = ServeSide(server=info, settings=LoadSpec(), levels=[high, low], measured_at="now", prompts="eval")
    values = side_metrics(side, price_per_hour=3.6)  # 0.001 USD per second
    assert side.headline() is high
    assert values["serve_ttft_p95_s"] == high.ttft.p95 and values["serve_e2e_p95_s"] == high.e2e.p95
    assert values["serve_failed_requests"] == 3.0 + low.failed  # over every level
    assert values["serve_goodput"] == high.goodput
    assert values["serve_cost_per_request_usd"] == pytest.approx(0.001 / high.request_throughput)
    assert values["serve_cost_per_mtok_usd"] == pytest.approx(0.001 / high.output_tok_s * 1e6)
    assert "serve_cost_per_request_usd" not in side_metrics(side, None)
    # the cost of a successful task: a request's cost over the share of the task score kept
    assert cost_per_task({"serve_cost_per_request_usd": 0.002, "task_recovery_pct": 80.0}) == {
        "serve_cost_per_task_usd": pytest.approx(0.0025)
    }
    assert cost_per_task({"serve_cost_per_request_usd": 0.002}) == {}
