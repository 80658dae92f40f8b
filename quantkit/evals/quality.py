"""Quality of an artifact against the cached baseline reference, on identical token windows.

Every runtime is scored through the top-k contract (``quantkit.runtimes.base``). KL(p || q)
splits into the baseline's top-k ids and its tail (every other id):

    KL = sum_top p_i (log p_i - log q_i) + sum_tail p_v (log p_v - log q_v).

The top-k part is exact. The tail part is estimated from the reference's tail sample: ids
drawn from p restricted to the tail (systematic sampling, ``m`` per position), so

    sum_tail p_v (log p_v - log q_v) = p_rest log(p_rest / q_rest) + p_rest KL(p~ || q~)

with the first term exact and KL(p~ || q~) = E_p~[r - 1 - log r] (r = q~/p~, the tails
renormalized) estimated by its mean over the sample: unbiased, never negative, low-variance
(``sampled_kld``; measured in docs/evaluation.md: within 0.2 % of the full-vocabulary KLD
on SmolLM2 at k = 32, m = 64).
Runtimes that cannot be asked for given ids (endpoints: their own top-k only), and
references without a tail sample, get the top-k + residual-mass estimate (``topk_kld``): the
tail merged into one bucket, a lower bound of the KLD (~78 % of it at k = 32 on SmolLM2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Protocol

from quantkit.errors import BackendError
from quantkit.metrics import METRICS
from quantkit.metrics.positions import PositionScores
from quantkit.results.window_scores import BaselineWindows, QuantizedWindows, WindowScores

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from quantkit.evals.reference import Reference
    from quantkit.inputs.tokens import TokenWindows
    from quantkit.runtimes.base import LogProbs, Runtime, ScoreRequest, Scores, TokenIds

_TINY = 1e-30


def scored_positions(protocol: str, seq_len: int) -> slice:
    """The predicted positions a protocol scores, as a slice of the ``L - 1`` predictions of a
    window (index j predicts token j + 1). ``all``: every one. ``second_half``: j from L/2 to
    L - 2, llama-perplexity's choice (``first = n_ctx/2``), so each scored token has at least
    half a window of context."""
    if protocol == "all":
        return slice(0, None)
    if protocol == "second_half":
        return slice(seq_len // 2, None)
    raise ValueError(f"unknown scoring protocol {protocol!r}")


def estimated_reference_logprobs(scores: Scores, reference_ids: TokenIds) -> npt.NDArray[np.float64]:
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


def topk_kld(
    reference: Reference, rows: slice, q_ref: LogProbs, q_rest: LogProbs | None
) -> npt.NDArray[np.float64]:
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


def sampled_kld(
    reference: Reference, rows: slice, q_top: LogProbs, q_tail: LogProbs, q_rest_asked: LogProbs
) -> npt.NDArray[np.float64]:
    """Per-position KLD: exact over the reference's top-k ids, plus the tail from its sample.

    ``q_top``/``q_tail``: the artifact's log-probs of the top-k and tail-sample ids;
    ``q_rest_asked``: its log mass outside all of them. With p~ and q~ the two distributions
    restricted to the tail and renormalized, r = q~/p~ at a sampled id, the tail's share is

        p_rest log(p_rest / q_rest) + p_rest KL(p~ || q~),   KL(p~ || q~) = E_p~[r - 1 - log r]

    (E_p~[r] = 1), estimated by the mean of r - 1 - log r over the sample: unbiased, never
    negative, and second order in log r, so its noise is small when p~ and q~ are close.
    """
    import numpy as np

    if reference.tail_logprobs is None or reference.tail_ids is None:
        raise BackendError("this reference has no tail sample", "recompute it (tail_samples > 0)")
    ref_lp = reference.topk_logprobs[rows].astype(np.float64)
    kl_top = (np.exp(ref_lp) * (ref_lp - q_top.astype(np.float64))).sum(-1)
    log_p_rest = reference.rest_logmass[rows].astype(np.float64)
    # the artifact's mass outside the top-k: outside everything asked, plus each distinct tail id
    ids = reference.tail_ids[rows]
    order = np.argsort(ids, axis=-1)
    sorted_ids = np.take_along_axis(ids, order, -1)
    sorted_q = np.take_along_axis(q_tail.astype(np.float64), order, -1)
    first = np.ones(sorted_ids.shape, dtype=bool)
    first[..., 1:] = sorted_ids[..., 1:] != sorted_ids[..., :-1]
    q_rest = np.exp(q_rest_asked.astype(np.float64)) + (np.exp(sorted_q) * first).sum(-1)
    log_q_rest = np.log(np.clip(q_rest, _TINY, None))
    log_r = (q_tail.astype(np.float64) - log_q_rest[..., None]) - (
        reference.tail_logprobs[rows].astype(np.float64) - log_p_rest[..., None]
    )
    tail_kl = (np.expm1(log_r) - log_r).mean(-1)
    p_rest = np.exp(log_p_rest)
    with np.errstate(invalid="ignore"):  # no tail (k covers the vocabulary): p_rest is 0
        kl_rest = np.where(p_rest > 0, p_rest * (log_p_rest - log_q_rest + tail_kl), 0.0)
    return np.clip(kl_top + kl_rest, 0.0, None)


class Scorer(Protocol):
    """What scoring needs of a runtime: a name, whether it can be asked about any token id,
    and ``score`` (a loaded Runtime, or an endpoint: ``quantkit.serving.scoring``)."""

    name: ClassVar[str]
    scores_any_token: ClassVar[bool]

    def score(self, request: ScoreRequest) -> Scores: ...


def kld_estimator(runtime: Runtime, reference: Reference) -> str:
    """The name of the KLD estimator ``score`` uses for this runtime and reference."""
    return "sampled-tail" if runtime.scores_any_token and reference.tail_samples else "top-k+rest"


def score(
    runtime: Scorer,
    windows: TokenWindows,
    reference: Reference,
    batch_size: int,
    on_batch: Callable[[int], None] = lambda n: None,
) -> PositionScores:
    """Score ``windows`` in ``runtime`` against ``reference``, position by position."""
    import numpy as np

    from quantkit.runtimes.base import ScoreRequest

    ids = np.asarray(windows.ids, dtype=np.int64)
    nll, kld, top1, delta, correct = [], [], [], [], []
    for start in range(0, len(ids), batch_size):
        rows = slice(start, start + batch_size)
        batch = ids[rows]
        ref_ids = reference.topk_ids[rows].astype(np.int64)
        if runtime.scores_any_token:
            tail = reference.tail_ids
            sampled = tail is not None
            asked = ref_ids if tail is None else np.concatenate([ref_ids, tail[rows].astype(np.int64)], -1)
            scores = runtime.score(ScoreRequest(ids=batch, top_k=1, reference_ids=asked))
            if scores.reference_logprobs is None:
                raise BackendError(f"the {runtime.name} runtime ignored reference_ids", "report this")
            q_ref = scores.reference_logprobs
            if sampled:
                k, rest = reference.top_k, scores.reference_rest_logmass
                if rest is None:
                    raise BackendError(f"the {runtime.name} runtime gave no residual mass", "report this")
                kld.append(sampled_kld(reference, rows, q_ref[..., :k], q_ref[..., k:], rest))
            else:
                kld.append(topk_kld(reference, rows, q_ref, scores.reference_rest_logmass))
        else:
            scores = runtime.score(ScoreRequest(ids=batch, top_k=reference.top_k))
            kld.append(topk_kld(reference, rows, estimated_reference_logprobs(scores, ref_ids), None))
        target = scores.target_logprobs.astype(np.float64)
        nll.append(-target)
        top1.append(scores.topk_ids[..., 0] == ref_ids[..., 0])
        correct.append(scores.topk_ids[..., 0] == batch[:, 1:])
        delta.append(np.exp(target) - np.exp(reference.target_logprobs[rows].astype(np.float64)))
        on_batch(len(batch))
    return PositionScores(
        nll=np.concatenate(nll),
        kld=np.concatenate(kld),
        top1_match=np.concatenate(top1),
        delta_p=np.concatenate(delta),
        correct=np.concatenate(correct),
    )


def baseline_metrics(reference: Reference, targets: npt.NDArray[np.int64]) -> dict[str, float]:
    """The baseline's own perplexity and top-1 accuracy (from its reference), the token count,
    and the context-free bars on the same ``targets`` (the tokens the reference predicts)."""
    from quantkit.evals.plausibility import unigram_figures

    nll = -reference.target_logprobs.astype("float64")
    correct = reference.topk_ids[..., 0] == targets
    return {
        "ppl": math.exp(float(nll.mean())),
        "top1_accuracy_pct": 100.0 * float(correct.mean()),
        "tokens": float(nll.size),
        **unigram_figures(targets),
    }


def targets(windows: TokenWindows, positions: slice) -> npt.NDArray[np.int64]:
    """The actual next tokens at the predicted ``positions`` of every window."""
    import numpy as np

    return np.asarray(windows.ids, dtype=np.int64)[:, 1:][:, positions]


def summarize(scores: PositionScores, baseline_ppl: float) -> dict[str, float]:
    """The run's quality metrics: every registered metric computed from per-position scores."""
    return {info.name: info.compute(scores, baseline_ppl) for info in METRICS.computed() if info.compute}


def per_window(scores: PositionScores, reference: Reference) -> WindowScores:
    """Per-window values of baseline and quantized model (for significance tests): the
    baseline's mean nll and each registered per-window series of the quantized model."""
    baseline_nll = (-reference.target_logprobs.astype("float64")).mean(-1)
    series = {
        info.windows.series: [float(v) for v in info.windows.values(scores)]
        for info in METRICS.windowed()
        if info.windows
    }
    return WindowScores(
        positions_per_window=int(scores.nll.shape[-1]),
        baseline=BaselineWindows(nll_mean=[float(v) for v in baseline_nll]),
        quantized=QuantizedWindows.model_validate(series),
    )
