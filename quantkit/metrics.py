"""The metric registry: name, unit, direction and display format of every metric quantkit reports.

Evaluation, the manifest, the gate and every report format (terminal, Markdown, HTML, JSON)
read metric metadata from here, so a metric is formatted the same way everywhere.
Per-task metrics are named ``base:task`` (``task_recovery_pct:arc_easy``) and share the
metadata of ``base``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Style = Literal[
    "ppl",
    "pct",
    "pct_delta",
    "nats",
    "prob_delta",
    "count",
    "tok_s",
    "seconds",
    "bytes",
    "ratio",
    "usd",
    "fraction",
    "bits",
]


@dataclass(frozen=True)
class MetricInfo:
    """What a metric means and how it is shown."""

    name: str
    unit: str
    higher_is_better: bool
    relative: bool  # measured relative to the baseline (a ratio, a % of it, an agreement with it)
    style: Style
    description: str

    @property
    def stage(self) -> str:
        """The stage that produces it: ``evaluate``, ``lm_eval``, ``bench`` or ``serve_bench``."""
        if self.name in _QUALITY:
            return "evaluate"
        if self.name.startswith("serve_"):
            return "serve_bench"
        if self.name.startswith("served_"):
            return "serve_eval"
        return "lm_eval" if self.name == "task_recovery_pct" else "bench"


_QUALITY = frozenset(
    {
        "ppl",
        "ppl_increase_pct",
        "kld_mean",
        "kld_median",
        "kld_p99",
        "top1_agreement_pct",
        "top1_accuracy_pct",
        "unigram_ppl",
        "unigram_top1_pct",
        "delta_p_mean",
        "tokens",
        "bpb",
        "deployed_bpb",
        "deployed_bpb_gap_pct",
        "deployed_bpb_noise_pct",
    }
)


_ALL = [
    MetricInfo("ppl", "", False, False, "ppl", "perplexity on the eval windows"),
    MetricInfo("ppl_increase_pct", "%", False, True, "pct_delta", "perplexity change vs the baseline"),
    MetricInfo("kld_mean", "nats", False, False, "nats", "mean KL(baseline || quantized) per token"),
    MetricInfo("kld_median", "nats", False, False, "nats", "median per-token KLD"),
    MetricInfo("kld_p99", "nats", False, False, "nats", "99th percentile per-token KLD"),
    MetricInfo("top1_agreement_pct", "%", True, True, "pct", "tokens whose argmax matches the baseline's"),
    MetricInfo(
        "delta_p_mean", "", True, True, "prob_delta", "mean change in probability of the correct token"
    ),
    MetricInfo("top1_accuracy_pct", "%", True, False, "pct", "tokens whose argmax is the actual next token"),
    MetricInfo(
        "unigram_ppl", "", False, False, "ppl", "perplexity of the scored tokens' own unigram frequencies"
    ),
    MetricInfo(
        "unigram_top1_pct", "%", True, False, "pct", "top-1 accuracy of always guessing the commonest token"
    ),
    MetricInfo("tokens", "", True, False, "count", "tokens scored"),
    MetricInfo("bpb", "bits", False, False, "bits", "bits per byte of the eval text, on the baseline's ids"),
    MetricInfo(
        "deployed_bpb",
        "bits",
        False,
        False,
        "bits",
        "bits per byte of the eval text as the artifact's own tokenizer cuts it (GGUF)",
    ),
    MetricInfo(
        "deployed_bpb_gap_pct",
        "%",
        False,
        False,
        "pct_delta",
        "deployed_bpb vs bpb: what the file's own tokenization costs",
    ),
    MetricInfo(
        "deployed_bpb_noise_pct",
        "%",
        False,
        False,
        "pct",
        "the gap beyond which the file is flagged (2 standard errors of the window gaps, >= 1 %)",
    ),
    MetricInfo(
        "prefill_tok_s", "tok/s", True, False, "tok_s", "prefill speed at the longest bench prompt, batch 1"
    ),
    MetricInfo(
        "decode_tok_s", "tok/s", True, False, "tok_s", "greedy decode speed with the KV cache, batch 1"
    ),
    MetricInfo(
        "batched_decode_tok_s", "tok/s", True, False, "tok_s", "decode throughput at the bench batch size"
    ),
    MetricInfo("ttft_s", "s", False, False, "seconds", "time to first token at the shortest bench prompt"),
    MetricInfo(
        "peak_memory_bytes",
        "B",
        False,
        False,
        "bytes",
        "peak RSS over the pre-load RSS (CPU) or peak allocated (GPU)",
    ),
    MetricInfo("weights_memory_bytes", "B", False, False, "bytes", "memory taken by loading the model"),
    MetricInfo("load_s", "s", False, False, "seconds", "model load time"),
    MetricInfo(
        "cost_per_mtok_usd",
        "USD",
        False,
        False,
        "usd",
        "cost of 1M generated tokens at batch 1 (bench.price_per_hour)",
    ),
    MetricInfo(
        "batched_cost_per_mtok_usd",
        "USD",
        False,
        False,
        "usd",
        "cost of 1M generated tokens at the bench batch size",
    ),
    MetricInfo(
        "decode_speed_ratio", "x", True, True, "ratio", "decode tok/s relative to the baseline (transformers)"
    ),
    MetricInfo(
        "prefill_speed_ratio",
        "x",
        True,
        True,
        "ratio",
        "prefill tok/s relative to the baseline (transformers)",
    ),
    MetricInfo(
        "memory_ratio",
        "x",
        False,
        True,
        "ratio",
        "peak memory relative to the baseline (same kind of memory only)",
    ),
    MetricInfo("weights_memory_ratio", "x", False, True, "ratio", "weights memory relative to the baseline"),
    MetricInfo(
        "runtime_decode_speed_ratio",
        "x",
        True,
        True,
        "ratio",
        "decode tok/s relative to the unquantized model in the artifact's runtime",
    ),
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
    MetricInfo(
        "task_recovery_pct",
        "%",
        True,
        True,
        "pct",
        "lm-eval score recovered vs the baseline, averaged over tasks",
    ),
]

# Measured through an OpenAI-compatible endpoint (quantkit bench --endpoint) at the headline load
# level (the highest concurrency measured, or the request rate); definitions: quantkit.serving.stats.
_ALL += [
    MetricInfo("serve_ttft_p50_s", "s", False, False, "seconds", "served: median time to first token"),
    MetricInfo("serve_ttft_p95_s", "s", False, False, "seconds", "served: p95 time to first token"),
    MetricInfo("serve_tpot_p95_s", "s", False, False, "seconds", "served: p95 time per output token"),
    MetricInfo("serve_itl_p95_s", "s", False, False, "seconds", "served: p95 inter-token latency"),
    MetricInfo("serve_e2e_p95_s", "s", False, False, "seconds", "served: p95 end-to-end request latency"),
    MetricInfo("serve_output_tok_s", "tok/s", True, False, "tok_s", "served: output tokens per second"),
    MetricInfo("serve_request_s", "req/s", True, False, "tok_s", "served: completed requests per second"),
    MetricInfo("serve_goodput", "", True, False, "fraction", "served: share of requests meeting every SLO"),
    MetricInfo(
        "serve_failed_requests", "", False, False, "count", "served: failed requests over every load level"
    ),
    MetricInfo(
        "serve_cost_per_request_usd", "USD", False, False, "usd", "served: cost of a request (price per hour)"
    ),
    MetricInfo(
        "serve_cost_per_mtok_usd",
        "USD",
        False,
        False,
        "usd",
        "served: cost of 1M output tokens (price per hour)",
    ),
    MetricInfo(
        "serve_cost_per_task_usd",
        "USD",
        False,
        False,
        "usd",
        "served: cost of a request / lm-eval task recovery (cost of a successful task)",
    ),
]

# The model as served, scored through the endpoint's prompt log-probs (quantkit eval --endpoint)
_ALL += [
    MetricInfo("served_ppl", "", False, False, "ppl", "served: perplexity on the eval windows"),
    MetricInfo(
        "served_ppl_increase_pct", "%", False, True, "pct_delta", "served: perplexity vs the baseline"
    ),
    MetricInfo("served_kld_mean", "nats", False, False, "nats", "served: mean KLD (top-k + rest estimate)"),
    MetricInfo("served_kld_p99", "nats", False, False, "nats", "served: p99 per-token KLD (top-k + rest)"),
    MetricInfo(
        "served_top1_agreement_pct",
        "%",
        True,
        True,
        "pct",
        "served: tokens whose argmax matches the baseline's",
    ),
]

METRICS: dict[str, MetricInfo] = {info.name: info for info in _ALL}


def metric_info(name: str) -> MetricInfo:
    """The metadata of ``name`` (``base:detail`` names share their base's)."""
    base = name.split(":", 1)[0]
    info = METRICS.get(base)
    if info is None:
        raise KeyError(f"unknown metric '{name}'")
    return info


def _bytes(value: float) -> str:
    return f"{value / 1e9:.2f} GB" if abs(value) >= 1e9 else f"{value / 1e6:.1f} MB"


def format_number(style: Style, value: float) -> str:
    """``value`` in ``style``, without a unit suffix for percentages and nats."""
    if style == "ppl":
        return f"{value:.3f}" if abs(value) < 1e4 else f"{value:.4g}"
    if style == "pct_delta":
        return f"{value:+.2f}"
    if style == "pct":
        return f"{value:.2f}"
    if style == "nats":
        return "0" if value == 0 else f"{value:.4g}"
    if style == "bits":
        return f"{value:.4f}"
    if style == "prob_delta":
        return f"{value:+.4f}"
    if style == "count":
        return f"{value:.0f}"
    if style == "tok_s":
        return f"{value:.1f}"
    if style == "seconds":
        return f"{value:.3f}"
    if style == "bytes":
        return _bytes(value)
    if style == "ratio":
        return f"{value:.2f}×"
    if style == "fraction":
        return f"{100 * value:.1f}%"
    return f"${value:.4g}"  # usd


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
