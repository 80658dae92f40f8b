from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from toy_runtime import TemperedRuntime, TopKOnlyRuntime

from quantkit.calibration import eval_windows
from quantkit.evals import reference as ref
from quantkit.evals.quality import baseline_metrics, score, summarize
from quantkit.runtimes.base import RuntimeSettings
from quantkit.runtimes.hf import HFRuntime
from quantkit.specs import EvalSpec

SETTINGS = RuntimeSettings(device="cpu", context_length=48)


@pytest.fixture(scope="module")
def setup(tiny_model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    windows = eval_windows(EvalSpec(num_windows=3, seq_len=48), tokenizer)
    return HFRuntime.load(tiny_model, SETTINGS), windows


def _tempered(runtime: HFRuntime, scale: float) -> TemperedRuntime:
    """A second model: the same network with its logits tempered (a controlled distortion)."""
    tempered = TemperedRuntime(runtime.model, runtime.path, SETTINGS)
    tempered.scale = scale
    return tempered


def _log_probs(runtime: HFRuntime, ids: np.ndarray, scale: float = 1.0) -> torch.Tensor:
    with torch.inference_mode():
        logits = runtime.model(input_ids=torch.as_tensor(ids)).logits.float()
    return torch.log_softmax(logits * scale, dim=-1)[:, :-1]


def test_baseline_against_itself_has_zero_distance(setup) -> None:
    runtime, windows = setup
    reference = ref.compute(runtime, windows, top_k=8, batch_size=2, key="k")
    metrics = summarize(score(runtime, windows, reference, 2), baseline_metrics(reference)["ppl"])
    assert metrics["kld_mean"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["top1_agreement_pct"] == 100.0
    assert metrics["ppl_increase_pct"] == pytest.approx(0.0, abs=1e-4)
    assert metrics["tokens"] == 3 * 47


def test_perplexity_matches_transformers_loss(setup) -> None:
    runtime, windows = setup
    reference = ref.compute(runtime, windows, top_k=8, batch_size=2, key="k")
    ids = torch.as_tensor(windows.ids)
    with torch.inference_mode():
        losses = [runtime.model(input_ids=row[None], labels=row[None]).loss.item() for row in ids]
    independent = math.exp(sum(losses) / len(losses))  # equal-length windows: mean of means
    assert baseline_metrics(reference)["ppl"] == pytest.approx(independent, rel=1e-5)
    scored = summarize(score(runtime, windows, reference, 3), 1.0)
    assert scored["ppl"] == pytest.approx(independent, rel=1e-5)


def test_compact_kld_is_exact_when_k_covers_the_vocabulary(setup) -> None:
    runtime, windows = setup
    vocab = runtime.vocab_size
    other = _tempered(runtime, 0.7)
    full = ref.compute(runtime, windows, top_k=vocab, batch_size=3, key="full")
    compact = ref.compute(runtime, windows, top_k=16, batch_size=3, key="compact")
    p, q = _log_probs(runtime, windows.ids), _log_probs(runtime, windows.ids, 0.7)
    exact = (p.exp() * (p - q)).sum(-1).mean().item()
    assert score(other, windows, full, 3).kld.mean() == pytest.approx(exact, rel=1e-4)
    approx = score(other, windows, compact, 3).kld.mean()
    assert 0 < approx <= exact * 1.0001  # the top-k + rest estimate is a lower bound


def test_a_distorted_model_scores_worse(setup) -> None:
    runtime, windows = setup
    reference = ref.compute(runtime, windows, top_k=8, batch_size=3, key="k")
    metrics = summarize(score(_tempered(runtime, 4.0), windows, reference, 3), 1.0)
    assert metrics["kld_mean"] > 0.01
    assert metrics["kld_p99"] >= metrics["kld_median"]


def test_a_top_k_only_runtime_scores_like_the_full_distribution(setup) -> None:
    """The same model scored through the endpoint-style contract (own top-k only): identical
    perplexity and top-1; the KLD estimate from the runtime's own top-k stays close to the
    exact top-k + residual estimator."""
    runtime, windows = setup
    reference = ref.compute(runtime, windows, top_k=16, batch_size=3, key="k")
    distorted = _tempered(runtime, 0.8)
    topk_only = TopKOnlyRuntime(runtime.model, runtime.path, SETTINGS)
    topk_only_distorted = _topk_only(_tempered(runtime, 0.8))
    exact, estimated = (
        score(distorted, windows, reference, 3),
        score(topk_only_distorted, windows, reference, 3),
    )
    assert np.array_equal(exact.nll, estimated.nll) and np.array_equal(exact.top1_match, estimated.top1_match)
    assert estimated.kld.mean() == pytest.approx(exact.kld.mean(), rel=0.05)
    assert score(topk_only, windows, reference, 3).kld.mean() == pytest.approx(0.0, abs=1e-5)


def _topk_only(inner: HFRuntime):
    class Wrapped(TopKOnlyRuntime):
        def score(self, request):
            full = inner.score(request)
            return type(full)(full.target_logprobs, full.topk_ids, full.topk_logprobs)

    return Wrapped(inner.model, inner.path, SETTINGS)


def test_reference_cache_roundtrip(setup) -> None:
    runtime, windows = setup
    key = ref.reference_key("fingerprint", windows, 8, "cpu")
    assert ref.load_cached(key) is None
    reference = ref.compute(runtime, windows, top_k=8, batch_size=2, key=key)
    ref.save(reference)
    cached = ref.load_cached(key)
    assert cached is not None
    assert np.array_equal(cached.topk_ids, reference.topk_ids)
    assert np.allclose(cached.rest_logmass, reference.rest_logmass)
    assert ref.reference_key("fingerprint", windows, 16, "cpu") != key
