"""Quality delta against the baseline reference: perplexity, KLD, top-1 agreement, Δp."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from quantkit.calibration import TokenWindows
    from quantkit.evals.reference import Reference

# name -> (higher_is_better, unit, description)
METRIC_INFO: dict[str, tuple[bool, str, str]] = {
    "ppl": (False, "", "perplexity on the eval windows"),
    "ppl_increase_pct": (False, "%", "perplexity change vs the baseline"),
    "kld_mean": (False, "nats", "mean KL(baseline || quantized) per token"),
    "kld_median": (False, "nats", "median per-token KLD"),
    "kld_p99": (False, "nats", "99th percentile per-token KLD"),
    "top1_agreement_pct": (True, "%", "tokens whose argmax matches the baseline's"),
    "delta_p_mean": (True, "", "mean change in probability of the correct token"),
    "tokens": (True, "", "tokens scored"),
    "prefill_tok_s": (True, "tok/s", "prefill speed at the longest bench prompt, batch 1"),
    "decode_tok_s": (True, "tok/s", "greedy decode speed with the KV cache, batch 1"),
    "batched_decode_tok_s": (True, "tok/s", "decode throughput at the bench batch size"),
    "ttft_s": (False, "s", "time to first token at the shortest bench prompt"),
    "peak_memory_bytes": (False, "B", "peak RSS over the pre-load RSS (CPU) or peak allocated (GPU)"),
    "weights_memory_bytes": (False, "B", "memory taken by loading the model"),
    "load_s": (False, "s", "model load time"),
    "cost_per_mtok_usd": (False, "USD", "cost of 1M generated tokens at bench.price_per_hour"),
    "decode_speed_ratio": (True, "x", "decode tok/s relative to the baseline"),
    "prefill_speed_ratio": (True, "x", "prefill tok/s relative to the baseline"),
    "memory_ratio": (False, "x", "peak memory relative to the baseline"),
    "weights_memory_ratio": (False, "x", "weights memory relative to the baseline"),
    "task_recovery_pct": (True, "%", "lm-eval score recovered vs the baseline, averaged over tasks"),
}


@dataclass
class PositionScores:
    """Per-position arrays [N, L-1] for one model against the reference."""

    nll: np.ndarray
    kld: np.ndarray
    top1_match: np.ndarray
    delta_p: np.ndarray


def score(
    log_probs: Callable[[Any], Any],
    windows: TokenWindows,
    reference: Reference,
    batch_size: int,
    on_batch: Callable[[int], None] = lambda n: None,
) -> PositionScores:
    """Score ``windows`` with ``log_probs`` against ``reference`` position by position.

    KLD uses the compact reference: the baseline's top-k probabilities plus its residual mass
    against the model's probabilities of the same k tokens plus its own residual mass (the
    llama.cpp ``--kl-divergence`` estimate; exact when k covers the vocabulary).
    """
    import numpy as np
    import torch

    ids = torch.as_tensor(windows.ids, dtype=torch.long)
    nll, kld, top1, delta = [], [], [], []
    for start in range(0, len(ids), batch_size):
        stop = start + batch_size
        batch = ids[start:stop]
        lq = log_probs(batch)[:, :-1].float().cpu()
        ref_lp = torch.from_numpy(reference.topk_logprobs[start:stop]).float()
        ref_ids = torch.from_numpy(reference.topk_ids[start:stop]).long()
        ref_rest = torch.from_numpy(reference.rest_logmass[start:stop]).float()
        ref_target = torch.from_numpy(reference.target_logprobs[start:stop]).float()

        target_lq = lq.gather(-1, batch[:, 1:, None]).squeeze(-1)
        q_top = lq.gather(-1, ref_ids)
        outside = lq.scatter(-1, ref_ids, float("-inf"))
        q_rest = torch.logsumexp(outside, dim=-1)
        kl_top = (ref_lp.exp() * (ref_lp - q_top)).sum(-1)
        p_rest = ref_rest.exp()
        kl_rest = torch.where(p_rest > 0, p_rest * (ref_rest - q_rest), torch.zeros_like(p_rest))
        nll.append((-target_lq).numpy())
        kld.append((kl_top + kl_rest).clamp(min=0.0).numpy())
        top1.append((lq.argmax(-1) == ref_ids[..., 0]).numpy())
        delta.append((target_lq.exp() - ref_target.exp()).numpy())
        on_batch(len(batch))
    return PositionScores(
        nll=np.concatenate(nll).astype(np.float64),
        kld=np.concatenate(kld).astype(np.float64),
        top1_match=np.concatenate(top1),
        delta_p=np.concatenate(delta).astype(np.float64),
    )


def baseline_metrics(reference: Reference) -> dict[str, float]:
    """The baseline's own perplexity (from its reference) and the token count."""
    nll = -reference.target_logprobs.astype("float64")
    return {"ppl": math.exp(float(nll.mean())), "tokens": float(nll.size)}


def summarize(scores: PositionScores, baseline_ppl: float) -> dict[str, float]:
    """Aggregate per-position scores into the run's quality metrics."""
    import numpy as np

    ppl = math.exp(float(scores.nll.mean()))
    return {
        "ppl": ppl,
        "ppl_increase_pct": 100.0 * (ppl / baseline_ppl - 1.0),
        "kld_mean": float(scores.kld.mean()),
        "kld_median": float(np.median(scores.kld)),
        "kld_p99": float(np.percentile(scores.kld, 99)),
        "top1_agreement_pct": 100.0 * float(scores.top1_match.mean()),
        "delta_p_mean": float(scores.delta_p.mean()),
        "tokens": float(scores.nll.size),
    }


def per_window(scores: PositionScores, reference: Reference) -> dict[str, Any]:
    """Per-window means of baseline and quantized model (for significance tests).

    Every window has the same number of predicted positions, so the mean over windows of
    these per-window means is the token mean the metrics use.
    """
    return {
        "schema_version": 1,
        "positions_per_window": int(scores.nll.shape[-1]),
        "baseline": {"nll_mean": [float(v) for v in (-reference.target_logprobs.astype("float64")).mean(-1)]},
        "quantized": {
            "nll_mean": [float(v) for v in scores.nll.mean(-1)],
            "kld_mean": [float(v) for v in scores.kld.mean(-1)],
            "top1_agreement": [float(v) for v in scores.top1_match.mean(-1)],
        },
    }


def with_info(metrics: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Attach ``higher_is_better`` and units to metric values for the manifest."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in metrics.items():
        higher, unit, description = METRIC_INFO[name.split(":")[0]]
        out[name] = {
            "value": value,
            "higher_is_better": higher,
            "unit": unit,
            "description": description,
        }
    return out
