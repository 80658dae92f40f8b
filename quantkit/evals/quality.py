"""Quality of an artifact against the cached baseline reference, on identical token windows.

Every runtime is scored through the top-k contract (``quantkit.runtimes.base``). KLD is the
top-k + residual-mass estimate: over the baseline's top-k ids and one "rest" bucket,

    KL = sum_i p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest),

with ``q_i`` the artifact's probabilities of the baseline's top-k ids and ``q_rest`` its
mass outside them. It is exact when k covers the vocabulary and a lower bound otherwise
(merging the tail into one bucket can only lose divergence). A runtime with the full
distribution gives ``q_i`` exactly; for a top-k-only runtime, ids missing from its own top-k
share its residual mass, each capped at its k-th probability (``estimated_reference_logprobs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantkit.errors import BackendError
from quantkit.window_scores import BaselineWindows, QuantizedWindows, WindowScores

if TYPE_CHECKING:
    import numpy as np

    from quantkit.evals.reference import Reference
    from quantkit.runtimes.base import Runtime, Scores
    from quantkit.tokens import TokenWindows

_TINY = 1e-30


@dataclass
class PositionScores:
    """Per-position arrays [N, L-1] for one model against the reference."""

    nll: np.ndarray
    kld: np.ndarray
    top1_match: np.ndarray
    delta_p: np.ndarray


def estimated_reference_logprobs(scores: Scores, reference_ids: np.ndarray) -> np.ndarray:
    """log q of the reference's ids from a runtime's own top-k only.

    An id in the runtime's top-k gets its exact log-prob. The ``m`` ids missing from it share
    the runtime's residual mass ``R``: each gets ``min(q_k, R / (m + 1))`` (``q_k``: the
    runtime's k-th probability, an upper bound for any id outside its top-k; the ``+ 1`` leaves
    mass for the rest of the vocabulary).
    """
    import numpy as np

    own_ids = scores.topk_ids.astype(np.int64)
    own_lp = scores.topk_logprobs.astype(np.float64)
    match = reference_ids[..., :, None] == own_ids[..., None, :]  # [B, T, k_ref, k_own]
    found = match.any(-1)
    exact = np.where(match, own_lp[..., None, :], -np.inf).max(-1)
    residual = np.exp(scores.residual_logmass())  # [B, T]
    missing = (~found).sum(-1)
    share = np.minimum(np.exp(own_lp[..., -1]), residual / (missing + 1))
    return np.where(found, exact, np.log(np.clip(share, _TINY, None))[..., None])


def topk_kld(reference: Reference, rows: slice, q_ref: np.ndarray, q_rest: np.ndarray | None) -> np.ndarray:
    """Per-position KLD of the top-k + residual estimator for reference ``rows``; ``q_rest`` is
    the artifact's log mass outside the reference's ids (derived from ``q_ref`` when None)."""
    import numpy as np

    ref_lp = reference.topk_logprobs[rows].astype(np.float64)
    ref_rest = reference.rest_logmass[rows].astype(np.float64)
    q_ref = q_ref.astype(np.float64)
    if q_rest is None:
        q_rest = np.log(np.clip(1.0 - np.exp(q_ref).sum(-1), _TINY, None))
    kl_top = (np.exp(ref_lp) * (ref_lp - q_ref)).sum(-1)
    p_rest = np.exp(ref_rest)
    with np.errstate(invalid="ignore"):  # -inf - -inf where k covers the vocabulary: no rest bucket
        kl_rest = np.where(p_rest > 0, p_rest * (ref_rest - q_rest.astype(np.float64)), 0.0)
    return np.clip(kl_top + kl_rest, 0.0, None)


def score(
    runtime: Runtime,
    windows: TokenWindows,
    reference: Reference,
    batch_size: int,
    on_batch: Callable[[int], None] = lambda n: None,
) -> PositionScores:
    """Score ``windows`` in ``runtime`` against ``reference``, position by position."""
    import numpy as np

    from quantkit.runtimes.base import ScoreRequest

    ids = np.asarray(windows.ids, dtype=np.int64)
    nll, kld, top1, delta = [], [], [], []
    for start in range(0, len(ids), batch_size):
        rows = slice(start, start + batch_size)
        batch = ids[rows]
        ref_ids = reference.topk_ids[rows].astype(np.int64)
        if runtime.scores_any_token:
            scores = runtime.score(ScoreRequest(ids=batch, top_k=1, reference_ids=ref_ids))
            if scores.reference_logprobs is None:
                raise BackendError(f"the {runtime.name} runtime ignored reference_ids", "report this")
            q_ref, q_rest = scores.reference_logprobs, scores.reference_rest_logmass
        else:
            scores = runtime.score(ScoreRequest(ids=batch, top_k=reference.top_k))
            q_ref, q_rest = estimated_reference_logprobs(scores, ref_ids), None
        target = scores.target_logprobs.astype(np.float64)
        nll.append(-target)
        kld.append(topk_kld(reference, rows, q_ref, q_rest))
        top1.append(scores.topk_ids[..., 0] == ref_ids[..., 0])
        delta.append(np.exp(target) - np.exp(reference.target_logprobs[rows].astype(np.float64)))
        on_batch(len(batch))
    return PositionScores(
        nll=np.concatenate(nll),
        kld=np.concatenate(kld),
        top1_match=np.concatenate(top1),
        delta_p=np.concatenate(delta),
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


def per_window(scores: PositionScores, reference: Reference) -> WindowScores:
    """Per-window means of baseline and quantized model (for significance tests)."""
    baseline_nll = (-reference.target_logprobs.astype("float64")).mean(-1)
    return WindowScores(
        positions_per_window=int(scores.nll.shape[-1]),
        baseline=BaselineWindows(nll_mean=[float(v) for v in baseline_nll]),
        quantized=QuantizedWindows(
            nll_mean=[float(v) for v in scores.nll.mean(-1)],
            kld_mean=[float(v) for v in scores.kld.mean(-1)],
            top1_agreement=[float(v) for v in scores.top1_match.mean(-1)],
        ),
    )
