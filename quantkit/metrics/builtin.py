"""quantkit's own metrics, in report-column order. A new one is one entry here (or a
``quantkit.metrics`` entry point in another package) plus, for a quality metric, its function
of the per-position scores."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from quantkit.metrics.info import GateBound, MetricInfo, WindowForm

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from quantkit.metrics.positions import PositionScores


def _ppl(scores: PositionScores, baseline_ppl: float) -> float:
    return math.exp(float(scores.nll.mean()))


def _ppl_increase(scores: PositionScores, baseline_ppl: float) -> float:
    return 100.0 * (_ppl(scores, baseline_ppl) / baseline_ppl - 1.0)


def _kld_mean(scores: PositionScores, baseline_ppl: float) -> float:
    return float(scores.kld.mean())


def _kld_median(scores: PositionScores, baseline_ppl: float) -> float:
    import numpy as np

    return float(np.median(scores.kld))


def _kld_p99(scores: PositionScores, baseline_ppl: float) -> float:
    import numpy as np

    return float(np.percentile(scores.kld, 99))


def _top1_agreement(scores: PositionScores, baseline_ppl: float) -> float:
    return 100.0 * float(scores.top1_match.mean())


def _top1_accuracy(scores: PositionScores, baseline_ppl: float) -> float:
    return 100.0 * float(scores.correct.mean())


def _delta_p(scores: PositionScores, baseline_ppl: float) -> float:
    return float(scores.delta_p.mean())


def _tokens(scores: PositionScores, baseline_ppl: float) -> float:
    return float(scores.nll.size)


def _window_nll(scores: PositionScores) -> npt.NDArray[np.float64]:
    return scores.nll.mean(-1)


def _window_kld(scores: PositionScores) -> npt.NDArray[np.float64]:
    return scores.kld.mean(-1)


def _window_top1(scores: PositionScores) -> npt.NDArray[np.float64]:
    return scores.top1_match.mean(-1)


QUALITY = [
    MetricInfo(
        "ppl",
        "",
        False,
        False,
        "ppl",
        "perplexity on the eval windows",
        stage="evaluate",
        compute=_ppl,
        column="ppl",
        always_shown=True,
    ),
    MetricInfo(
        "ppl_increase_pct",
        "%",
        False,
        True,
        "pct_delta",
        "perplexity change vs the baseline",
        stage="evaluate",
        compute=_ppl_increase,
        column="Δppl %",
        always_shown=True,
        baseline_value=0.0,
        windows=WindowForm("nll_mean", _window_nll, statistic="ppl_increase"),
        gate=GateBound(
            "--max-ppl-increase", "max perplexity increase relative to the baseline, e.g. 5%", value="percent"
        ),
    ),
    MetricInfo(
        "kld_mean",
        "nats",
        False,
        False,
        "nats",
        "mean KL(baseline || quantized) per token",
        stage="evaluate",
        compute=_kld_mean,
        column="KLD mean",
        always_shown=True,
        baseline_value=0.0,
        windows=WindowForm("kld_mean", _window_kld),
        gate=GateBound(
            "--max-kld", "max mean KLD vs the baseline (nats, absolute)", ge=0, old_field="max_kld"
        ),
    ),
    MetricInfo(
        "kld_median",
        "nats",
        False,
        False,
        "nats",
        "median per-token KLD",
        stage="evaluate",
        compute=_kld_median,
    ),
    MetricInfo(
        "kld_p99",
        "nats",
        False,
        False,
        "nats",
        "99th percentile per-token KLD",
        stage="evaluate",
        compute=_kld_p99,
        column="KLD p99",
        always_shown=True,
        baseline_value=0.0,
        gate=GateBound("--max-kld-p99", "max p99 per-token KLD (nats, absolute)", ge=0),
    ),
    MetricInfo(
        "top1_agreement_pct",
        "%",
        True,
        True,
        "pct",
        "tokens whose argmax matches the baseline's",
        stage="evaluate",
        compute=_top1_agreement,
        column="top-1 %",
        always_shown=True,
        baseline_value=100.0,
        windows=WindowForm("top1_agreement", _window_top1, scale=100.0),
        gate=GateBound(
            "--min-top1",
            "min top-1 agreement with the baseline, e.g. 90%",
            value="percent",
            ge=0,
            le=100,
            old_field="min_top1_pct",
        ),
    ),
    MetricInfo(
        "delta_p_mean",
        "",
        True,
        True,
        "prob_delta",
        "mean change in probability of the correct token",
        stage="evaluate",
        compute=_delta_p,
    ),
    MetricInfo(
        "top1_accuracy_pct",
        "%",
        True,
        False,
        "pct",
        "tokens whose argmax is the actual next token",
        stage="evaluate",
        compute=_top1_accuracy,
    ),
    MetricInfo(
        "unigram_ppl",
        "",
        False,
        False,
        "ppl",
        "perplexity of the scored tokens' own unigram frequencies",
        stage="evaluate",
    ),
    MetricInfo(
        "unigram_top1_pct",
        "%",
        True,
        False,
        "pct",
        "top-1 accuracy of always guessing the commonest token",
        stage="evaluate",
    ),
    MetricInfo("tokens", "", True, False, "count", "tokens scored", stage="evaluate", compute=_tokens),
    MetricInfo(
        "deployed_bpb_gap_pct",
        "%",
        False,
        False,
        "pct_delta",
        "deployed_bpb vs bpb: what the file's own tokenization costs",
        stage="evaluate",
    ),
    MetricInfo(
        "deployed_bpb_noise_pct",
        "%",
        False,
        False,
        "pct",
        "the gap beyond which the file is flagged (2 standard errors of the window gaps, >= 1 %)",
        stage="evaluate",
    ),
]

BENCH = [
    MetricInfo(
        "peak_memory_bytes",
        "B",
        False,
        False,
        "bytes",
        "peak RSS over the pre-load RSS (CPU) or peak allocated (GPU)",
        column="peak mem",
        gate=GateBound(
            "--max-peak-memory",
            "max peak memory (absolute), e.g. 8GB, 7.5GiB or bytes",
            value="bytes",
            ge=0,
            integer=True,
        ),
    ),
    MetricInfo(
        "prefill_tok_s",
        "tok/s",
        True,
        False,
        "tok_s",
        "prefill speed at the longest bench prompt, batch 1",
        column="prefill tok/s",
    ),
    MetricInfo(
        "decode_tok_s",
        "tok/s",
        True,
        False,
        "tok_s",
        "greedy decode speed with the KV cache, batch 1",
        column="decode tok/s",
    ),
    MetricInfo(
        "decode_speed_ratio",
        "x",
        True,
        True,
        "ratio",
        "decode tok/s relative to the baseline (transformers)",
        column="decode × base",
        gate=GateBound(
            "--min-decode-speed-ratio", "min decode tokens/s relative to the baseline, e.g. 1.2", ge=0
        ),
    ),
    MetricInfo(
        "runtime_decode_speed_ratio",
        "x",
        True,
        True,
        "ratio",
        "decode tok/s relative to the unquantized model in the artifact's runtime",
        column="decode × unquantized, same runtime",
    ),
    MetricInfo(
        "cost_per_mtok_usd",
        "USD",
        False,
        False,
        "usd",
        "cost of 1M generated tokens at batch 1 (bench.price_per_hour)",
        column="$/1M tok (batch 1)",
    ),
    MetricInfo(
        "batched_decode_tok_s", "tok/s", True, False, "tok_s", "decode throughput at the bench batch size"
    ),
    MetricInfo("ttft_s", "s", False, False, "seconds", "time to first token at the shortest bench prompt"),
    MetricInfo("weights_memory_bytes", "B", False, False, "bytes", "memory taken by loading the model"),
    MetricInfo("load_s", "s", False, False, "seconds", "model load time"),
    MetricInfo(
        "batched_cost_per_mtok_usd",
        "USD",
        False,
        False,
        "usd",
        "cost of 1M generated tokens at the bench batch size",
    ),
    MetricInfo(
        "prefill_speed_ratio",
        "x",
        True,
        True,
        "ratio",
        "prefill tok/s relative to the baseline (transformers)",
        gate=GateBound("--min-prefill-speed-ratio", "min prefill tokens/s relative to the baseline", ge=0),
    ),
    MetricInfo(
        "memory_ratio",
        "x",
        False,
        True,
        "ratio",
        "peak memory relative to the baseline (same kind of memory only)",
        gate=GateBound("--max-memory-ratio", "max peak memory relative to the baseline, e.g. 0.6", ge=0),
    ),
    MetricInfo("weights_memory_ratio", "x", False, True, "ratio", "weights memory relative to the baseline"),
    MetricInfo(
        "runtime_prefill_speed_ratio",
        "x",
        True,
        True,
        "ratio",
        "prefill tok/s relative to the unquantized model in the artifact's runtime",
    ),
    MetricInfo(
        "runtime_memory_ratio",
        "x",
        False,
        True,
        "ratio",
        "peak memory relative to the unquantized model in the artifact's runtime",
    ),
]

LM_EVAL = [
    MetricInfo(
        "task_recovery_pct",
        "%",
        True,
        True,
        "pct",
        "lm-eval score recovered vs the baseline, averaged over tasks",
        stage="lm_eval",
        column="lm-eval recovery %",
        gate=GateBound(
            "--min-task-recovery", "min task score as % of the baseline's, e.g. 98%", value="percent", ge=0
        ),
    ),
]

# Computed by the evaluate stage beside the others, shown after the optional bench columns.
BITS_PER_BYTE = [
    MetricInfo(
        "bpb",
        "bits",
        False,
        False,
        "bits",
        "bits per byte of the eval text, on the baseline's ids",
        stage="evaluate",
        column="bits/byte",
    ),
    MetricInfo(
        "deployed_bpb",
        "bits",
        False,
        False,
        "bits",
        "bits per byte of the eval text as the artifact's own tokenizer cuts it (GGUF)",
        stage="evaluate",
        column="bits/byte as deployed",
    ),
]

# Measured through an OpenAI-compatible endpoint (quantkit bench --endpoint) at the headline load
# level (the highest concurrency measured, or the request rate); definitions: quantkit.serving.stats.
# Any served threshold also requires that no request failed.
SERVED = [
    MetricInfo(
        "serve_ttft_p50_s",
        "s",
        False,
        False,
        "seconds",
        "served: median time to first token",
        stage="serve_bench",
    ),
    MetricInfo(
        "serve_ttft_p95_s",
        "s",
        False,
        False,
        "seconds",
        "served: p95 time to first token",
        stage="serve_bench",
        column="served TTFT p95 s",
        gate=GateBound(
            "--max-ttft-p95",
            "max p95 time to first token through the endpoint, e.g. 800ms",
            value="seconds",
            gt=0,
            old_field="max_ttft_p95",
        ),
    ),
    MetricInfo(
        "serve_tpot_p95_s",
        "s",
        False,
        False,
        "seconds",
        "served: p95 time per output token",
        stage="serve_bench",
        column="served TPOT p95 s",
        gate=GateBound(
            "--max-tpot-p95",
            "max p95 time per output token through the endpoint, e.g. 50ms",
            value="seconds",
            gt=0,
            old_field="max_tpot_p95",
        ),
    ),
    MetricInfo(
        "serve_itl_p95_s",
        "s",
        False,
        False,
        "seconds",
        "served: p95 inter-token latency",
        stage="serve_bench",
    ),
    MetricInfo(
        "serve_e2e_p95_s",
        "s",
        False,
        False,
        "seconds",
        "served: p95 end-to-end request latency",
        stage="serve_bench",
        column="served E2E p95 s",
        gate=GateBound(
            "--max-e2e-p95",
            "max p95 end-to-end request latency through the endpoint, e.g. 10s",
            value="seconds",
            gt=0,
            old_field="max_e2e_p95",
        ),
    ),
    MetricInfo(
        "serve_output_tok_s",
        "tok/s",
        True,
        False,
        "tok_s",
        "served: output tokens per second",
        stage="serve_bench",
        column="served out tok/s",
        gate=GateBound(
            "--min-output-tok-s",
            "min output tokens/s through the endpoint",
            ge=0,
            old_field="min_output_tok_s",
        ),
    ),
    MetricInfo(
        "serve_goodput",
        "",
        True,
        False,
        "fraction",
        "served: share of requests meeting every SLO",
        stage="serve_bench",
        column="served goodput",
        gate=GateBound(
            "--min-goodput",
            "min share of requests meeting the SLO through the endpoint, e.g. 0.9",
            value="fraction",
            ge=0,
            le=1,
            old_field="min_goodput",
        ),
    ),
    MetricInfo(
        "serve_failed_requests",
        "",
        False,
        False,
        "count",
        "served: failed requests over every load level",
        stage="serve_bench",
        column="served failed",
    ),
    MetricInfo(
        "serve_cost_per_mtok_usd",
        "USD",
        False,
        False,
        "usd",
        "served: cost of 1M output tokens (price per hour)",
        stage="serve_bench",
        column="served $/1M tok",
    ),
    MetricInfo(
        "serve_cost_per_task_usd",
        "USD",
        False,
        False,
        "usd",
        "served: cost of a request / lm-eval task recovery (cost of a successful task)",
        stage="serve_bench",
        column="served $/task",
    ),
    MetricInfo(
        "serve_request_s",
        "req/s",
        True,
        False,
        "tok_s",
        "served: completed requests per second",
        stage="serve_bench",
    ),
    MetricInfo(
        "serve_cost_per_request_usd",
        "USD",
        False,
        False,
        "usd",
        "served: cost of a request (price per hour)",
        stage="serve_bench",
    ),
]

# The model as served, scored through the endpoint's prompt log-probs (quantkit eval --endpoint).
SERVED_QUALITY = [
    MetricInfo(
        "served_kld_mean",
        "nats",
        False,
        False,
        "nats",
        "served: mean KLD (top-k + rest estimate)",
        stage="serve_eval",
        column="served KLD (top-k)",
    ),
    MetricInfo(
        "served_ppl", "", False, False, "ppl", "served: perplexity on the eval windows", stage="serve_eval"
    ),
    MetricInfo(
        "served_ppl_increase_pct",
        "%",
        False,
        True,
        "pct_delta",
        "served: perplexity vs the baseline",
        stage="serve_eval",
    ),
    MetricInfo(
        "served_kld_p99",
        "nats",
        False,
        False,
        "nats",
        "served: p99 per-token KLD (top-k + rest)",
        stage="serve_eval",
    ),
    MetricInfo(
        "served_top1_agreement_pct",
        "%",
        True,
        True,
        "pct",
        "served: tokens whose argmax matches the baseline's",
        stage="serve_eval",
    ),
]

BUILTIN: list[MetricInfo] = [*QUALITY, *BENCH, *LM_EVAL, *BITS_PER_BYTE, *SERVED, *SERVED_QUALITY]
